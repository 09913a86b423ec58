// kernels/cuda/linear_bf16_kernels.cuh — the GEMV-style kernels of
// linear_bf16.cu (its file comment says how they work): the register
// kernel (one or several outputs to a warp), the pipelined register kernel
// and the cp.async kernel, and what every GEMV kernel shares (dot8, the
// class order, lane_products, store_output). The split kernel is in
// linear_bf16_regroup_kernels.cuh,
// the launch variants in linear_bf16_variants.cuh, the q/k/v product with
// RoPE and the cache append in linear_bf16_rope_kv_kernels.cuh. Included by
// linear_bf16.cu, and by tests/cuda_emulated/, which runs it on the CPU
// against an emulation of the CUDA features it uses.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/block_smem.cuh"
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

/// The sum of the 8 products of a 16-byte load of bf16 weights with x[0, 8)
/// (in a and c), in one fixed order. Spelled out (no contraction left to the
/// compiler), so every kernel that uses it rounds the same way.
__device__ __forceinline__ float dot8x(const uint4& packed, const float4& a, const float4& c) {
  float t = __fmul_rn(a.x, bf16_low(packed.x));
  t = __fmaf_rn(a.y, bf16_high(packed.x), t);
  t = __fmaf_rn(a.z, bf16_low(packed.y), t);
  t = __fmaf_rn(a.w, bf16_high(packed.y), t);
  t = __fmaf_rn(c.x, bf16_low(packed.z), t);
  t = __fmaf_rn(c.y, bf16_high(packed.z), t);
  t = __fmaf_rn(c.z, bf16_low(packed.w), t);
  return __fmaf_rn(c.w, bf16_high(packed.w), t);
}

/// dot8x with x[0, 8) read from xk (16-byte aligned).
__device__ __forceinline__ float dot8(const uint4& packed, const float* __restrict__ xk) {
  const float4* xr = reinterpret_cast<const float4*>(xk);
  return dot8x(packed, __ldg(xr), __ldg(xr + 1));
}

/// A lane's 16-byte loads of a weight row are numbered i = 0, 1, ... (load
/// i covers k = lane * 8 + i * 256) and summed into gemv_classes
/// accumulators, load i into class i % gemv_classes, each in increasing i;
/// the lane's sum is then lane_total of the classes, and the warp's total
/// warp_total's shuffles of the lanes' sums. Every 16-byte kernel (one
/// warp per output, or linear_bf16_split_kernel's one warp per class of an
/// output) sums in this order, so they give bit-identical results. Two,
/// not more: the eight-row kernel keeps Rows x gemv_classes accumulators.
constexpr int gemv_classes = 2;

/// The lane's sum of its class accumulators.
__device__ __forceinline__ float lane_total(const float (&c)[gemv_classes]) { return __fadd_rn(c[0], c[1]); }

