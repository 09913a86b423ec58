// kernels/cuda/linear_bf16_kernels.cuh — the GEMV-style kernel of
// linear_bf16.cu (its file comment says how it works). Included by
// linear_bf16.cu, and by tests/cuda_emulated/, which runs it on the CPU
// against an emulation of the CUDA features it uses.
#pragma once

#include <cstdint>

namespace corolla::cuda {
namespace {

constexpr int rows_per_pass = 8;
constexpr int warps_per_block = 8;

__device__ __forceinline__ float bf16_low(std::uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_high(std::uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

template <bool Vectorised>
__global__ void linear_bf16_kernel(const float* __restrict__ x, std::int64_t rows,
                                   std::int64_t in, const std::uint16_t* __restrict__ w,
                                   std::int64_t out, const float* __restrict__ bias,
                                   float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const std::int64_t o = std::int64_t{blockIdx.x} * warps_per_block + (threadIdx.x >> 5);
  if (o >= out) return;  // a whole warp leaves together
  const std::uint16_t* wo = w + o * in;
  const float b = bias ? bias[o] : 0.0f;
  for (std::int64_t r0 = 0; r0 < rows; r0 += rows_per_pass) {
    const std::int64_t left = rows - r0;
    const int nr = left < rows_per_pass ? static_cast<int>(left) : rows_per_pass;
    const float* xp = x + r0 * in;
    float acc[rows_per_pass];
#pragma unroll
    for (int r = 0; r < rows_per_pass; ++r) acc[r] = 0.0f;
    if constexpr (Vectorised) {
      // Four 16-byte weight loads are issued before any is used, so each
      // lane keeps 64 bytes in flight: one load at a time leaves HBM idle
      // between a warp's dependent iterations. Weights are streamed
      // (__ldcs: read once, evict first); x is re-read by every warp and
      // stays in cache (__ldg).
      constexpr int unroll = 4;
      constexpr std::int64_t stride = 32 * 8;
      auto accumulate = [&](const uint4& packed, std::int64_t k) {
        const float wf[8] = {bf16_low(packed.x), bf16_high(packed.x), bf16_low(packed.y),
                             bf16_high(packed.y), bf16_low(packed.z), bf16_high(packed.z),
                             bf16_low(packed.w), bf16_high(packed.w)};
#pragma unroll
        for (int r = 0; r < rows_per_pass; ++r) {
          if (r < nr) {
            const float4* xr = reinterpret_cast<const float4*>(xp + r * in + k);
            const float4 a = __ldg(xr), c = __ldg(xr + 1);
            acc[r] += a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + c.x * wf[4] +
                      c.y * wf[5] + c.z * wf[6] + c.w * wf[7];
          }
        }
      };
      std::int64_t k = std::int64_t{lane} * 8;
      for (; k + (unroll - 1) * stride < in; k += unroll * stride) {
        uint4 packed[unroll];
#pragma unroll
        for (int u = 0; u < unroll; ++u)
          packed[u] = __ldcs(reinterpret_cast<const uint4*>(wo + k + u * stride));
#pragma unroll
        for (int u = 0; u < unroll; ++u) accumulate(packed[u], k + u * stride);
      }
      for (; k < in; k += stride) accumulate(__ldcs(reinterpret_cast<const uint4*>(wo + k)), k);
    } else {
      for (std::int64_t k = lane; k < in; k += 32) {
        const float wf = __uint_as_float(std::uint32_t{wo[k]} << 16);
#pragma unroll
        for (int r = 0; r < rows_per_pass; ++r)
          if (r < nr) acc[r] += xp[r * in + k] * wf;
      }
    }
#pragma unroll
    for (int r = 0; r < rows_per_pass; ++r) {
      float v = acc[r];
      for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
      if (lane == 0 && r < nr) y[(r0 + r) * out + o] = v + b;
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
