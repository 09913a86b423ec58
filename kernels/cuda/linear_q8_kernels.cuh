// kernels/cuda/linear_q8_kernels.cuh — the kernel of linear_q8.cu: linear
// with an int8 weight quantised per output channel. One warp per output
// channel reads its int8 row once (16-byte loads: 16 weights per lane per
// load when in % 16 == 0 and the row is 16-byte aligned, else one byte at a
// time) and dots it with up to 8 rows of x per pass, products summed in
// f32 and reduced over the warp, then scaled and biased. Included by
// linear_q8.cu, and by tests/cuda_emulated/, which runs it on the CPU
// against an emulation of the CUDA features it uses.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {

namespace {

/// Rows of x one pass over a weight row serves.
constexpr int q8_rows_per_pass = 8;
/// Warps (output channels) per block.
constexpr int q8_warps_per_block = 8;

__device__ __forceinline__ float q8_byte(std::uint32_t word, int k) {
  return static_cast<float>(static_cast<std::int8_t>((word >> (8 * k)) & 0xffu));
}

__global__ void linear_q8_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                                 const std::int8_t* __restrict__ q, const float* __restrict__ scale,
                                 const float* __restrict__ bias, std::int64_t out, float* __restrict__ y,
                                 bool vectorised) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t o = std::int64_t{blockIdx.x} * q8_warps_per_block + threadIdx.x / 32;
  if (o >= out) return;
  const std::int8_t* row = q + o * in;
  for (std::int64_t r0 = 0; r0 < rows; r0 += q8_rows_per_pass) {
    const int nr = static_cast<int>(rows - r0 < q8_rows_per_pass ? rows - r0 : q8_rows_per_pass);
    float acc[q8_rows_per_pass] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (vectorised) {
      for (std::int64_t k = std::int64_t{lane} * 16; k < in; k += 32 * 16) {
        const uint4 packed = *reinterpret_cast<const uint4*>(row + k);
        const std::uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
        for (int r = 0; r < q8_rows_per_pass; ++r) {
          if (r >= nr) break;
          const float* xr = x + (r0 + r) * in + k;
          float t = 0.0f;
#pragma unroll
          for (int w = 0; w < 4; ++w)
#pragma unroll
            for (int b = 0; b < 4; ++b) t = __fmaf_rn(xr[4 * w + b], q8_byte(words[w], b), t);
          acc[r] = __fadd_rn(acc[r], t);
        }
      }
    } else {
      for (std::int64_t k = lane; k < in; k += 32) {
        const float wk = static_cast<float>(row[k]);
        for (int r = 0; r < nr; ++r) acc[r] = __fmaf_rn(x[(r0 + r) * in + k], wk, acc[r]);
      }
    }
    for (int r = 0; r < nr; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) y[(r0 + r) * out + o] = v * scale[o] + (bias ? bias[o] : 0.0f);
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
