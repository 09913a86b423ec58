// kernels/cuda/quant_kernels.cuh — the blockwise int8 quantisation kernels
// (quant.cu says how they match the CPU bit for bit). Included by quant.cu,
// and by tests/cuda_emulated/, which runs them on the CPU against an emulation
// of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {
namespace {

constexpr int quant_threads = 256;

/// One CUDA block per quantisation block.
__global__ void quantize_kernel(const float* x, std::int64_t n, int block, std::int8_t* q,
                                float* scales) {
  const std::int64_t b = blockIdx.x * std::int64_t{block};
  const std::int64_t e = b + block < n ? b + block : n;
  float amax = 0.0f;
  for (std::int64_t i = b + threadIdx.x; i < e; i += blockDim.x) amax = fmaxf(amax, fabsf(x[i]));
  amax = block_max(amax);
  const float s = __fdiv_rn(amax, 127.0f);
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  for (std::int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    if (s == 0.0f) {
      q[i] = 0;
    } else {
      float r = roundf(__fdiv_rn(x[i], s));
      r = fminf(127.0f, fmaxf(-127.0f, r));
      q[i] = static_cast<std::int8_t>(static_cast<int>(r));
    }
  }
}

__global__ void dequantize_kernel(const std::int8_t* q, const float* scales, std::int64_t n,
                                  int block, float* x) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    x[i] = __fmul_rn(static_cast<float>(q[i]), scales[i / block]);
}

}  // namespace
}  // namespace corolla::cuda