/// Adds this lane's products of Outs weight rows of `in` elements (w0's
/// rows [0, no), row_step elements apart: `in` for consecutive output
/// features) with rows [0, nr) of xp into acc, each row's loads into its
/// own classes in the order above, so an output gets the same bits
/// whatever Outs; each x value is read once for all Outs rows. Unroll 16-byte weight loads of each row are issued before any
/// is used, so each lane keeps Unroll * Outs * 16 bytes in flight: one load
/// at a time leaves HBM idle between a warp's dependent iterations.
/// Weights are streamed (__ldcs: read once, evict first); x is re-read by
/// every warp and stays in cache (__ldg). Each batch starts at a load index
/// that is a multiple of Unroll, so load u of a batch is of class
/// u % gemv_classes. With 8 rows of x, a lane reads 8 x 32 bytes of x per
/// 16 bytes of weight: at an H200's HBM rate that is some 70 TB/s from L1,
/// about twice what L1 serves, so several activation rows are bound by x's
/// reads, not the weights'; Outs rows sharing them divide that by Outs.
template <int Outs, int Unroll, int Rows>
__device__ __forceinline__ void lane_products(const std::uint16_t* __restrict__ w0, std::int64_t row_step,
                                              std::int64_t in, int no,
                                              const float* __restrict__ xp, int nr, int lane,
                                              float (&acc)[Rows][Outs][gemv_classes]) {
  static_assert(Unroll % gemv_classes == 0, "a batch of loads must cover whole classes");
  constexpr std::int64_t stride = 32 * 8;
  // The 16-byte load at k of weight row j.
  auto load = [&](std::int64_t k, int j) { return __ldcs(reinterpret_cast<const uint4*>(w0 + j * row_step + k)); };
  auto accumulate = [&](const uint4 (&packed)[Outs], std::int64_t k, int c) {
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      if (r < nr) {
        if constexpr (Outs == 1) {
          // The same arithmetic; spelled as dot8 because ptxas then keeps
          // r1.u8.w8 at 80 registers without a spill (with the loads of x
          // hoisted as below it spills 8 bytes, 2026-12-03).
          acc[r][0][c] = __fadd_rn(acc[r][0][c], dot8(packed[0], xp + r * in + k));
        } else {
          const float4* xr = reinterpret_cast<const float4*>(xp + r * in + k);
          const float4 a = __ldg(xr), b = __ldg(xr + 1);
#pragma unroll
          for (int j = 0; j < Outs; ++j)
            if (j < no) acc[r][j][c] = __fadd_rn(acc[r][j][c], dot8x(packed[j], a, b));
        }
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
        if (j < no) packed[u][j] = load(k + u * stride, j);
#pragma unroll
    for (int u = 0; u < Unroll; ++u) accumulate(packed[u], k + u * stride, u % gemv_classes);
  }
  if constexpr (Unroll <= 4) {
    // The rest of the row, at most 3 loads of each weight row: one at a
    // time (registers for a second batch would cost the light variants
    // their occupancy).
#pragma unroll
    for (int u = 0; u < Unroll - 1; ++u) {
      if (k + u * stride < in) {
        uint4 packed[Outs];
#pragma unroll
        for (int j = 0; j < Outs; ++j)
          if (j < no) packed[j] = load(k + u * stride, j);
        accumulate(packed, k + u * stride, u % gemv_classes);
      }
    }
  } else if (k < in) {
    // The rest of the row, fewer than Unroll loads: predicated, so they are
    // in flight together (one at a time costs a round trip each).
    uint4 packed[Unroll][Outs];
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
#pragma unroll
      for (int j = 0; j < Outs; ++j)
        if (j < no && k + u * stride < in) packed[u][j] = load(k + u * stride, j);
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
      if (k + u * stride < in) accumulate(packed[u], k + u * stride, u % gemv_classes);
  }
}

/// lane_products' scalar counterpart (any in, any alignment; one output):
/// an order of its own, class 0 only.
template <int Rows>
__device__ __forceinline__ void lane_products_scalar(const std::uint16_t* __restrict__ wo, std::int64_t in,
                                                     const float* __restrict__ xp, int nr, int lane,
                                                     float (&acc)[Rows][1][gemv_classes]) {
  for (std::int64_t k = lane; k < in; k += 32) {
    const float wf = __uint_as_float(std::uint32_t{__ldg(wo + k)} << 16);
#pragma unroll
    for (int r = 0; r < Rows; ++r)
      if (r < nr) acc[r][0][0] = __fmaf_rn(__ldg(xp + r * in + k), wf, acc[r][0][0]);
  }
}

__device__ __forceinline__ float warp_total(float v) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

/// Writes output `at` of epilogue E from the warp's totals v (and v_up, the
/// up row's, for swiglu) and the bias b: each the unfused op's expression.
template <gemv_epilogue E>
__device__ __forceinline__ void store_output(float* y, const float* residual, std::int64_t at, float v, float v_up,
                                             float b) {
  if constexpr (E == gemv_epilogue::bias) y[at] = v + b;
  if constexpr (E == gemv_epilogue::residual) y[at] = residual[at] + (v + b);
  if constexpr (E == gemv_epilogue::gelu) y[at] = gelu_tanh(v + b);
  // (+ b, which is 0 here, as the plain GEMV adds it: -0 becomes +0 alike)
  if constexpr (E == gemv_epilogue::swiglu) y[at] = silu_times(v + b, v_up + b);
}

/// y[rows, out] from x @ w^T, Outs consecutive output features to a warp
/// (1 but in the several-output variants), Warps warps per block, Rows rows
/// of x per pass over the weight rows (1 for batch-1 decode: one set of
/// class accumulators; 8 for up to 8 rows, which batch-1 decode could run
/// too, at the price of registers for all 8), then the epilogue E
/// (gemv_epilogue; swiglu reads weight rows o and out + o of a [2 out, in]
/// w). Vectorised: 16-byte weight loads (in % 8 == 0, x and w 16-byte
/// aligned), Unroll of them per weight row issued per lane before any is
/// used (lane_products); else one output to a warp, a bf16 at a time
/// (lane_products_scalar). Every vectorised (Outs, Unroll, Warps, Rows)
/// computes bit-identical results: an output's products are summed by the
/// same lane into the same classes in the same order (gemv_classes) and
/// reduced by the same shuffles, and each epilogue is the unfused op's
/// expression.
/// Launched as a dependent (grid_dependency.cuh): the warp asks L2 for its
/// weight rows while the kernel before finishes, and waits before reading
/// x, the bias or the residual, or writing y.
template <bool Vectorised, int Outs, int Unroll, int Warps, int Rows, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                       const std::uint16_t* __restrict__ w, std::int64_t out, const float* __restrict__ bias,
                       const float* residual, float* y) {
  static_assert(Vectorised || Outs == 1, "the scalar path has one output to a warp");
  allow_dependents();
  const int lane = threadIdx.x & 31;
  const std::int64_t o0 = (std::int64_t{blockIdx.x} * Warps + (threadIdx.x >> 5)) * Outs;
  if (o0 >= out) return;  // a whole warp leaves together
  const int no = Outs == 1 || out - o0 >= Outs ? Outs : static_cast<int>(out - o0);
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
    // The gate's (or only) rows' lane sums, then the up's: the gate's class
    // accumulators need not stay live through the up rows' pass.
    // (Two blocks, not one helper called twice: ptxas then gives the
    // eight-row SwiGLU kernels a spill.)
    float sum[Rows][Outs], sum_up[Rows][Outs];
    {
      float acc[Rows][Outs][gemv_classes] = {};
      if constexpr (Vectorised)
        lane_products<Outs, Unroll, Rows>(wo, in, in, no, xp, nr, lane, acc);
      else
        lane_products_scalar<Rows>(wo, in, xp, nr, lane, acc);
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int j = 0; j < Outs; ++j) sum[r][j] = lane_total(acc[r][j]);
    }
    if constexpr (E == gemv_epilogue::swiglu) {
      float acc[Rows][Outs][gemv_classes] = {};
      if constexpr (Vectorised)
        lane_products<Outs, Unroll, Rows>(wu, in, in, no, xp, nr, lane, acc);
      else
        lane_products_scalar<Rows>(wu, in, xp, nr, lane, acc);
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int j = 0; j < Outs; ++j) sum_up[r][j] = lane_total(acc[r][j]);
    }
