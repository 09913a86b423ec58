// kernels/cuda/attention_fa_kernels.cuh — causal grouped-query attention
// for training with every product in registers (mma.sync m16n8k16 and
// ldmatrix, kernels/cuda/mma_sync.cuh), the way FlashAttention-2 runs on
// sm_80 and newer. Launched by attention_mma.cu (the default of its two
// kernel families); included by tests/cuda_emulated/, which runs it on the
// CPU with the instructions' register layouts emulated lane by lane.
//
// The same walk, tiles and roundings as the WMMA kernels of
// attention_mma_kernels.cuh (a block of 4 warps owns a 64-row tile, each
// warp 16 rows; 64-key tiles; 16-bit tiles in shared memory, rows padded by
// 8 elements, which also keeps ldmatrix's eight row addresses on distinct
// banks), so both give the same results to f32 summation order. What
// differs is where the scores live. There, a warp's 16 x 64 score block is
// stored to shared memory as f32, read back by the lanes for the softmax,
// and P written back as 16-bit values for the next product, and the forward
// output goes through shared memory once per key tile to be rescaled
// (WMMA's register layout is unspecified). Here the scores stay in the
// accumulators of eight m16n8 products, whose documented layout puts row g
// and g + 8 (g = lane / 4) in every lane of a quad: row maxima and sums are
// two quad shuffles; P (or dS) rounded to 16-bit pairs is already the A
// operand of the next product; the output rows are rescaled in place.
// Operands come from shared memory through ldmatrix (transposed for the
// products that read a tile along its rows: P.V, dS.K, P^T.dO, dS^T.Q).
// The tiles a block walks over are double-buffered and staged by cp.async
// (16-bit tensors; f32 ones are converted as they are stored): at the top
// of each step a thread waits for its own copies, one barrier makes the
// tile the block's and frees the previous step's buffers, and the next
// tile's copies are issued into them before this one is multiplied.
//
// Per lane: 32 f32 scores (and 32 of dP in the backward), D/2 output (or
// dq) accumulators, D dk and dv accumulators in the dk/dv kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_mma_common.cuh"
#include "kernels/cuda/block_smem.cuh"
#include "kernels/cuda/mma_sync.cuh"

namespace corolla::cuda {
namespace {

/// Shared memory of the register kernels for head size D: 16-bit
/// [64][D + 8] tiles, then two buffers of 2 x 64 f32 row statistics. The
/// tiles a kernel walks over (K and V in the forward and dq, Q and dO in
/// dk/dv) are double-buffered: the next tile's copies fly while this one is
/// multiplied.
template <int D>
struct fa_layout {
  static constexpr int ld = tile_ld<D>;
  static constexpr int tile_bytes = tile * ld * 2;
  static constexpr int stats_bytes = 2 * 2 * tile * 4;
  static_assert(D % 16 == 0, "head sizes are whole 16-column steps");
  static_assert(ld * 2 % 16 == 0, "ldmatrix rows stay 16-byte aligned");
  __host__ __device__ static constexpr std::size_t bytes(int tiles) {
    return static_cast<std::size_t>(tiles) * tile_bytes + stats_bytes;
  }
  /// The forward's block: Q and two K, V pairs.
  static constexpr std::size_t forward_bytes = bytes(5);
  /// dq's (Q, dO and two K, V pairs) and dk/dv's (K, V and two Q, dO pairs).
  static constexpr std::size_t backward_bytes = bytes(6);
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define COROLLA_FA_BODY 1
#endif

#ifdef COROLLA_FA_BODY
/// This lane's A operand for rows [0, 16) x columns [kk, kk + 16) of the
/// 16-row block at `rows` (a tile's rows, stride ld).
template <int D, class M>
__device__ __forceinline__ void fa_load_a(std::uint32_t (&a)[4], const M* rows, int kk) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  ldmatrix_x4(a, rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * tile_ld<D> + kk + (lane >> 4) * 8);
}

/// B operands of two n8 steps, B(k, n) = x[n0 + n][kk + k] (x's rows are
/// the product's columns: K for Q K^T): b[0] for rows [n0, n0 + 8), b[1]
/// for [n0 + 8, n0 + 16).
template <int D, class M>
__device__ __forceinline__ void fa_load_b_rows(std::uint32_t (&b)[2][2], const M* x, int n0, int kk) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  std::uint32_t r[4];
  ldmatrix_x4(r, x + (n0 + (lane & 7) + (lane >> 4) * 8) * tile_ld<D> + kk + ((lane >> 3) & 1) * 8);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

/// B operands of two n8 steps, B(k, n) = x[kk + k][n0 + n] (x's rows are
/// the reduction: V for P V): b[0] for columns [n0, n0 + 8), b[1] for
/// [n0 + 8, n0 + 16).
template <int D, class M>
__device__ __forceinline__ void fa_load_b_cols(std::uint32_t (&b)[2][2], const M* x, int kk, int n0) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  std::uint32_t r[4];
  ldmatrix_x4_trans(r, x + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * tile_ld<D> + n0 + (lane >> 4) * 8);
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

/// acc[8] (a 16 x 64 block) += rows[16][D] . x[64][D]^T: scores, or dP.
template <int D, class M>
__device__ __forceinline__ void fa_scores(float (&acc)[8][4], const M* rows, const M* x) {
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    std::uint32_t a[4];
    fa_load_a<D>(a, rows, kk);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      std::uint32_t b[2][2];
      fa_load_b_rows<D>(b, x, 16 * p, kk);
      mma_16816<M>(acc[2 * p], a, b[0]);
      mma_16816<M>(acc[2 * p + 1], a, b[1]);
    }
  }
}

