// kernels/cuda/embedding.cu — table gathers and their scatter-add backward.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/embedding.hpp"

namespace corolla::cuda {

void embedding_forward(stream_t s, elem t, const std::int32_t* ids, const void* table, void* out,
                       std::int64_t n, std::int64_t d) {
  if (n <= 0 || d <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("embedding_forward_kernel", &embedding_forward_kernel<T>,
        dim3(grid_for(n * d)), dim3(elementwise_threads), 0, s,
        ids, static_cast<const T*>(table), static_cast<T*>(out), n, d);
  });
}

void embedding_backward(stream_t s, const std::int32_t* ids, const float* dout, float* dtable,
                        std::int64_t n, std::int64_t d) {
  if (n <= 0 || d <= 0) return;
  embedding_backward_kernel<<<grid_for(n * d), elementwise_threads, 0, s>>>(ids, dout, dtable, n,
                                                                            d);
  COROLLA_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
}

}  // namespace corolla::cuda