#pragma unroll
    for (int r = 0; r < Rows; ++r)
#pragma unroll
      for (int j = 0; j < Outs; ++j) {
        const float v = warp_total(sum[r][j]);
        const float v_up = E == gemv_epilogue::swiglu ? warp_total(sum_up[r][j]) : 0.0f;
        if (lane == 0 && r < nr && j < no) store_output<E>(y, residual, (r0 + r) * out + o0 + j, v, v_up, b[j]);
      }
  }
}

/// A lane's share of one weight row in flight as a pipeline of Depth
/// 16-byte loads held in registers: each load's slot is refilled with the
/// load Depth further on as soon as it is read, so Depth loads stay in
/// flight until the row runs out (the register kernel issues Unroll, waits
/// for all of them, multiplies, and only then issues more).
template <int Depth>
struct row_pipeline {
  static_assert(Depth % gemv_classes == 0, "slot u must hold loads of one class");
  static constexpr std::int64_t stride = 32 * 8;
  uint4 buf[Depth];
  const std::uint16_t* src = nullptr;  ///< the lane's first load of the row
  int n = 0;                           ///< the lane's loads in the row

  /// Issues the row's first Depth loads (weights only: safe before
  /// await_producers).
  __device__ __forceinline__ void start(const std::uint16_t* row, std::int64_t in, int lane) {
    const std::int64_t first = std::int64_t{lane} * 8;
    n = first < in ? static_cast<int>((in - first + stride - 1) / stride) : 0;
    src = row + first;
#pragma unroll
    for (int u = 0; u < Depth; ++u)
      if (u < n) buf[u] = __ldcs(reinterpret_cast<const uint4*>(src + u * stride));
  }

