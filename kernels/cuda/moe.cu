// kernels/cuda/moe.cu — the mixture-of-experts row moves.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/moe_kernels.cuh"
#include "kernels/cuda/moe.hpp"

namespace corolla::cuda {

void moe_gather(stream_t s, elem t, const void* src, const std::int32_t* rows, const float* weights, void* out,
                std::int64_t m, std::int64_t d) {
  if (m <= 0 || d <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("moe_gather_kernel", &moe_gather_kernel<T>, dim3(grid_for(m * d)), dim3(elementwise_threads), 0,
                     s, static_cast<const T*>(src), rows, weights, static_cast<T*>(out), m, d);
  });
}

void moe_combine(stream_t s, elem t, const void* src, const std::int32_t* slots, const float* weights, void* out,
                 std::int64_t n, std::int64_t k, std::int64_t d, bool accumulate) {
  if (n <= 0 || d <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("moe_combine_kernel", &moe_combine_kernel<T>, dim3(grid_for(n * d)), dim3(elementwise_threads),
                     0, s, static_cast<const T*>(src), slots, weights, static_cast<T*>(out), n, k, d, accumulate);
  });
}

void moe_combine_weight_grad(stream_t s, elem t, const void* dy, const void* src, const std::int32_t* slots,
                             float* dweights, std::int64_t n, std::int64_t k, std::int64_t d) {
  if (n <= 0 || k <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent("moe_combine_weight_grad_kernel", &moe_combine_weight_grad_kernel<T>,
                     dim3(static_cast<unsigned>(n * k)), dim3(128), 0, s, static_cast<const T*>(dy),
                     static_cast<const T*>(src), slots, dweights, k, d);
  });
}

}  // namespace corolla::cuda