/// acc[D/8] (a 16 x D block) += P[16][64] . x[64][D], P given as the A
/// operands of its four 16-column steps (pack_a).
template <int D, class M>
__device__ __forceinline__ void fa_accumulate(float (&acc)[D / 8][4], const std::uint32_t (&p)[4][4], const M* x) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      std::uint32_t b[2][2];
      fa_load_b_cols<D>(b, x, 16 * kk, 16 * n);
      mma_16816<M>(acc[2 * n], p[kk], b[0]);
      mma_16816<M>(acc[2 * n + 1], p[kk], b[1]);
    }
}

/// A 16 x 64 block held as eight accumulators, rounded to M pairs as the A
/// operands of its four 16-column steps.
template <class M>
__device__ __forceinline__ void fa_pack_a(std::uint32_t (&a)[4][4], const float (&x)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack_pair<M>(x[2 * kk][0], x[2 * kk][1]);
    a[kk][1] = pack_pair<M>(x[2 * kk][2], x[2 * kk][3]);
    a[kk][2] = pack_pair<M>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[kk][3] = pack_pair<M>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

/// Two consecutive values of a row (bf16 and f16 rounded once, as one pair).
__device__ __forceinline__ void store2(float* p, float a, float b) { p[0] = a, p[1] = b; }
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

/// Writes this lane's part of a 16 x D accumulator block, times `factor`,
/// to rows t0 + g and t0 + g + 8 of head `head` of a [B*T, width] tensor;
/// rows past the sequence are skipped.
template <int D, class T>
__device__ __forceinline__ void fa_write_rows(T* dst, const float (&acc)[D / 8][4], std::int64_t b, std::int64_t seq,
                                              std::int64_t t0, std::int64_t width, std::int64_t head, float factor) {
  const int lane = static_cast<int>(threadIdx.x & 31), g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t t = t0 + g + 8 * half;
    if (t >= seq) continue;
    T* row = dst + (b * seq + t) * width + head * D + 2 * c;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) store2(row + 8 * n, acc[n][2 * half] * factor, acc[n][2 * half + 1] * factor);
  }
}

