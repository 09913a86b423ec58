// kernels/cuda/device_reduce.cuh — warp, block and column reductions shared
// by the kernels. No CUDA headers: kernel sources that include only this (and
// other such .cuh files) also compile as host C++ against
// tests/cuda_emulated/cuda_emulation.hpp.
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

/// Column sums over rows, parallel and deterministic. A block of 32 x 32
/// threads (dim3(32, 32), column_tiles(cols) blocks) covers 32 columns:
/// thread (x, y) adds value(r, c, s) for rows r = y, y + 32, ... of column
/// c = blockIdx.x * 32 + x into its N partial sums s, and thread (x, 0) adds
/// the 32 partials in order into `total`. Returns true in the threads that
/// hold a column's totals. One thread per column walking every row (the
/// obvious kernel) leaves most of the GPU idle: a 4096-row bias gradient
/// took milliseconds. Contains __syncthreads: call from all threads.
constexpr int column_tile = 32;

inline unsigned column_tiles(std::int64_t cols) {
  return static_cast<unsigned>((cols + column_tile - 1) / column_tile);
}

template <int N, class F>
__device__ __forceinline__ bool column_sums(std::int64_t rows, std::int64_t cols, F&& value,
                                            float (&total)[N]) {
  __shared__ float part[N][column_tile][column_tile + 1];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  const std::int64_t c = std::int64_t{blockIdx.x} * column_tile + x;
  float s[N];
#pragma unroll
  for (int n = 0; n < N; ++n) s[n] = 0.0f;
  if (c < cols)
    for (std::int64_t r = y; r < rows; r += column_tile) value(r, c, s);
#pragma unroll
  for (int n = 0; n < N; ++n) part[n][y][x] = s[n];
  __syncthreads();
  if (y != 0 || c >= cols) return false;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    total[n] = 0.0f;
    for (int k = 0; k < column_tile; ++k) total[n] += part[n][k][x];
  }
  return true;
}

}  // namespace corolla::cuda
