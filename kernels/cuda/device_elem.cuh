// kernels/cuda/device_elem.cuh — element loads and stores for f32, bf16 and
// f16 storage (the arithmetic is always f32). Only the CUDA headers of the
// two 16-bit types: kernel sources that include just this and the other
// CUDA-free .cuh files also compile as host C++ against
// tests/cuda_emulated/cuda_emulation.hpp (whose include/ stands in for
// these headers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace corolla::cuda {

__device__ __forceinline__ float load_f32(const float* p, std::int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p, std::int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load_f32(const __half* p, std::int64_t i) {
  return __half2float(p[i]);
}

__device__ __forceinline__ void store_f32(float* p, std::int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, std::int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store_f32(__half* p, std::int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

}  // namespace corolla::cuda
