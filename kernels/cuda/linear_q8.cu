// kernels/cuda/linear_q8.cu — see linear_q8.hpp and linear_q8_kernels.cuh.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/linear_q8.hpp"
#include "kernels/cuda/linear_q8_kernels.cuh"

namespace corolla::cuda {

void linear_q8(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const std::int8_t* q,
               const float* scale, const float* bias, std::int64_t out, float* y) {
  const bool vectorised = in % 16 == 0 && reinterpret_cast<std::uintptr_t>(q) % 16 == 0;
  const auto blocks = static_cast<unsigned>((out + q8_warps_per_block - 1) / q8_warps_per_block);
  linear_q8_kernel<<<blocks, 32 * q8_warps_per_block, 0, s>>>(x, rows, in, q, scale, bias, out, y, vectorised);
  COROLLA_CUDA_LAUNCH_CHECK("linear_q8_kernel");
}

}  // namespace corolla::cuda
