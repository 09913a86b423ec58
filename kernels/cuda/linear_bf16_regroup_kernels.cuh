// kernels/cuda/linear_bf16_regroup_kernels.cuh — the decode GEMV kernels
// that map warps to outputs other than one to one: the split kernel (two
// warps to an output, for products with few outputs) and the kernel of
// several outputs to a warp (x read once for them, for several rows of x).
// Both sum as linear_bf16_kernels.cuh's kernels do (gemv_classes), so they
// give their bits. Included by linear_bf16_variants.cuh.
#pragma once

#include <cstdint>

#include "kernels/cuda/linear_bf16_kernels.cuh"

namespace corolla::cuda {

namespace {

/// The same products as linear_bf16_kernel<true, U, Warps, 1, E>, bit for
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
    if constexpr (Unroll <= 4) {  // at most 3 loads left: one at a time, as lane_products
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

/// lane_products for Outs weight rows at once (w0's rows [0, no), in apart:
/// consecutive output features): each row's loads summed into its own
/// classes in lane_products' order, so each output gets the bits it gets
/// alone, but each x value is read once for all Outs rows. With 8 rows of
/// x, a lane reads 8 x 32 bytes of x per 16 bytes of weight: at an H200's
/// HBM rate that is some 70 TB/s from L1, about twice what L1 serves, so
/// several activation rows are bound by x's reads, not the weights';
/// Outs rows sharing them divide that by Outs.
template <int Outs, int Unroll, int Rows>
__device__ __forceinline__ void outs_products(const std::uint16_t* __restrict__ w0, std::int64_t in, int no,
                                              const float* __restrict__ xp, int nr, int lane,
                                              float (&acc)[Rows][Outs][gemv_classes]) {
  static_assert(Unroll % gemv_classes == 0, "a batch of loads must cover whole classes");
  constexpr std::int64_t stride = 32 * 8;
  auto accumulate = [&](const uint4 (&packed)[Outs], std::int64_t k, int c) {
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      if (r < nr) {
        const float4* xr = reinterpret_cast<const float4*>(xp + r * in + k);
        const float4 a = __ldg(xr), b = __ldg(xr + 1);
#pragma unroll
        for (int j = 0; j < Outs; ++j)
          if (j < no) acc[r][j][c] = __fadd_rn(acc[r][j][c], dot8x(packed[j], a, b));
      }
    }
  };
  std::int64_t k = std::int64_t{lane} * 8;
  for (; k + (Unroll - 1) * stride < in; k += Unroll * stride) {
    uint4 packed[Unroll][Outs];
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
#pragma unroll
      for (int j = 0; j < Outs; ++j)
        if (j < no) packed[u][j] = __ldcs(reinterpret_cast<const uint4*>(w0 + j * in + k + u * stride));
#pragma unroll
    for (int u = 0; u < Unroll; ++u) accumulate(packed[u], k + u * stride, u % gemv_classes);
  }
#pragma unroll
  for (int u = 0; u < Unroll - 1; ++u) {  // the rest, fewer than Unroll loads of each row: one at a time
    if (k + u * stride < in) {
      uint4 packed[Outs];
#pragma unroll
      for (int j = 0; j < Outs; ++j)
        if (j < no) packed[j] = __ldcs(reinterpret_cast<const uint4*>(w0 + j * in + k + u * stride));
      accumulate(packed, k + u * stride, u % gemv_classes);
    }
  }
}

/// linear_bf16_kernel<true, Unroll, Warps, Rows, E> with Outs consecutive
/// output features to a warp (outs_products): the same bits, x read once
/// for them all. Warps * Outs outputs per block.
template <int Outs, int Unroll, int Warps, int Rows, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_outs_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                            const std::uint16_t* __restrict__ w, std::int64_t out, const float* __restrict__ bias,
                            const float* residual, float* y) {
  allow_dependents();
  const int lane = threadIdx.x & 31;
  const std::int64_t o0 = (std::int64_t{blockIdx.x} * Warps + (threadIdx.x >> 5)) * Outs;
  if (o0 >= out) return;  // a whole warp leaves together
  const int no = out - o0 < Outs ? static_cast<int>(out - o0) : Outs;
  const std::uint16_t* wo = w + o0 * in;
  const std::uint16_t* wu = E == gemv_epilogue::swiglu ? w + (out + o0) * in : nullptr;
  for (int j = 0; j < no; ++j) {
    prefetch_row(wo + j * in, in, lane);
    if constexpr (E == gemv_epilogue::swiglu) prefetch_row(wu + j * in, in, lane);
  }
  await_producers();
  float b[Outs];
#pragma unroll
  for (int j = 0; j < Outs; ++j) b[j] = bias && j < no ? __ldg(bias + o0 + j) : 0.0f;
  for (std::int64_t r0 = 0; r0 < rows; r0 += Rows) {
    const std::int64_t left = rows - r0;
    const int nr = left < Rows ? static_cast<int>(left) : Rows;
    const float* xp = x + r0 * in;
    // The lane's sums of weight rows wr.. with the pass's rows of x (the
    // gate's, or only, then the up's: the gate's class accumulators need
    // not stay live through the up rows' pass).
    auto lane_sums = [&](const std::uint16_t* wr, float (&sums)[Rows][Outs]) {
      float acc[Rows][Outs][gemv_classes] = {};
      outs_products<Outs, Unroll, Rows>(wr, in, no, xp, nr, lane, acc);
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int j = 0; j < Outs; ++j) sums[r][j] = lane_total(acc[r][j]);
    };
    float sum[Rows][Outs], sum_up[Rows][Outs];
    lane_sums(wo, sum);
    if constexpr (E == gemv_epilogue::swiglu) lane_sums(wu, sum_up);
#pragma unroll
    for (int r = 0; r < Rows; ++r)
#pragma unroll
      for (int j = 0; j < Outs; ++j) {
        const float v = warp_total(sum[r][j]);
        const float v_up = E == gemv_epilogue::swiglu ? warp_total(sum_up[r][j]) : 0.0f;
        if (lane == 0 && r < nr && j < no)
          store_output<E>(y, residual, (r0 + r) * out + o0 + j, v, v_up, b[j]);
      }
  }
}

}  // namespace
}  // namespace corolla::cuda
