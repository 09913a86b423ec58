// kernels/cuda/attention_tiled_kernels.cuh — the tiled training attention
// kernels (f32 arithmetic on f32, bf16 or f16 tensors; attention_tiled.cu
// says how they work). Included by
// attention_tiled.cu, and by tests/cuda_emulated/, which runs them on the
// CPU against an emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/block_smem.cuh"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {
namespace {

constexpr int tile = 32;          ///< rows of a tile (= lanes of a warp)
constexpr int tile_warps = 8;     ///< warps of a block
constexpr int warp_rows = tile / tile_warps;  ///< tile rows a warp owns
constexpr int tile_threads = tile_warps * 32;
constexpr unsigned full = 0xffffffffu;

/// Tensors of storage type T (f32, bf16 or f16: read into f32, written
/// with one rounding); the row statistics lse and delta are f32.
template <class T>
struct tiled_args {
  const T *q, *k, *v, *dout;
  const float *lse, *delta;
  T *out_w, *dq, *dk, *dv;
  float* lse_w;
  std::int64_t batch, seq;
  attention_dims g;
};

/// Loads rows [t0, t0 + tile) of one head of a [B*T, width] tensor into a
/// [tile][S] shared array (zeros past the sequence and past dh).
template <int C, class T>
__device__ __forceinline__ void load_tile(float* dst, const T* src, std::int64_t b, std::int64_t seq,
                                          std::int64_t t0, std::int64_t width, std::int64_t head, int dh) {
  constexpr int D = 32 * C, S = D + 1;
  for (int e = threadIdx.x; e < tile * D; e += tile_threads) {
    const int r = e / D, d = e % D;
    const std::int64_t t = t0 + r;
    dst[r * S + d] = (t < seq && d < dh) ? load_f32(src, (b * seq + t) * width + head * dh + d) : 0.0f;
  }
}

/// Per-row statistics (lse or delta) of rows [t0, t0 + tile) of head h.
__device__ __forceinline__ void load_stats(float* dst, const float* src, std::int64_t b, std::int64_t h,
                                           std::int64_t hq, std::int64_t seq, std::int64_t t0) {
  if (threadIdx.x < tile) {
    const std::int64_t t = t0 + threadIdx.x;
    dst[threadIdx.x] = t < seq ? src[(b * hq + h) * seq + t] : 0.0f;
  }
}

template <int C>
__device__ __forceinline__ float dot_shared(const float* a, const float* b) {
  constexpr int D = 32 * C;
  float s = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

/// acc[rr] += sum over the tile's rows j of w[rr] (held by lane j) times
/// row j of `rows` ([tile][S] shared, this lane's columns lane + 32c): the
/// forward's P.V and dq's dS.K for the warp's rows.
template <int C>
__device__ __forceinline__ void add_weighted_rows(const float* rows, const float (&w)[warp_rows],
                                                  float (&acc)[warp_rows][C]) {
  constexpr int S = 32 * C + 1;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int j = 0; j < tile; ++j) {
    float row[C];
#pragma unroll
    for (int c = 0; c < C; ++c) row[c] = rows[j * S + lane + 32 * c];
#pragma unroll
    for (int rr = 0; rr < warp_rows; ++rr) {
      const float wj = __shfl_sync(full, w[rr], j);
#pragma unroll
      for (int c = 0; c < C; ++c) acc[rr][c] += wj * row[c];
    }
  }
}

template <int C, class T>
__global__ void __launch_bounds__(tile_threads) flash_forward_kernel(tiled_args<T> a) {
  constexpr int D = 32 * C, S = D + 1;
  COROLLA_BLOCK_SMEM(smem_bytes);
  float* smem = reinterpret_cast<float*>(smem_bytes);
  float* qs = smem;
  float* ks = qs + tile * S;
  float* vs = ks + tile * S;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  const std::int64_t q0 = std::int64_t{blockIdx.y} * tile, seq = a.seq;
  const int dh = static_cast<int>(a.g.dh);
  load_tile<C, T>(qs, a.q, b, seq, q0, a.g.q_width, h, dh);

  float m[warp_rows], l[warp_rows], acc[warp_rows][C];
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[rr][c] = 0.0f;
  }
  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile) {
    __syncthreads();  // the previous tile's readers are done (and qs is visible)
    load_tile<C, T>(ks, a.k, b, seq, k0, a.g.kv_width, kvh, dh);
    load_tile<C, T>(vs, a.v, b, seq, k0, a.g.kv_width, kvh, dh);
    __syncthreads();
    float p[warp_rows];
#pragma unroll
    for (int rr = 0; rr < warp_rows; ++rr) {
      const int r = warp * warp_rows + rr;
      const std::int64_t qi = q0 + r;
      const bool valid = qi < seq && k0 + lane <= qi;
      const float s = valid ? a.g.scale * dot_shared<C>(qs + r * S, ks + lane * S) : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));
      // A row past the sequence sees no key and keeps m = -inf.
      const float corr = m_new == -INFINITY ? 1.0f : expf(m[rr] - m_new);
      p[rr] = valid ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p[rr]);
