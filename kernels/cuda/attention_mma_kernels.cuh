// kernels/cuda/attention_mma_kernels.cuh — the kernels of attention_mma.cu
// (its file comment says how they work). Included by attention_mma.cu, and
// by tests/cuda_emulated/, which compiles them as host C++ against an
// emulation of WMMA, warp shuffles and barriers so they are checked on
// machines without a GPU.
#pragma once

#include <mma.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_mma_common.cuh"
#include "kernels/cuda/block_smem.cuh"

namespace corolla::cuda {
namespace {

constexpr int frag = 16;                   ///< WMMA m = n = k
constexpr int lds = tile + 4;              ///< f32 score row stride (multiple of 4)
constexpr int ldp = tile + 8;              ///< 16-bit P / dS row stride (multiple of 8)

/// Shared-memory layout for head size D: `tiles` 16-bit [64][D + 8] tiles,
/// 2 x 64 f32 row statistics, then per warp an f32 scratch of two score
/// blocks [16][lds] that also holds a [16][D + 4] product or two 16-bit
/// [16][ldp] blocks. Every part starts at a multiple of 128 bytes (WMMA
/// needs 32).
template <int D>
struct layout {
  static constexpr int ld = tile_ld<D>;  ///< 16-bit tile row stride
  static constexpr int ldo = D + 4; ///< f32 product row stride (multiple of 4)
  static constexpr int tile_bytes = tile * ld * 2;
  static constexpr int stats_bytes = 2 * tile * 4;
  static constexpr int scratch_floats = (2 * wrows * lds > wrows * ldo) ? 2 * wrows * lds : wrows * ldo;
  static constexpr int scratch_bytes = (scratch_floats * 4 + 127) / 128 * 128;
  static_assert(tile_bytes % 128 == 0 && stats_bytes % 128 == 0, "shared-memory parts must stay 128-byte aligned");
  static_assert(2 * wrows * ldp * 2 <= scratch_floats * 4, "two 16-bit blocks fit the warp scratch");
  __host__ __device__ static constexpr std::size_t bytes(int tiles) {
    return static_cast<std::size_t>(tiles) * tile_bytes + stats_bytes + static_cast<std::size_t>(warps) * scratch_bytes;
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define COROLLA_MMA_BODY 1
using namespace nvcuda;
template <class M>
using frag_a = wmma::fragment<wmma::matrix_a, frag, frag, frag, M, wmma::row_major>;
template <class M>
using frag_bt = wmma::fragment<wmma::matrix_b, frag, frag, frag, M, wmma::col_major>;  ///< B = a tile's rows, transposed
template <class M>
using frag_b = wmma::fragment<wmma::matrix_b, frag, frag, frag, M, wmma::row_major>;
using frag_c = wmma::fragment<wmma::accumulator, frag, frag, frag, float>;
#endif

#ifdef COROLLA_MMA_BODY
/// out[16][64] (f32, stride lds) = a[16 rows][D] . b[64 rows][D]^T, both
/// 16-bit (M) with stride ld: one warp.
template <int D, class M>
__device__ __forceinline__ void product_nt(const M* a, const M* b, float* out) {
  constexpr int ld = layout<D>::ld;
  frag_c acc[tile / frag];
#pragma unroll
  for (int n = 0; n < tile / frag; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int kk = 0; kk < D; kk += frag) {
    frag_a<M> fa;
    wmma::load_matrix_sync(fa, a + kk, ld);
#pragma unroll
    for (int n = 0; n < tile / frag; ++n) {
      frag_bt<M> fb;
      wmma::load_matrix_sync(fb, b + n * frag * ld + kk, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < tile / frag; ++n) wmma::store_matrix_sync(out + n * frag, acc[n], lds, wmma::mem_row_major);
}

/// acc[D/16] += p[16][64] (M, stride ldp) . b[64 rows][D] (M, stride ld): one warp.
template <int D, class M>
__device__ __forceinline__ void product_nn(const M* p, const M* b, frag_c (&acc)[D / frag]) {
  constexpr int ld = layout<D>::ld;
#pragma unroll
  for (int kk = 0; kk < tile; kk += frag) {
    frag_a<M> fa;
    wmma::load_matrix_sync(fa, p + kk, ldp);
#pragma unroll
    for (int n = 0; n < D / frag; ++n) {
      frag_b<M> fb;
      wmma::load_matrix_sync(fb, b + kk * ld + n * frag, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

/// Stores acc (16 rows x D) to the warp's scratch as f32 [16][D + 4].
template <int D>
__device__ __forceinline__ void store_rows(float* scratch, const frag_c (&acc)[D / frag]) {
#pragma unroll
  for (int n = 0; n < D / frag; ++n)
    wmma::store_matrix_sync(scratch + n * frag, acc[n], layout<D>::ldo, wmma::mem_row_major);
}

/// Writes the warp's 16 rows from scratch ([16][D + 4] f32, times `factor`)
/// to rows [t0, t0 + 16) of head `head` of a [B*T, width] tensor; rows past
/// the sequence are skipped.
template <int D, class T>
__device__ __forceinline__ void write_rows(T* dst, const float* scratch, std::int64_t b, std::int64_t seq,
                                           std::int64_t t0, std::int64_t width, std::int64_t head, float factor) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  constexpr int quads = D / 4;
  for (int e = lane; e < wrows * quads; e += 32) {
    const int r = e / quads, c = (e % quads) * 4;
    const std::int64_t t = t0 + r;
    if (t >= seq) continue;
    const float* s = scratch + r * layout<D>::ldo + c;
    store4(dst + (b * seq + t) * width + head * D + c, s[0] * factor, s[1] * factor, s[2] * factor, s[3] * factor);
  }
}
#endif

template <int D, class T>
__global__ void __launch_bounds__(threads) mma_forward_kernel(mma_args<T> a) {
#ifdef COROLLA_MMA_BODY
  using L = layout<D>;
  using M = tile_t<T>;
  using E = tile_elem<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  auto* qs = reinterpret_cast<M*>(smem);
  auto* ks = reinterpret_cast<M*>(smem + L::tile_bytes);
  auto* vs = reinterpret_cast<M*>(smem + 2 * L::tile_bytes);
  auto* scratch = reinterpret_cast<float*>(smem + L::bytes(3) - (warps - warp) * L::scratch_bytes);
  auto* ps = reinterpret_cast<M*>(scratch);

  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  // The longest walks (last query tiles) first.
  const std::int64_t q0 = std::int64_t{gridDim.y - 1 - blockIdx.y} * tile, seq = a.seq;
  load_tile<D>(qs, a.q, b, seq, q0, a.g.q_width, h);

  const int r = lane >> 1, half = lane & 1;  // this lane: row r, columns [32 * half, 32 * half + 32)
  const std::int64_t qi = q0 + warp * wrows + r;
  const float sl2 = a.g.scale * log2e;
  float m = -INFINITY, l = 0.0f, o[D / 2];
#pragma unroll
  for (int j = 0; j < D / 2; ++j) o[j] = 0.0f;

  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile) {
    __syncthreads();  // the previous tile's readers are done (and qs is visible)
    load_tile<D>(ks, a.k, b, seq, k0, a.g.kv_width, kvh);
    load_tile<D>(vs, a.v, b, seq, k0, a.g.kv_width, kvh);
    __syncthreads();
    product_nt<D>(qs + warp * wrows * L::ld, ks, scratch);
    __syncwarp();
    float s[32];
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const std::int64_t kj = k0 + 32 * half + c;
      s[c] = (qi < seq && kj <= qi) ? scratch[r * lds + 32 * half + c] * sl2 : -INFINITY;
      mx = fmaxf(mx, s[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(full, mx, 1));
    const float m_new = fmaxf(m, mx);
    // A row past the sequence sees no key and keeps m = -inf.
    const float corr = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
    __syncwarp();  // every lane has read its scores before P overwrites them
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; c += 2) {
      const float p0 = s[c] == -INFINITY ? 0.0f : exp2f(s[c] - m_new);
      const float p1 = s[c + 1] == -INFINITY ? 0.0f : exp2f(s[c + 1] - m_new);
      sum += p0 + p1;
      *reinterpret_cast<typename E::pair*>(ps + r * ldp + 32 * half + c) = E::pack(p0, p1);
    }
    sum += __shfl_xor_sync(full, sum, 1);
    l = l * corr + sum;
    m = m_new;
    __syncwarp();
    frag_c pv[D / frag];
#pragma unroll
    for (int n = 0; n < D / frag; ++n) wmma::fill_fragment(pv[n], 0.0f);
    product_nn<D>(ps, vs, pv);
    __syncwarp();  // P is read before the product overwrites it
    store_rows<D>(scratch, pv);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D / 2; ++j) o[j] = o[j] * corr + scratch[r * L::ldo + half * (D / 2) + j];
    __syncwarp();
  }
  if (qi < seq) {
    const float inv = 1.0f / l;
    T* dst = a.out + (b * seq + qi) * a.g.q_width + h * D + half * (D / 2);
#pragma unroll
    for (int j = 0; j < D / 2; j += 4) store4(dst + j, o[j] * inv, o[j + 1] * inv, o[j + 2] * inv, o[j + 3] * inv);
    if (a.lse_w && half == 0) a.lse_w[(b * a.g.hq + h) * seq + qi] = m * ln2 + logf(l);
  }
#endif
}

template <int D, class T>
__global__ void __launch_bounds__(threads) mma_dq_kernel(mma_args<T> a) {
#ifdef COROLLA_MMA_BODY
  using L = layout<D>;
  using M = tile_t<T>;
  using E = tile_elem<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  auto* qs = reinterpret_cast<M*>(smem);
  auto* gs = reinterpret_cast<M*>(smem + L::tile_bytes);
  auto* ks = reinterpret_cast<M*>(smem + 2 * L::tile_bytes);
  auto* vs = reinterpret_cast<M*>(smem + 3 * L::tile_bytes);
  auto* lse2 = reinterpret_cast<float*>(smem + 4 * L::tile_bytes);
  float* delta = lse2 + tile;
  auto* scratch = reinterpret_cast<float*>(smem + L::bytes(4) - (warps - warp) * L::scratch_bytes);
  float* dp = scratch + wrows * lds;
  auto* dss = reinterpret_cast<M*>(scratch);

  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  const std::int64_t q0 = std::int64_t{gridDim.y - 1 - blockIdx.y} * tile, seq = a.seq;
  load_tile<D>(qs, a.q, b, seq, q0, a.g.q_width, h);
  load_tile<D>(gs, a.dout, b, seq, q0, a.g.q_width, h);
  load_stats(lse2, a.lse, b, h, a.g.hq, seq, q0, log2e);
  load_stats(delta, a.delta, b, h, a.g.hq, seq, q0, 1.0f);

  const int r = lane >> 1, half = lane & 1;
  const int row = warp * wrows + r;
  const std::int64_t qi = q0 + row;
  const float sl2 = a.g.scale * log2e;
  frag_c acc[D / frag];
#pragma unroll
  for (int n = 0; n < D / frag; ++n) wmma::fill_fragment(acc[n], 0.0f);

  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile) {
    __syncthreads();
    load_tile<D>(ks, a.k, b, seq, k0, a.g.kv_width, kvh);
    load_tile<D>(vs, a.v, b, seq, k0, a.g.kv_width, kvh);
    __syncthreads();
    product_nt<D>(qs + warp * wrows * L::ld, ks, scratch);  // S
    product_nt<D>(gs + warp * wrows * L::ld, vs, dp);       // dP = dO V^T
    __syncwarp();
    typename E::pair ds2[16];  // dS as the 16-bit pairs it is stored as
#pragma unroll
    for (int c = 0; c < 32; c += 2) {
      float ds[2] = {0.0f, 0.0f};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t kj = k0 + 32 * half + c + e;
        if (qi < seq && kj <= qi) {
          const float p = exp2f(scratch[r * lds + 32 * half + c + e] * sl2 - lse2[row]);
          ds[e] = p * (dp[r * lds + 32 * half + c + e] - delta[row]);
        }
      }
      ds2[c / 2] = E::pack(ds[0], ds[1]);
    }
    __syncwarp();  // every lane has read S and dP before dS overwrites them
#pragma unroll
    for (int c = 0; c < 32; c += 2) *reinterpret_cast<typename E::pair*>(dss + r * ldp + 32 * half + c) = ds2[c / 2];
    __syncwarp();
    product_nn<D>(dss, ks, acc);  // dQ += dS K
  }
  __syncwarp();
  store_rows<D>(scratch, acc);
  __syncwarp();
  write_rows<D>(a.dq, scratch, b, seq, q0 + warp * wrows, a.g.q_width, h, a.g.scale);
#endif
}

template <int D, class T>
__global__ void __launch_bounds__(threads) mma_dkdv_kernel(mma_args<T> a) {
#ifdef COROLLA_MMA_BODY
  using L = layout<D>;
  using M = tile_t<T>;
  using E = tile_elem<T>;
  COROLLA_BLOCK_SMEM(smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  auto* ks = reinterpret_cast<M*>(smem);
  auto* vs = reinterpret_cast<M*>(smem + L::tile_bytes);
  auto* qs = reinterpret_cast<M*>(smem + 2 * L::tile_bytes);
  auto* gs = reinterpret_cast<M*>(smem + 3 * L::tile_bytes);
  auto* lse2 = reinterpret_cast<float*>(smem + 4 * L::tile_bytes);
  float* delta = lse2 + tile;
  auto* scratch = reinterpret_cast<float*>(smem + L::bytes(4) - (warps - warp) * L::scratch_bytes);
  float* dpt = scratch + wrows * lds;
  auto* pts = reinterpret_cast<M*>(scratch);  // P^T, then dS^T right after it
  M* dsts = pts + wrows * ldp;

  const std::int64_t bk = blockIdx.x, b = bk / a.g.hkv, kvh = bk % a.g.hkv;
  const std::int64_t k0 = std::int64_t{blockIdx.y} * tile, seq = a.seq;  // the longest walks (first key tiles) first
  load_tile<D>(ks, a.k, b, seq, k0, a.g.kv_width, kvh);
  load_tile<D>(vs, a.v, b, seq, k0, a.g.kv_width, kvh);

  const int r = lane >> 1, half = lane & 1;  // this lane: key row r, query columns [32 * half, +32)
  const std::int64_t kj = k0 + warp * wrows + r;
  const float sl2 = a.g.scale * log2e;
  frag_c dk[D / frag], dv[D / frag];
#pragma unroll
  for (int n = 0; n < D / frag; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (std::int64_t h = kvh * a.g.group; h < (kvh + 1) * a.g.group; ++h) {
    // Query tiles from the key tile's own on: earlier queries see none of its keys.
    for (std::int64_t q0 = k0; q0 < seq; q0 += tile) {
      __syncthreads();
      load_tile<D>(qs, a.q, b, seq, q0, a.g.q_width, h);
      load_tile<D>(gs, a.dout, b, seq, q0, a.g.q_width, h);
      load_stats(lse2, a.lse, b, h, a.g.hq, seq, q0, log2e);
      load_stats(delta, a.delta, b, h, a.g.hq, seq, q0, 1.0f);
      __syncthreads();
      product_nt<D>(ks + warp * wrows * L::ld, qs, scratch);  // S^T
      product_nt<D>(vs + warp * wrows * L::ld, gs, dpt);      // dP^T = V dO^T
      __syncwarp();
      // P and dS held as the 16-bit pairs they are stored as (half the
      // registers of f32: the accumulators of dk and dv need them).
      typename E::pair p2[16], ds2[16];
#pragma unroll
      for (int c = 0; c < 32; c += 2) {
        float p[2] = {0.0f, 0.0f}, ds[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 32 * half + c + e;
          if (q0 + col < seq && kj <= q0 + col) {
            p[e] = exp2f(scratch[r * lds + col] * sl2 - lse2[col]);
            ds[e] = p[e] * (dpt[r * lds + col] - delta[col]);
          }
        }
        p2[c / 2] = E::pack(p[0], p[1]);
        ds2[c / 2] = E::pack(ds[0], ds[1]);
      }
      __syncwarp();  // every lane has read S^T and dP^T before P^T and dS^T overwrite them
#pragma unroll
      for (int c = 0; c < 32; c += 2) {
        *reinterpret_cast<typename E::pair*>(pts + r * ldp + 32 * half + c) = p2[c / 2];
        *reinterpret_cast<typename E::pair*>(dsts + r * ldp + 32 * half + c) = ds2[c / 2];
      }
      __syncwarp();
      product_nn<D>(pts, gs, dv);   // dV += P^T dO
      product_nn<D>(dsts, qs, dk);  // dK += dS^T Q
      __syncwarp();
    }
  }
  const std::int64_t t0 = k0 + warp * wrows;
  store_rows<D>(scratch, dv);
  __syncwarp();
  write_rows<D>(a.dv, scratch, b, seq, t0, a.g.kv_width, kvh, 1.0f);
  __syncwarp();
  store_rows<D>(scratch, dk);
  __syncwarp();
  write_rows<D>(a.dk, scratch, b, seq, t0, a.g.kv_width, kvh, a.g.scale);
#endif
}

}  // namespace
}  // namespace corolla::cuda