  /// The lane's sum over the row with x (x + lane * 8 the lane's first), in
  /// lane_products' order: load base + u is of class u % gemv_classes.
  __device__ __forceinline__ float finish(const float* __restrict__ xk) {
    float acc[gemv_classes] = {};
    for (int base = 0; base < n; base += Depth) {
#pragma unroll
      for (int u = 0; u < Depth; ++u) {
        if (base + u < n) {
          const uint4 cur = buf[u];
          if (base + u + Depth < n) buf[u] = __ldcs(reinterpret_cast<const uint4*>(src + (base + u + Depth) * stride));
          acc[u % gemv_classes] = __fadd_rn(acc[u % gemv_classes], dot8(cur, xk + (base + u) * stride));
        }
      }
    }
    return lane_total(acc);
  }
};

/// The same products as linear_bf16_kernel<true, 1, U, Warps, 1, E> (one warp
/// per output feature, the same order, the same shuffles: bit-identical
/// results), each row read through a row_pipeline of Depth loads, whose
/// first loads are issued before await_producers. The up row of swiglu is
/// asked of L2 then and read after the gate row.
template <int Depth, int Warps, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_pipelined_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                                 const std::uint16_t* __restrict__ w, std::int64_t out,
                                 const float* __restrict__ bias, const float* residual, float* y) {
  allow_dependents();
  const int lane = threadIdx.x & 31;
  const std::int64_t o = std::int64_t{blockIdx.x} * Warps + (threadIdx.x >> 5);
  if (o >= out) return;  // a whole warp leaves together
  const std::uint16_t* wo = w + o * in;
  const std::uint16_t* wu = E == gemv_epilogue::swiglu ? w + (out + o) * in : nullptr;
  row_pipeline<Depth> p;
  for (std::int64_t row = 0; row < rows; ++row) {
    p.start(wo, in, lane);
    if (row == 0) {
      if constexpr (E == gemv_epilogue::swiglu) prefetch_row(wu, in, lane);
      await_producers();
    }
    const float* xk = x + row * in + std::int64_t{lane} * 8;
    const float sum = p.finish(xk);
    float sum_up = 0.0f;
    if constexpr (E == gemv_epilogue::swiglu) {
      p.start(wu, in, lane);
      sum_up = p.finish(xk);
    }
    const float v = warp_total(sum);
    const float v_up = E == gemv_epilogue::swiglu ? warp_total(sum_up) : 0.0f;
    if (lane == 0) store_output<E>(y, residual, row * out + o, v, v_up, bias ? __ldg(bias + o) : 0.0f);
  }
}