/// Stages rows [t0, t0 + 64) of head `head` into dst as load_tile does,
/// but a 16-bit tensor's rows go by cp.async: they land at the wait that
/// retires this thread's group (async_commit after the call) and are the
/// block's after a barrier. f32 rows are converted and stored at once; rows
/// past the sequence are zeroed at once.
template <int D, class T>
__device__ __forceinline__ void fa_stage_tile(tile_t<T>* dst, const T* src, std::int64_t b, std::int64_t seq,
                                              std::int64_t t0, std::int64_t width, std::int64_t head) {
  if constexpr (std::is_same_v<T, float>) {
    load_tile<D>(dst, src, b, seq, t0, width, head);
  } else {
    constexpr int ld = tile_ld<D>, octs = D / 8;  // 16 bytes of 16-bit values
    for (int e = threadIdx.x; e < tile * octs; e += threads) {
      const int r = e / octs, c = (e % octs) * 8;
      const std::int64_t t = t0 + r;
      if (t < seq)
        async_copy16(dst + r * ld + c, src + (b * seq + t) * width + head * D + c);
      else
        *reinterpret_cast<uint4*>(dst + r * ld + c) = uint4{0u, 0u, 0u, 0u};
    }
  }
}

/// Stages key tile k0 of key/value head kvh, K into k_dst and V into v_dst
/// (fa_stage_tile), as one cp.async group.
template <int D, class T>
__device__ __forceinline__ void fa_stage_kv(tile_t<T>* k_dst, tile_t<T>* v_dst, const mma_args<T>& a, std::int64_t b,
                                            std::int64_t kvh, std::int64_t k0) {
  fa_stage_tile<D>(k_dst, a.k, b, a.seq, k0, a.g.kv_width, kvh);
  fa_stage_tile<D>(v_dst, a.v, b, a.seq, k0, a.g.kv_width, kvh);
  async_commit();
}
#endif

