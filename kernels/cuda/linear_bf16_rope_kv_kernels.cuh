// kernels/cuda/linear_bf16_rope_kv_kernels.cuh — a decode step's q/k/v
// GEMV with RoPE and the KV cache append as its epilogue
// (linear_bf16_rope_kv_kernel), summing as the GEMVs of
// linear_bf16_kernels.cuh do. Included by linear_bf16.cu, and by
// tests/cuda_emulated/, which runs it on the CPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/linear_bf16_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"

namespace corolla::cuda {

namespace {

/// Where linear_bf16_rope_kv_kernel puts a decode step's q, k and v: q
/// [hq * head_dim] f32, rotated by positions[0] when `rotate`; the key
/// (rotated likewise) and the value into the cache rows k_out and v_out
/// (hkv * head_dim elements of KT each: f32, or bf16/f16 rounded once).
template <class KT>
struct rope_kv_rows {
  float* q;
  const std::int32_t* positions;
  int hq, hkv, head_dim;
  rope_spec spec;
  bool rotate;
  KT* k_out;
  KT* v_out;
};

/// A decode step's stacked q/k/v product (one row x [in], weight w [hq *
/// head_dim + 2 * hkv * head_dim, in] of q, k and v rows, bias of as many
/// outputs or null) and rope_store_kv in one launch. Warp t takes a pair of
/// outputs (i, i + head_dim / 2) of one head: q pairs first, then k pairs,
/// then v pairs; it sums both rows (lane_products, as the register GEMV
/// does, and its shuffles), adds the bias as the GEMV's store does, and lane 0
/// stores the pair as rope_store_kv_kernel does (rope_store_pair; a value
/// pair is copied into its cache row), so q and the cache rows get the
/// bits of linear_bf16_kernel followed by rope_store_kv_kernel. Launched
/// as a dependent: the weight rows are asked of L2 before await_producers.
template <int Unroll, int Warps, class KT>
__global__ void __launch_bounds__(32 * Warps)
    linear_bf16_rope_kv_kernel(const float* __restrict__ x, std::int64_t in, const std::uint16_t* __restrict__ w,
                               const float* __restrict__ bias, rope_kv_rows<KT> d) {
  allow_dependents();
  const int lane = threadIdx.x & 31;
  const std::int64_t t = std::int64_t{blockIdx.x} * Warps + (threadIdx.x >> 5);
  const int half = d.head_dim / 2;
  const std::int64_t q_pairs = std::int64_t{d.hq} * half, k_pairs = std::int64_t{d.hkv} * half;
  if (t >= q_pairs + 2 * k_pairs) return;  // a whole warp leaves together
  const int region = t < q_pairs ? 0 : t < q_pairs + k_pairs ? 1 : 2;  // q, k, v
  const std::int64_t item = region == 0 ? t : region == 1 ? t - q_pairs : t - q_pairs - k_pairs;
  const std::int64_t head = item / half;
  const int i = static_cast<int>(item % half);
  const std::int64_t q_width = std::int64_t{d.hq} * d.head_dim, kv_width = std::int64_t{d.hkv} * d.head_dim;
  const std::int64_t base = region == 0 ? 0 : region == 1 ? q_width : q_width + kv_width;
  const std::int64_t o1 = base + head * d.head_dim + i, o2 = o1 + half;
  const std::uint16_t* w1 = w + o1 * in;
  const std::uint16_t* w2 = w + o2 * in;
  prefetch_row(w1, in, lane);
  prefetch_row(w2, in, lane);
  await_producers();
  // Both rows' loads in flight together (twice the bytes of one row's
  // pass), summed as the GEMV sums them.
  float acc[1][2][gemv_classes] = {};
  lane_products<2, Unroll, 1>(w1, o2 * in - o1 * in, in, 2, x, 1, lane, acc);
  const float v1 = warp_total(lane_total(acc[0][0])), v2 = warp_total(lane_total(acc[0][1]));
  if (lane != 0) return;
  // The GEMV's store: y = v + b, with b = 0 without a bias.
  const float a = v1 + (bias ? __ldg(bias + o1) : 0.0f);
  const float b = v2 + (bias ? __ldg(bias + o2) : 0.0f);
  if (region == 2) {
    store_f32(d.v_out, head * d.head_dim + i, a);
    store_f32(d.v_out, head * d.head_dim + i + half, b);
    return;
  }
  const auto k_at = [&](std::int64_t) { return d.k_out; };
  rope_store_pair<KT>(region == 0, head, i, a, b, d.q, d.positions, d.hq, d.hkv, d.head_dim, d.spec, d.rotate,
                      k_at);
}

/// linear_bf16_rope_kv_kernel's launch: Warps warps (pairs) per block, 4
/// loads of each row in flight per lane (as the default GEMV variant).
constexpr int rope_kv_unroll = 4, rope_kv_warps = 8;

}  // namespace
}  // namespace corolla::cuda