/// The same products as linear_bf16_kernel<true, 1, U, Warps, 1, E> (one warp
/// per output feature, each lane's 16-byte loads summed into the same
/// classes in the same order, the same shuffles: bit-identical results),
/// but the weights reach the
/// lanes through shared memory by cp.async (async_copy.cuh): each lane has
/// a ring of Stages 16-byte slots of its own and keeps Stages loads in
/// flight all the time, refilling a slot as soon as it has read it. The
/// register kernel holds its loads in registers, which caps its warps per
/// multiprocessor, and has none in flight while it multiplies; with 4096
/// outputs (a 7B model's o and down projections) there are only 31 warps a
/// multiprocessor, and an H200 read the down projection's weights at 53 %
/// of its bandwidth that way (2026-11-30). A lane reads only the slots it
/// filled itself, so no barrier is needed. The first Stages loads are
/// issued before await_producers: the weights are no earlier kernel's
/// output. Dynamic shared memory: Warps * 32 * Stages * 16 bytes. Rows of x
/// are taken one at a time, each over the whole weight row again (batch-1
/// decode has one).
template <int Stages, int Warps, gemv_epilogue E>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_async_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                             const std::uint16_t* __restrict__ w, std::int64_t out, const float* __restrict__ bias,
                             const float* residual, float* y) {
  allow_dependents();
  COROLLA_BLOCK_SMEM(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t o = std::int64_t{blockIdx.x} * Warps + warp;
  if (o >= out) return;  // a whole warp leaves together
  uint4* const ring = reinterpret_cast<uint4*>(smem) + (std::int64_t{warp} * Stages) * 32 + lane;
  const std::uint16_t* wo = w + o * in;
  const std::uint16_t* wu = E == gemv_epilogue::swiglu ? w + (out + o) * in : nullptr;
  constexpr std::int64_t stride = 32 * 8;
  const std::int64_t first = std::int64_t{lane} * 8;
  // The lane's loads: per_row of the gate (or only) row, then as many of
  // the up row for swiglu, in lane_products' order. Running pointers, not
  // indices, keep the registers down (a load's address is one add away).
  const int per_row = first < in ? static_cast<int>((in - first + stride - 1) / stride) : 0;
  const int total = E == gemv_epilogue::swiglu ? 2 * per_row : per_row;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::uint16_t* next = wo + first;  // the next load to issue
    int issued = 0;
    auto issue = [&](uint4* slot) {
      if (issued < total) {
        async_copy16(slot, next);
        next += stride;
        if constexpr (E == gemv_epilogue::swiglu)
          if (++issued == per_row) next = wu + first;
        if constexpr (E != gemv_epilogue::swiglu) ++issued;
      }
      async_commit();  // empty groups too: the wait below counts groups
    };
#pragma unroll
    for (int s = 0; s < Stages; ++s) issue(ring + s * 32);
    if (row == 0) await_producers();
    const float* const xp = x + row * in + first;
    int slot = 0;
    // Adds the next load, landed, to acc, and refills its slot with the
    // load Stages further on.
    auto consume = [&](const float* xk, float& acc) {
      async_wait<Stages - 1>();
      acc = __fadd_rn(acc, dot8(ring[slot * 32], xk));
      issue(ring + slot * 32);
      slot = slot + 1 == Stages ? 0 : slot + 1;
    };
    // The lane's sum over one weight row (the gate's, then the up's for
    // swiglu: both with x from xp), by class as lane_products sums it.
    auto row_sum = [&] {
      float acc[gemv_classes] = {};
      const float* xk = xp;
      int j = 0;
      for (; j + gemv_classes <= per_row; j += gemv_classes) {
#pragma unroll
        for (int c = 0; c < gemv_classes; ++c, xk += stride) consume(xk, acc[c]);
      }
#pragma unroll
      for (int c = 0; c < gemv_classes; ++c, xk += stride)
        if (j + c < per_row) consume(xk, acc[c]);
      return lane_total(acc);
    };
    const float sum = row_sum();
    const float sum_up = E == gemv_epilogue::swiglu ? row_sum() : 0.0f;
    const float v = warp_total(sum);
    const float v_up = E == gemv_epilogue::swiglu ? warp_total(sum_up) : 0.0f;
    if (lane == 0) store_output<E>(y, residual, row * out + o, v, v_up, bias ? __ldg(bias + o) : 0.0f);
  }
}

}  // namespace
}  // namespace corolla::cuda