template <int D, class T>
__global__ void __launch_bounds__(threads) fa_forward_kernel(mma_args<T> a) {
#ifdef COROLLA_FA_BODY
  using L = fa_layout<D>;
  using M = tile_t<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, c = lane & 3;
  // Tiles: Q, then buffer i's K at 1 + 2i and V at 2 + 2i.
  const auto tile_at = [&](int i) { return reinterpret_cast<M*>(smem + i * L::tile_bytes); };
  M* qs = tile_at(0);

  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  // The longest walks (last query tiles) first.
  const std::int64_t q0 = std::int64_t{gridDim.y - 1 - blockIdx.y} * tile, seq = a.seq;
  load_tile<D>(qs, a.q, b, seq, q0, a.g.q_width, h);
  const M* qw = qs + warp * wrows * L::ld;

  const std::int64_t qi[2] = {q0 + warp * wrows + g, q0 + warp * wrows + g + 8};  // this lane's rows
  const float sl2 = a.g.scale * log2e;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sums
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  fa_stage_kv<D>(tile_at(1), tile_at(2), a, b, kvh, 0);
  int buf = 0;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile, buf ^= 1) {
    async_wait<0>();  // this thread's copies of this tile have landed
    // ... everyone's too; and every warp is done with the previous tile,
    // whose buffers the next tile's copies now take (qs is visible too).
    __syncthreads();
    if (k0 + tile <= last) fa_stage_kv<D>(tile_at(3 - 2 * buf), tile_at(4 - 2 * buf), a, b, kvh, k0 + tile);
    const M* ks = tile_at(1 + 2 * buf);
    const M* vs = tile_at(2 + 2 * buf);
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    fa_scores<D>(s, qw, ks);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t kj = k0 + 8 * j + 2 * c + (e & 1);
        s[j][e] = (qi[r] < seq && kj <= qi[r]) ? s[j][e] * sl2 : -INFINITY;
        mx[r] = fmaxf(mx[r], s[j][e]);
      }
    float corr[2], m_new[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(full, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(full, mx[r], 2));
      m_new[r] = fmaxf(m[r], mx[r]);
      // A row past the sequence sees no key and keeps m = -inf.
      corr[r] = m_new[r] == -INFINITY ? 1.0f : exp2f(m[r] - m_new[r]);
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        s[j][e] = s[j][e] == -INFINITY ? 0.0f : exp2f(s[j][e] - m_new[r]);
        sum[r] += s[j][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = l[r] * corr[r] + sum[r];
      m[r] = m_new[r];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr[0], o[n][1] *= corr[0];
      o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
    std::uint32_t p[4][4];
    fa_pack_a<M>(p, s);
    fa_accumulate<D>(o, p, vs);
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(full, l[r], 1);
    l[r] += __shfl_xor_sync(full, l[r], 2);
    inv[r] = qi[r] < seq ? 1.0f / l[r] : 0.0f;
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= inv[0], o[n][1] *= inv[0];
    o[n][2] *= inv[1], o[n][3] *= inv[1];
  }
  fa_write_rows<D>(a.out, o, b, seq, q0 + warp * wrows, a.g.q_width, h, 1.0f);
  if (a.lse_w && c == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (qi[r] < seq) a.lse_w[(b * a.g.hq + h) * seq + qi[r]] = m[r] * ln2 + logf(l[r]);
#endif
}

template <int D, class T>
__global__ void __launch_bounds__(threads) fa_dq_kernel(mma_args<T> a) {
#ifdef COROLLA_FA_BODY
  using L = fa_layout<D>;
  using M = tile_t<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, c = lane & 3;
  // Tiles: Q, dO, then buffer i's K at 2 + 2i and V at 3 + 2i.
  const auto tile_at = [&](int i) { return reinterpret_cast<M*>(smem + i * L::tile_bytes); };
  M* qs = tile_at(0);
  M* gs = tile_at(1);
  auto* lse2 = reinterpret_cast<float*>(smem + 6 * L::tile_bytes);
  float* delta = lse2 + tile;

  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  const std::int64_t q0 = std::int64_t{gridDim.y - 1 - blockIdx.y} * tile, seq = a.seq;
  load_tile<D>(qs, a.q, b, seq, q0, a.g.q_width, h);
  load_tile<D>(gs, a.dout, b, seq, q0, a.g.q_width, h);
  load_stats(lse2, a.lse, b, h, a.g.hq, seq, q0, log2e);
  load_stats(delta, a.delta, b, h, a.g.hq, seq, q0, 1.0f);
  __syncthreads();
  const M* qw = qs + warp * wrows * L::ld;
  const M* gw = gs + warp * wrows * L::ld;
  const int row = warp * wrows + g;
  const std::int64_t qi[2] = {q0 + row, q0 + row + 8};
  const float lse_r[2] = {lse2[row], lse2[row + 8]}, delta_r[2] = {delta[row], delta[row + 8]};
  const float sl2 = a.g.scale * log2e;
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  fa_stage_kv<D>(tile_at(2), tile_at(3), a, b, kvh, 0);
  int buf = 0;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile, buf ^= 1) {
    async_wait<0>();
    __syncthreads();  // this tile is the block's; the previous one's buffers are free
    if (k0 + tile <= last) fa_stage_kv<D>(tile_at(4 - 2 * buf), tile_at(5 - 2 * buf), a, b, kvh, k0 + tile);
    const M* ks = tile_at(2 + 2 * buf);
    const M* vs = tile_at(3 + 2 * buf);
    float s[8][4], dp[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    fa_scores<D>(s, qw, ks);   // S
    fa_scores<D>(dp, gw, vs);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t kj = k0 + 8 * j + 2 * c + (e & 1);
        float ds = 0.0f;
        if (qi[r] < seq && kj <= qi[r]) ds = exp2f(s[j][e] * sl2 - lse_r[r]) * (dp[j][e] - delta_r[r]);
        s[j][e] = ds;
      }
    std::uint32_t ds[4][4];
    fa_pack_a<M>(ds, s);
    fa_accumulate<D>(dq, ds, ks);  // dQ += dS K
  }
  fa_write_rows<D>(a.dq, dq, b, seq, q0 + warp * wrows, a.g.q_width, h, a.g.scale);
#endif
}

