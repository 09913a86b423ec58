// kernels/cuda/quant.cu — blockwise absmax int8 (de)quantisation, bit-exact
// with kernels/cpu/cpu_quant.cpp: IEEE division (__fdiv_rn) and roundf
// (half away from zero), as std::round on the host.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/quant_kernels.cuh"
#include "kernels/cuda/quant.hpp"

namespace corolla::cuda {

void quantize_int8(stream_t s, const float* x, std::int64_t n, int block, std::int8_t* q,
                   float* scales) {
  const std::int64_t blocks = (n + block - 1) / block;
  if (blocks <= 0) return;
  quantize_kernel<<<static_cast<unsigned>(blocks), quant_threads, 0, s>>>(x, n, block, q, scales);
  COROLLA_CUDA_LAUNCH_CHECK("quantize_kernel");
}

void dequantize_int8(stream_t s, const std::int8_t* q, const float* scales, std::int64_t n,
                     int block, float* x) {
  if (n <= 0) return;
  dequantize_kernel<<<grid_for(n), elementwise_threads, 0, s>>>(q, scales, n, block, x);
  COROLLA_CUDA_LAUNCH_CHECK("dequantize_kernel");
}

}  // namespace corolla::cuda
