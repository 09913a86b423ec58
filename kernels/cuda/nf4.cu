// kernels/cuda/nf4.cu — see nf4.hpp and nf4_kernels.cuh.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/nf4.hpp"
#include "kernels/cuda/nf4_kernels.cuh"

namespace corolla::cuda {

void quantize_nf4(stream_t s, const float* w, std::int64_t out, std::int64_t in, std::uint8_t* q, float* absmax) {
  const std::int64_t n = out * ((in + nf4_block - 1) / nf4_block);
  const auto blocks = static_cast<unsigned>((n + nf4_quant_threads - 1) / nf4_quant_threads);
  quantize_nf4_kernel<<<blocks, nf4_quant_threads, 0, s>>>(w, out, in, nf4_tables_of(), q, absmax);
  COROLLA_CUDA_LAUNCH_CHECK("quantize_nf4_kernel");
}

void dequantize_nf4(stream_t s, const std::uint8_t* q, const float* absmax, std::int64_t out, std::int64_t in,
                    float* w) {
  dequantize_nf4_kernel<<<grid_for(out * in), elementwise_threads, 0, s>>>(q, absmax, out, in, nf4_tables_of(), w);
  COROLLA_CUDA_LAUNCH_CHECK("dequantize_nf4_kernel");
}

void linear_nf4(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const std::uint8_t* q,
                const float* absmax, const float* bias, std::int64_t out, float* y) {
  const bool vectorised = in % 8 == 0 && reinterpret_cast<std::uintptr_t>(q) % 4 == 0;
  const auto blocks = static_cast<unsigned>((out + nf4_warps_per_block - 1) / nf4_warps_per_block);
  linear_nf4_kernel<<<blocks, 32 * nf4_warps_per_block, 0, s>>>(x, rows, in, q, absmax, bias, out, nf4_tables_of(),
                                                                 y, vectorised);
  COROLLA_CUDA_LAUNCH_CHECK("linear_nf4_kernel");
}

}  // namespace corolla::cuda
