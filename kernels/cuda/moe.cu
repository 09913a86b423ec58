// kernels/cuda/moe.cu — the mixture-of-experts row moves.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_dependent.cuh"
#include "kernels/cuda/moe_kernels.cuh"
#include "kernels/cuda/moe.hpp"

namespace corolla::cuda {

void moe_gather(stream_t s, const float* src, const std::int32_t* rows, const float* weights, float* out,
                std::int64_t m, std::int64_t d) {
  if (m <= 0 || d <= 0) return;
  launch_dependent("moe_gather_kernel", &moe_gather_kernel, dim3(grid_for(m * d)), dim3(elementwise_threads), 0, s,
                   src, rows, weights, out, m, d);
}

void moe_combine(stream_t s, const float* src, const std::int32_t* slots, const float* weights, float* out,
                 std::int64_t n, std::int64_t k, std::int64_t d, bool accumulate) {
  if (n <= 0 || d <= 0) return;
  launch_dependent("moe_combine_kernel", &moe_combine_kernel, dim3(grid_for(n * d)), dim3(elementwise_threads), 0,
                   s, src, slots, weights, out, n, k, d, accumulate);
}

void moe_combine_weight_grad(stream_t s, const float* dy, const float* src, const std::int32_t* slots,
                             float* dweights, std::int64_t n, std::int64_t k, std::int64_t d) {
  if (n <= 0 || k <= 0) return;
  launch_dependent("moe_combine_weight_grad_kernel", &moe_combine_weight_grad_kernel,
                   dim3(static_cast<unsigned>(n * k)), dim3(128), 0, s, dy, src, slots, dweights, k, d);
}

}  // namespace corolla::cuda
