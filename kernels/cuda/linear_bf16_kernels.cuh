// kernels/cuda/linear_bf16_kernels.cuh — the GEMV-style kernel of
// linear_bf16.cu (its file comment says how it works). Included by
// linear_bf16.cu, and by tests/cuda_emulated/, which runs it on the CPU
// against an emulation of the CUDA features it uses.
#pragma once

#include <cstdint>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/grid_dependency.cuh"
#include "kernels/cuda/linear_bf16.hpp"

namespace corolla::cuda {

namespace {

/// Bytes of its weight row a warp asks L2 for before await_producers: the
/// first loads' worth (its first 16-byte load per lane is 512 bytes), so the
/// ramp is hidden without asking for more than L2 holds when every warp of
/// a large product does it (528 blocks x 8 warps x 2 KiB = 8.3 MiB).
constexpr std::int64_t prefetch_row_bytes = 2048;

__device__ __forceinline__ float bf16_low(std::uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_high(std::uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

__device__ __forceinline__ void prefetch_row(const std::uint16_t* wo, std::int64_t in, int lane) {
  const auto* row = reinterpret_cast<const char*>(wo);
  const std::int64_t bytes = in * 2 < prefetch_row_bytes ? in * 2 : prefetch_row_bytes;
  for (std::int64_t b = std::int64_t{lane} * 128; b < bytes; b += 32 * 128) prefetch_l2(row + b);
}

/// Adds this lane's products of weight row `wo` with rows [0, nr) of xp
/// into acc (the lane's share of the dot products; the warp reduces them).
template <bool Vectorised, int Unroll, int Rows>
__device__ __forceinline__ void lane_products(const std::uint16_t* __restrict__ wo, const float* __restrict__ xp,
                                              std::int64_t in, int nr, int lane, float (&acc)[Rows]) {
  if constexpr (Vectorised) {
    // Unroll 16-byte weight loads are issued before any is used, so each
    // lane keeps Unroll * 16 bytes in flight: one load at a time leaves
    // HBM idle between a warp's dependent iterations. Weights are streamed
    // (__ldcs: read once, evict first); x is re-read by every warp and
    // stays in cache (__ldg).
    constexpr std::int64_t stride = 32 * 8;
    auto accumulate = [&](const uint4& packed, std::int64_t k) {
      const float wf[8] = {bf16_low(packed.x), bf16_high(packed.x), bf16_low(packed.y), bf16_high(packed.y),
                           bf16_low(packed.z), bf16_high(packed.z), bf16_low(packed.w), bf16_high(packed.w)};
#pragma unroll
      for (int r = 0; r < Rows; ++r) {
        if (r < nr) {
          const float4* xr = reinterpret_cast<const float4*>(xp + r * in + k);
          const float4 a = __ldg(xr), c = __ldg(xr + 1);
          // Spelled out (no contraction left to the compiler), so every
          // instantiation rounds the same way.
          float t = __fmul_rn(a.x, wf[0]);
          t = __fmaf_rn(a.y, wf[1], t);
          t = __fmaf_rn(a.z, wf[2], t);
          t = __fmaf_rn(a.w, wf[3], t);
          t = __fmaf_rn(c.x, wf[4], t);
          t = __fmaf_rn(c.y, wf[5], t);
          t = __fmaf_rn(c.z, wf[6], t);
          t = __fmaf_rn(c.w, wf[7], t);
          acc[r] = __fadd_rn(acc[r], t);
        }
      }
    };
    std::int64_t k = std::int64_t{lane} * 8;
    for (; k + (Unroll - 1) * stride < in; k += Unroll * stride) {
      uint4 packed[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u) packed[u] = __ldcs(reinterpret_cast<const uint4*>(wo + k + u * stride));
#pragma unroll
      for (int u = 0; u < Unroll; ++u) accumulate(packed[u], k + u * stride);
    }
    if constexpr (Unroll <= 4) {
      for (; k < in; k += stride) accumulate(__ldcs(reinterpret_cast<const uint4*>(wo + k)), k);
    } else if (k < in) {
      // The rest of the row, fewer than Unroll loads: predicated, so they
      // are in flight together (one at a time costs a round trip each).
      uint4 packed[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u)
        if (k + u * stride < in) packed[u] = __ldcs(reinterpret_cast<const uint4*>(wo + k + u * stride));
#pragma unroll
      for (int u = 0; u < Unroll; ++u)
        if (k + u * stride < in) accumulate(packed[u], k + u * stride);
    }
  } else {
    for (std::int64_t k = lane; k < in; k += 32) {
      const float wf = __uint_as_float(std::uint32_t{__ldg(wo + k)} << 16);
#pragma unroll
      for (int r = 0; r < Rows; ++r)
        if (r < nr) acc[r] = __fmaf_rn(__ldg(xp + r * in + k), wf, acc[r]);
    }
  }
}

__device__ __forceinline__ float warp_total(float v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

/// y[rows, out] from x @ w^T, one warp per output feature, Warps warps per
/// block, Rows rows of x per pass over the weight row (1 for batch-1
/// decode: one accumulator; 8 for up to 8 rows, which batch-1 decode could
/// run too, at the price of registers for all 8), then the epilogue E
/// (gemv_epilogue; swiglu reads weight rows o and out + o of a [2 out, in]
/// w). Vectorised: 16-byte weight loads (in % 8 == 0, x and w 16-byte
/// aligned), Unroll of them issued per lane before any is used. Every
/// (Unroll, Warps, Rows) computes bit-identical results: an output's
/// products are summed by the same lane in the same order and reduced by
/// the same shuffles, and each epilogue is the unfused op's expression.
/// Launched as a dependent (grid_dependency.cuh): the warp asks L2 for its
/// weight rows while the kernel before finishes, and waits before reading
/// x, the bias or the residual, or writing y.
template <bool Vectorised, int Unroll, int Warps, int Rows, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                       const std::uint16_t* __restrict__ w, std::int64_t out, const float* __restrict__ bias,
                       const float* residual, float* y) {
  allow_dependents();
  const int lane = threadIdx.x & 31;
  const std::int64_t o = std::int64_t{blockIdx.x} * Warps + (threadIdx.x >> 5);
  if (o >= out) return;  // a whole warp leaves together
  const std::uint16_t* wo = w + o * in;
  const std::uint16_t* wu = E == gemv_epilogue::swiglu ? w + (out + o) * in : nullptr;
  prefetch_row(wo, in, lane);
  if constexpr (E == gemv_epilogue::swiglu) prefetch_row(wu, in, lane);
  await_producers();
  const float b = bias ? __ldg(bias + o) : 0.0f;
  for (std::int64_t r0 = 0; r0 < rows; r0 += Rows) {
    const std::int64_t left = rows - r0;
    const int nr = left < Rows ? static_cast<int>(left) : Rows;
    const float* xp = x + r0 * in;
    float acc[Rows], acc_up[Rows];
#pragma unroll
    for (int r = 0; r < Rows; ++r) acc[r] = acc_up[r] = 0.0f;
    lane_products<Vectorised, Unroll, Rows>(wo, xp, in, nr, lane, acc);
    if constexpr (E == gemv_epilogue::swiglu) lane_products<Vectorised, Unroll, Rows>(wu, xp, in, nr, lane, acc_up);
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const float v = warp_total(acc[r]);
      const float v_up = E == gemv_epilogue::swiglu ? warp_total(acc_up[r]) : 0.0f;
      if (lane == 0 && r < nr) {
        const std::int64_t at = (r0 + r) * out + o;
        if constexpr (E == gemv_epilogue::bias) y[at] = v + b;
        if constexpr (E == gemv_epilogue::residual) y[at] = residual[at] + (v + b);
        if constexpr (E == gemv_epilogue::gelu) y[at] = gelu_tanh(v + b);
        // (+ b, which is 0 here, as the plain GEMV adds it: -0 becomes +0 alike)
        if constexpr (E == gemv_epilogue::swiglu) y[at] = silu_times(v + b, v_up + b);
      }
    }
  }
}

using gemv_kernel = void (*)(const float*, std::int64_t, std::int64_t, const std::uint16_t*, std::int64_t,
                             const float*, const float*, float*);

/// A launch of the 16-byte kernel: `warps` warps per block, one per output
/// feature (grid = ceil(out / warps) blocks).
struct gemv_variant {
  const char* name;
  int warps;
};

/// Named "r<rows per pass>.u<loads in flight per lane>.w<warps per block>".
/// The first is the default and the only one linear_bf16.cu uses for more
/// than one row: the kernel measured on 2026-11-22 (docs/benchmarks.md).
/// The others are batch-1 kernels (one accumulator; more rows would make a
/// pass each): at 4 loads 44 registers against the default's 56, at 8 and
/// 16 loads more (88, 154) for more bytes in flight.
constexpr gemv_variant gemv_variants[] = {{"r8.u4.w8", 8}, {"r1.u4.w8", 8}, {"r1.u4.w4", 4},
                                          {"r1.u8.w8", 8}, {"r1.u8.w4", 4}, {"r1.u16.w4", 4}};
constexpr int gemv_variant_count = static_cast<int>(sizeof gemv_variants / sizeof gemv_variants[0]);

/// The 16-byte kernel of variant i (as gemv_variants) with epilogue E.
template <gemv_epilogue E>
gemv_kernel gemv_kernel_for(int i) {
  switch (i) {
    case 1: return &linear_bf16_kernel<true, 4, 8, 1, E>;
    case 2: return &linear_bf16_kernel<true, 4, 4, 1, E>;
    case 3: return &linear_bf16_kernel<true, 8, 8, 1, E>;
    case 4: return &linear_bf16_kernel<true, 8, 4, 1, E>;
    case 5: return &linear_bf16_kernel<true, 16, 4, 1, E>;
    default: return &linear_bf16_kernel<true, 4, 8, 8, E>;
  }
}

/// The scalar kernel (any in, any alignment): 8 warps, 8 rows per pass.
constexpr int scalar_warps = 8;
template <gemv_epilogue E>
constexpr gemv_kernel gemv_scalar = &linear_bf16_kernel<false, 1, scalar_warps, 8, E>;

}  // namespace
}  // namespace corolla::cuda