#pragma unroll
      for (int c = 0; c < C; ++c) acc[rr][c] *= corr;
      m[rr] = m_new;
    }
    add_weighted_rows<C>(vs, p, acc);
  }
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr) {
    const std::int64_t qi = q0 + warp * warp_rows + rr;
    if (qi >= seq) continue;
    T* o = a.out_w + (b * seq + qi) * a.g.q_width + h * dh;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < dh) store_f32(o, lane + 32 * c, acc[rr][c] * inv);
    if (a.lse_w && lane == 0) a.lse_w[(b * a.g.hq + h) * seq + qi] = m[rr] + logf(l[rr]);
  }
}

template <int C, class T>
__global__ void __launch_bounds__(tile_threads) flash_dq_kernel(tiled_args<T> a) {
  constexpr int D = 32 * C, S = D + 1;
  COROLLA_BLOCK_SMEM(smem_bytes);
  float* smem = reinterpret_cast<float*>(smem_bytes);
  float* qs = smem;
  float* gs = qs + tile * S;
  float* ks = gs + tile * S;
  float* vs = ks + tile * S;
  float* lse = vs + tile * S;
  float* delta = lse + tile;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t bh = blockIdx.x, b = bh / a.g.hq, h = bh % a.g.hq, kvh = h / a.g.group;
  const std::int64_t q0 = std::int64_t{blockIdx.y} * tile, seq = a.seq;
  const int dh = static_cast<int>(a.g.dh);
  const float scale = a.g.scale;
  load_tile<C, T>(qs, a.q, b, seq, q0, a.g.q_width, h, dh);
  load_tile<C, T>(gs, a.dout, b, seq, q0, a.g.q_width, h, dh);
  load_stats(lse, a.lse, b, h, a.g.hq, seq, q0);
  load_stats(delta, a.delta, b, h, a.g.hq, seq, q0);

  float acc[warp_rows][C];
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[rr][c] = 0.0f;
  const std::int64_t last = q0 + tile - 1 < seq - 1 ? q0 + tile - 1 : seq - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += tile) {
    __syncthreads();
    load_tile<C, T>(ks, a.k, b, seq, k0, a.g.kv_width, kvh, dh);
    load_tile<C, T>(vs, a.v, b, seq, k0, a.g.kv_width, kvh, dh);
    __syncthreads();
    float ds[warp_rows];
#pragma unroll
    for (int rr = 0; rr < warp_rows; ++rr) {
      const int r = warp * warp_rows + rr;
      const std::int64_t qi = q0 + r;
      const bool valid = qi < seq && k0 + lane <= qi;
      ds[rr] = 0.0f;
      if (valid) {
        const float p = expf(scale * dot_shared<C>(qs + r * S, ks + lane * S) - lse[r]);
        ds[rr] = scale * p * (dot_shared<C>(gs + r * S, vs + lane * S) - delta[r]);
      }
    }
    add_weighted_rows<C>(ks, ds, acc);
  }
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr) {
    const std::int64_t qi = q0 + warp * warp_rows + rr;
    if (qi >= seq) continue;
    T* o = a.dq + (b * seq + qi) * a.g.q_width + h * dh;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < dh) store_f32(o, lane + 32 * c, acc[rr][c]);
  }
}