template <int D, class T>
__global__ void __launch_bounds__(threads) fa_dkdv_kernel(mma_args<T> a) {
#ifdef COROLLA_FA_BODY
  using L = fa_layout<D>;
  using M = tile_t<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, c = lane & 3;
  // Tiles: K, V, then buffer i's Q at 2 + 2i and dO at 3 + 2i; after
  // them buffer i's row statistics, lse (log2) at 2i and delta at 2i + 1.
  const auto tile_at = [&](int i) { return reinterpret_cast<M*>(smem + i * L::tile_bytes); };
  const auto stats_at = [&](int i) { return reinterpret_cast<float*>(smem + 6 * L::tile_bytes) + i * tile; };
  M* ks = tile_at(0);
  M* vs = tile_at(1);

  const std::int64_t bk = blockIdx.x, b = bk / a.g.hkv, kvh = bk % a.g.hkv;
  const std::int64_t k0 = std::int64_t{blockIdx.y} * tile, seq = a.seq;  // the longest walks (first key tiles) first
  load_tile<D>(ks, a.k, b, seq, k0, a.g.kv_width, kvh);
  load_tile<D>(vs, a.v, b, seq, k0, a.g.kv_width, kvh);
  const M* kw = ks + warp * wrows * L::ld;
  const M* vw = vs + warp * wrows * L::ld;

  const std::int64_t kj[2] = {k0 + warp * wrows + g, k0 + warp * wrows + g + 8};  // this lane's key rows
  const float sl2 = a.g.scale * log2e;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  // The walk: every query head of the group, and in each the query tiles
  // from the key tile's own on (earlier queries see none of its keys),
  // as one sequence of steps whose tiles are staged a step ahead.
  const std::int64_t q_tiles = (seq - k0 + tile - 1) / tile, steps = a.g.group * q_tiles;
  const auto stage_step = [&](std::int64_t step, int buf) {
    const std::int64_t h = kvh * a.g.group + step / q_tiles, q0 = k0 + (step % q_tiles) * tile;
    fa_stage_tile<D>(tile_at(2 + 2 * buf), a.q, b, seq, q0, a.g.q_width, h);
    fa_stage_tile<D>(tile_at(3 + 2 * buf), a.dout, b, seq, q0, a.g.q_width, h);
    load_stats(stats_at(2 * buf), a.lse, b, h, a.g.hq, seq, q0, log2e);
    load_stats(stats_at(2 * buf + 1), a.delta, b, h, a.g.hq, seq, q0, 1.0f);
    async_commit();
  };
  stage_step(0, 0);
  for (std::int64_t step = 0; step < steps; ++step) {
    const int buf = static_cast<int>(step & 1);
    async_wait<0>();
    __syncthreads();  // this step's tiles are the block's; the previous step's buffers are free
    if (step + 1 < steps) stage_step(step + 1, buf ^ 1);
    {
      const std::int64_t q0 = k0 + (step % q_tiles) * tile;
      const M* qs = tile_at(2 + 2 * buf);
      const M* gs = tile_at(3 + 2 * buf);
      const float* lse2 = stats_at(2 * buf);
      const float* delta = stats_at(2 * buf + 1);
      float st[8][4], dpt[8][4];  // S^T and dP^T: this warp's 16 keys x the tile's 64 queries
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0f;
      fa_scores<D>(st, kw, qs);   // S^T = K Q^T
      fa_scores<D>(dpt, vw, gs);  // dP^T = V dO^T
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * j + 2 * c + (e & 1);
          float p = 0.0f, ds = 0.0f;
          if (q0 + col < seq && kj[e >> 1] <= q0 + col) {
            p = exp2f(st[j][e] * sl2 - lse2[col]);
            ds = p * (dpt[j][e] - delta[col]);
          }
          st[j][e] = p;
          dpt[j][e] = ds;
        }
      std::uint32_t pt[4][4], dst[4][4];
      fa_pack_a<M>(pt, st);
      fa_pack_a<M>(dst, dpt);
      fa_accumulate<D>(dv, pt, gs);   // dV += P^T dO
      fa_accumulate<D>(dk, dst, qs);  // dK += dS^T Q
    }
  }
  fa_write_rows<D>(a.dv, dv, b, seq, k0 + warp * wrows, a.g.kv_width, kvh, 1.0f);
  fa_write_rows<D>(a.dk, dk, b, seq, k0 + warp * wrows, a.g.kv_width, kvh, a.g.scale);
#endif
}

}  // namespace
}  // namespace corolla::cuda
