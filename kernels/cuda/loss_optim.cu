// kernels/cuda/loss_optim.cu — softmax cross-entropy (one block per row) and
// the AdamW step (elementwise). Formulas as in kernels/cpu/cpu_loss_optim.cpp.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/loss_optim_kernels.cuh"
#include "kernels/cuda/loss_optim.hpp"

namespace corolla::cuda {

void cross_entropy(stream_t s, elem t, const void* logits, const std::int32_t* targets, float* losses,
                   void* dlogits, float grad_scale, std::int64_t n, std::int64_t vocab) {
  if (n <= 0) return;
  dispatch_elem(t, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<static_cast<unsigned>(n), ce_threads, 0, s>>>(
        static_cast<const T*>(logits), targets, losses, static_cast<T*>(dlogits), grad_scale, vocab);
    COROLLA_CUDA_LAUNCH_CHECK("cross_entropy_kernel");
  });
}

void adamw(stream_t s, float* params, const float* grads, float* m, float* v,
           const adamw_step_scalars& k, std::int64_t n) {
  if (n <= 0) return;
  adamw_kernel<<<grid_for(n), elementwise_threads, 0, s>>>(params, grads, m, v, k, n);
  COROLLA_CUDA_LAUNCH_CHECK("adamw_kernel");
}

void adamw_with_copy(stream_t s, float* params, const float* grads, float* m, float* v, elem copy_type, void* copy,
                     const adamw_step_scalars& k, std::int64_t n) {
  if (n <= 0) return;
  dispatch_elem(copy_type, [&](auto tag) {
    using CT = decltype(tag);
    adamw_copy_kernel<CT><<<grid_for(n), elementwise_threads, 0, s>>>(params, grads, m, v, static_cast<CT*>(copy), k,
                                                                      n);
    COROLLA_CUDA_LAUNCH_CHECK("adamw_copy_kernel");
  });
}

}  // namespace corolla::cuda