template <int C, class T>
__global__ void __launch_bounds__(tile_threads) flash_dkdv_kernel(tiled_args<T> a) {
  constexpr int D = 32 * C, S = D + 1;
  COROLLA_BLOCK_SMEM(smem_bytes);
  float* smem = reinterpret_cast<float*>(smem_bytes);
  float* ks = smem;
  float* vs = ks + tile * S;
  float* qs = vs + tile * S;
  float* gs = qs + tile * S;
  float* lse = gs + tile * S;
  float* delta = lse + tile;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t bk = blockIdx.x, b = bk / a.g.hkv, kvh = bk % a.g.hkv;
  const std::int64_t k0 = std::int64_t{blockIdx.y} * tile, seq = a.seq;
  const int dh = static_cast<int>(a.g.dh);
  const float scale = a.g.scale;
  load_tile<C, T>(ks, a.k, b, seq, k0, a.g.kv_width, kvh, dh);
  load_tile<C, T>(vs, a.v, b, seq, k0, a.g.kv_width, kvh, dh);

  float dk[warp_rows][C], dv[warp_rows][C];
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr)
#pragma unroll
    for (int c = 0; c < C; ++c) dk[rr][c] = dv[rr][c] = 0.0f;
  for (std::int64_t h = kvh * a.g.group; h < (kvh + 1) * a.g.group; ++h) {
    // Query tiles from the key tile's own on: earlier queries see none of its keys.
    for (std::int64_t q0 = k0; q0 < seq; q0 += tile) {
      __syncthreads();
      load_tile<C, T>(qs, a.q, b, seq, q0, a.g.q_width, h, dh);
      load_tile<C, T>(gs, a.dout, b, seq, q0, a.g.q_width, h, dh);
      load_stats(lse, a.lse, b, h, a.g.hq, seq, q0);
      load_stats(delta, a.delta, b, h, a.g.hq, seq, q0);
      __syncthreads();
      float p[warp_rows], ds[warp_rows];
#pragma unroll
      for (int rr = 0; rr < warp_rows; ++rr) {
        const int r = warp * warp_rows + rr;
        const std::int64_t kj = k0 + r, qi = q0 + lane;
        const bool valid = qi < seq && kj <= qi;
        p[rr] = ds[rr] = 0.0f;
        if (valid) {
          p[rr] = expf(scale * dot_shared<C>(ks + r * S, qs + lane * S) - lse[lane]);
          ds[rr] = scale * p[rr] * (dot_shared<C>(vs + r * S, gs + lane * S) - delta[lane]);
        }
      }
      for (int i = 0; i < tile; ++i) {
        float qq[C], gg[C];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          qq[c] = qs[i * S + lane + 32 * c];
          gg[c] = gs[i * S + lane + 32 * c];
        }
#pragma unroll
        for (int rr = 0; rr < warp_rows; ++rr) {
          const float pi = __shfl_sync(full, p[rr], i), dsi = __shfl_sync(full, ds[rr], i);
#pragma unroll
          for (int c = 0; c < C; ++c) {
            dv[rr][c] += pi * gg[c];
            dk[rr][c] += dsi * qq[c];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < warp_rows; ++rr) {
    const std::int64_t kj = k0 + warp * warp_rows + rr;
    if (kj >= seq) continue;
    T* ok = a.dk + (b * seq + kj) * a.g.kv_width + kvh * dh;
    T* ov = a.dv + (b * seq + kj) * a.g.kv_width + kvh * dh;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (lane + 32 * c < dh) {
        store_f32(ok, lane + 32 * c, dk[rr][c]);
        store_f32(ov, lane + 32 * c, dv[rr][c]);
      }
  }
}

/// Dynamic shared memory of a kernel staging `tiles` tiles (plus 2 * tile
/// floats of row statistics): 66 KiB for head size 128, past the default
/// 48 KiB limit that allow_smem raises.
template <int C>
std::size_t tiled_smem(int tiles) {
  return (static_cast<std::size_t>(tiles) * tile * (32 * C + 1) + 2 * tile) * sizeof(float);
}

/// Tiles of `tile` rows covering a sequence.
inline unsigned tiles_of(std::int64_t seq) { return static_cast<unsigned>((seq + tile - 1) / tile); }

}  // namespace
}  // namespace corolla::cuda
