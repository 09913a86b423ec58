// kernels/cuda/nf4_kernels.cuh — the NF4 kernels (kernels/nf4.hpp) of
// nf4.cu: quantisation (bit for bit the CPU's codes: IEEE division and
// product, the same midpoints), dequantisation (the f32 product code *
// absmax), and the GEMV of linear_nf4: one warp per output channel reads
// its packed row once (4 bytes, 8 weights, per lane and load where rows
// are 4-byte aligned), for up to 8 rows of x per pass. Included by nf4.cu,
// and by tests/cuda_emulated/, which runs them on the CPU against an
// emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_reduce.cuh"
#include "kernels/nf4.hpp"

namespace corolla::cuda {
namespace {

constexpr int nf4_rows_per_pass = 8;
constexpr int nf4_warps_per_block = 8;
constexpr int nf4_quant_threads = 128;

// kernels/nf4.hpp's row sizes, for device code (host constexpr functions
// are not callable there).
__device__ __forceinline__ std::int64_t packed_row_bytes(std::int64_t in) { return (in + 1) / 2; }
__device__ __forceinline__ std::int64_t row_blocks(std::int64_t in) { return (in + nf4_block - 1) / nf4_block; }

__device__ __forceinline__ int nf4_code_of(float normalized, const nf4_tables& t) {
  int c = 0;
#pragma unroll
  for (int i = 0; i < 15; ++i) c += normalized > t.midpoint[i] ? 1 : 0;
  return c;
}

/// One thread per block of 64 values of a row: its absmax and packed codes.
__global__ void quantize_nf4_kernel(const float* __restrict__ w, std::int64_t out, std::int64_t in, nf4_tables t,
                                    std::uint8_t* __restrict__ q, float* __restrict__ absmax) {
  const std::int64_t blocks = row_blocks(in);
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= out * blocks) return;
  const std::int64_t o = i / blocks, b0 = (i % blocks) * nf4_block;
  const std::int64_t e = b0 + nf4_block < in ? b0 + nf4_block : in;
  const float* row = w + o * in;
  float amax = 0.0f;
  for (std::int64_t k = b0; k < e; ++k) amax = fmaxf(amax, fabsf(row[k]));
  absmax[i] = amax;
  const float inv = amax == 0.0f ? 0.0f : __fdiv_rn(1.0f, amax);
  std::uint8_t* qr = q + o * packed_row_bytes(in);
  for (std::int64_t k = b0; k < e; k += 2) {  // blocks start at even k: a byte never straddles two
    const int hi = amax == 0.0f ? 7 : nf4_code_of(__fmul_rn(row[k], inv), t);
    const int lo = (k + 1 >= e || amax == 0.0f) ? 7 : nf4_code_of(__fmul_rn(row[k + 1], inv), t);
    qr[k / 2] = static_cast<std::uint8_t>((hi << 4) | lo);
  }
}

/// One thread per value.
__global__ void dequantize_nf4_kernel(const std::uint8_t* __restrict__ q, const float* __restrict__ absmax,
                                      std::int64_t out, std::int64_t in, nf4_tables t, float* __restrict__ w) {
  const std::int64_t n = out * in;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t o = i / in, k = i % in;
    const std::uint8_t b = q[o * packed_row_bytes(in) + k / 2];
    const int c = k % 2 == 0 ? b >> 4 : b & 0x0f;
    w[i] = __fmul_rn(t.code[c], absmax[o * row_blocks(in) + k / nf4_block]);
  }
}

/// y[rows, out] = x @ w'^T (+ bias), w' the dequantised NF4 weight.
__global__ void linear_nf4_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                                  const std::uint8_t* __restrict__ q, const float* __restrict__ absmax,
                                  const float* __restrict__ bias, std::int64_t out, nf4_tables t,
                                  float* __restrict__ y, bool vectorised) {
  __shared__ float codes[16];
  if (threadIdx.x < 16) codes[threadIdx.x] = t.code[threadIdx.x];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t o = std::int64_t{blockIdx.x} * nf4_warps_per_block + threadIdx.x / 32;
  if (o >= out) return;
  const std::int64_t row_bytes = packed_row_bytes(in);
  const std::uint8_t* row = q + o * row_bytes;
  const float* scales = absmax + o * row_blocks(in);
  for (std::int64_t r0 = 0; r0 < rows; r0 += nf4_rows_per_pass) {
    const int nr = static_cast<int>(rows - r0 < nf4_rows_per_pass ? rows - r0 : nf4_rows_per_pass);
    float acc[nf4_rows_per_pass] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (vectorised) {  // in % 8 == 0: whole 4-byte words, each inside one block
      for (std::int64_t j = std::int64_t{lane} * 4; j < row_bytes; j += 32 * 4) {
        const std::uint32_t word = *reinterpret_cast<const std::uint32_t*>(row + j);
        const float a = scales[j / (nf4_block / 2)];
        float wv[8];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const std::uint32_t byte = (word >> (8 * b)) & 0xffu;
          wv[2 * b] = __fmul_rn(codes[byte >> 4], a);
          wv[2 * b + 1] = __fmul_rn(codes[byte & 0x0fu], a);
        }
#pragma unroll
        for (int r = 0; r < nf4_rows_per_pass; ++r) {
          if (r >= nr) break;
          const float* xr = x + (r0 + r) * in + 2 * j;
          float s = 0.0f;
#pragma unroll
          for (int k = 0; k < 8; ++k) s = __fmaf_rn(xr[k], wv[k], s);
          acc[r] = __fadd_rn(acc[r], s);
        }
      }
    } else {
      for (std::int64_t k = lane; k < in; k += 32) {
        const std::uint8_t byte = row[k / 2];
        const float wk = __fmul_rn(codes[k % 2 == 0 ? byte >> 4 : byte & 0x0f], scales[k / nf4_block]);
        for (int r = 0; r < nr; ++r) acc[r] = __fmaf_rn(x[(r0 + r) * in + k], wk, acc[r]);
      }
    }
    for (int r = 0; r < nr; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) y[(r0 + r) * out + o] = v + (bias ? bias[o] : 0.0f);
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
