// kernels/cuda/linear_bf16_regroup_kernels.cuh — the split kernel of the
// decode GEMV: two warps to an output, for products with few outputs. It
// sums as linear_bf16_kernels.cuh's kernels do (gemv_classes), so it gives
// their bits. (Several outputs to a warp are linear_bf16_kernel's Outs.)
// Included by linear_bf16_variants.cuh.
#pragma once

#include <cstdint>

#include "kernels/cuda/linear_bf16_kernels.cuh"

namespace corolla::cuda {

namespace {

/// The same products as linear_bf16_kernel<true, 1, U, Warps, 1, E>, bit for
/// bit, with one warp per class (gemv_classes) of an output feature instead
/// of one warp per output: warp s of an output sums the lanes' loads of
/// class s (loads s, s + gemv_classes, ...), a 1 / gemv_classes share of
/// the row, and writes its lanes' class sums to shared memory; after a
/// barrier the output's first warp adds each lane's classes (lane_total)
/// and reduces them with warp_total's shuffles. For the products with few
/// outputs: a 7B model's o and down projections have 4096, whose one warp
/// each is 0.78 waves of an H200 (31 warps a multiprocessor) with every
/// warp streaming a whole row. Warps / gemv_classes outputs per block; rows
/// of x one at a time, each over the whole weight row again; a warp of no
/// output still reaches the barriers. The first weight bytes are asked of
/// L2 before await_producers, as the register kernel does.
template <int Unroll, int Warps, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_split_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                             const std::uint16_t* __restrict__ w, std::int64_t out, const float* __restrict__ bias,
                             const float* residual, float* y) {
  constexpr int split = gemv_classes;  // warps to an output
  static_assert(Warps % split == 0, "whole outputs per block");
  constexpr int outputs = Warps / split;
  constexpr int rows_w = E == gemv_epilogue::swiglu ? 2 : 1;  // the gate (or only) row, the up row
  __shared__ float part[rows_w][outputs][split][32];
  allow_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int local = warp / split, s = warp % split;
  const std::int64_t o = std::int64_t{blockIdx.x} * outputs + local;
  const bool active = o < out;
  constexpr std::int64_t stride = 32 * 8;
  const std::uint16_t* wo = w + (active ? o : 0) * in;
  const std::uint16_t* wu = E == gemv_epilogue::swiglu ? w + (out + (active ? o : 0)) * in : nullptr;
  if (active && s == 0) {  // the row's first 2 KiB: the first loads of both warps
    prefetch_row(wo, in, lane);
    if constexpr (E == gemv_epilogue::swiglu) prefetch_row(wu, in, lane);
  }
  await_producers();
  // The lane's sum of class s of weight row wr with x row xp.
  constexpr std::int64_t step = split * stride;  // from one load of the class to the next
  const std::int64_t first = s * stride + std::int64_t{lane} * 8;
  auto class_sum = [&](const std::uint16_t* wr, const float* xp) {
    float acc = 0.0f;
    std::int64_t k = first;
    for (; k + (Unroll - 1) * step < in; k += Unroll * step) {
      uint4 packed[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u) packed[u] = __ldcs(reinterpret_cast<const uint4*>(wr + k + u * step));
#pragma unroll
      for (int u = 0; u < Unroll; ++u) acc = __fadd_rn(acc, dot8(packed[u], xp + k + u * step));
    }
    if constexpr (Unroll <= 4) {  // at most 3 loads left: one at a time, as lane_products does
#pragma unroll
      for (int u = 0; u < Unroll - 1; ++u)
        if (k + u * step < in)
          acc = __fadd_rn(acc, dot8(__ldcs(reinterpret_cast<const uint4*>(wr + k + u * step)), xp + k + u * step));
    } else if (k < in) {  // fewer than Unroll loads left: predicated, in flight together
      uint4 packed[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u)
        if (k + u * step < in) packed[u] = __ldcs(reinterpret_cast<const uint4*>(wr + k + u * step));
#pragma unroll
      for (int u = 0; u < Unroll; ++u)
        if (k + u * step < in) acc = __fadd_rn(acc, dot8(packed[u], xp + k + u * step));
    }
    return acc;
  };
  // The output's total of weight row r (0: gate or only, 1: up), by the
  // output's first warp.
  auto total = [&](int r) {
    float c[gemv_classes];
#pragma unroll
    for (int t = 0; t < gemv_classes; ++t) c[t] = part[r][local][t][lane];
    return warp_total(lane_total(c));
  };
  for (std::int64_t row = 0; row < rows; ++row) {
    if (row > 0) __syncthreads();  // the row before's parts are read
    const float* xp = x + row * in;
    if (active) {
      part[0][local][s][lane] = class_sum(wo, xp);
      if constexpr (E == gemv_epilogue::swiglu) part[rows_w - 1][local][s][lane] = class_sum(wu, xp);
    }
    __syncthreads();
    if (active && s == 0) {
      const float v = total(0);
      const float v_up = E == gemv_epilogue::swiglu ? total(rows_w - 1) : 0.0f;
      if (lane == 0) store_output<E>(y, residual, row * out + o, v, v_up, bias ? __ldg(bias + o) : 0.0f);
    }
  }
}

}  // namespace
}  // namespace corolla::cuda
