// kernels/cuda/device_reduce.cuh — warp and block reductions shared by the
// kernels (column sums: column_sums.cuh). No CUDA headers: kernel sources
// that include only this (and other such .cuh files) also compile as host
// C++ against tests/cuda_emulated/cuda_emulation.hpp.
#pragma once

#include <cstdint>

namespace corolla::cuda {

/// Sum over the 32 lanes of a warp; every lane gets the result.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Maximum over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
/// thread gets the result. Contains __syncthreads: call from all threads.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += partial[w];  // same order in every thread
  return total;
}

/// Maximum over the block; same rules as block_sum.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = partial[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, partial[w]);
  return m;
}

}  // namespace corolla::cuda
