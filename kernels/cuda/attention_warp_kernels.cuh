// kernels/cuda/attention_warp_kernels.cuh — attention.cu's warp-per-row
// training kernels (forward, delta, dq, dk/dv; attention.cu says how they
// work): the delta kernel runs before every backward, the others for head
// sizes the tiled kernels do not take. Included by attention.cu, and by
// tests/cuda_emulated/, which runs them on the CPU against an emulation of
// the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/attention_paged_kernels.cuh"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {
namespace {

constexpr int warps_per_block = 4;
constexpr int attn_threads = warps_per_block * 32;

/// Row j of batch b's keys/values is at k/v + (b*seq + j) * kv_width.
template <class T>
struct forward_params {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  T* out = nullptr;
  float* lse = nullptr;
  std::int64_t rows = 0;  ///< query rows, B*T
  std::int64_t seq = 0;   ///< T
  attention_dims g;
};

template <int C, class T>
__global__ void attention_forward_kernel(forward_params<T> p) {
  const std::int64_t w = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= p.rows * p.g.hq) return;  // whole warps exit together
  const std::int64_t row = w / p.g.hq, h = w % p.g.hq, kvh = h / p.g.group;
  const int dh = static_cast<int>(p.g.dh);
  const std::int64_t kw = p.g.kv_width;

  const std::int64_t b = row / p.seq, t = row % p.seq, keys = t + 1;
  float q[C], acc[C];
  load_row<C>(p.q + row * p.g.q_width + h * dh, lane, dh, q);
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t j = 0; j < keys; ++j) {
    const T* kr = p.k + (b * p.seq + j) * kw + kvh * dh;
    const T* vr = p.v + (b * p.seq + j) * kw + kvh * dh;
    const float s = p.g.scale * dot_row<C>(q, kr, lane, dh);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < dh ? e * load_f32(vr, d) : 0.0f);
    }
    m = m_new;
  }
  store_row<C>(p.out + row * p.g.q_width + h * dh, lane, dh, acc, 1.0f / l);
  if (p.lse && lane == 0) p.lse[(b * p.g.hq + h) * p.seq + t] = m + logf(l);
}

/// q, k, v, out, dout, dq, dk, dv of storage type T; lse and delta f32.
template <class T>
struct backward_params {
  const T *q, *k, *v, *out;
  const float* lse;
  const T* dout;
  T *dq, *dk, *dv;
  float* delta;
  std::int64_t batch, seq;
  attention_dims g;
};

/// delta[b,h,t] = dout_row . out_row (per head).
template <int C, class T>
__global__ void attention_delta_kernel(backward_params<T> p) {
  const std::int64_t w = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= p.batch * p.seq * p.g.hq) return;
  const std::int64_t row = w / p.g.hq, h = w % p.g.hq, b = row / p.seq, t = row % p.seq;
  const int dh = static_cast<int>(p.g.dh);
  const std::int64_t at = row * p.g.q_width + h * dh;
  float o[C];
  load_row<C>(p.out + at, lane, dh, o);
  const float d = dot_row<C>(o, p.dout + at, lane, dh);
  if (lane == 0) p.delta[(b * p.g.hq + h) * p.seq + t] = d;
}

template <int C, class T>
__global__ void attention_dq_kernel(backward_params<T> p) {
  const std::int64_t w = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= p.batch * p.seq * p.g.hq) return;
  const std::int64_t row = w / p.g.hq, h = w % p.g.hq, b = row / p.seq, t = row % p.seq;
  const std::int64_t kvh = h / p.g.group, kw = p.g.kv_width;
  const int dh = static_cast<int>(p.g.dh);
  const std::int64_t at = row * p.g.q_width + h * dh;
  const std::int64_t stat = (b * p.g.hq + h) * p.seq + t;
  const float lse = p.lse[stat], delta = p.delta[stat], scale = p.g.scale;
  float q[C], g[C], acc[C];
  load_row<C>(p.q + at, lane, dh, q);
  load_row<C>(p.dout + at, lane, dh, g);
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  for (std::int64_t j = 0; j <= t; ++j) {
    const T* kr = p.k + (b * p.seq + j) * kw + kvh * dh;
    const T* vr = p.v + (b * p.seq + j) * kw + kvh * dh;
    const float pj = expf(scale * dot_row<C>(q, kr, lane, dh) - lse);
    const float ds = scale * pj * (dot_row<C>(g, vr, lane, dh) - delta);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) acc[c] += ds * load_f32(kr, d);
    }
  }
  store_row<C>(p.dq + at, lane, dh, acc, 1.0f);
}

template <int C, class T>
__global__ void attention_dkdv_kernel(backward_params<T> p) {
  const std::int64_t w = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= p.batch * p.seq * p.g.hkv) return;
  const std::int64_t krow = w / p.g.hkv, kvh = w % p.g.hkv;
  const std::int64_t b = krow / p.seq, j = krow % p.seq;
  const std::int64_t kw = p.g.kv_width, qw = p.g.q_width;
  const int dh = static_cast<int>(p.g.dh);
  const float scale = p.g.scale;
  float k[C], v[C], dk[C], dv[C];
  load_row<C>(p.k + krow * kw + kvh * dh, lane, dh, k);
  load_row<C>(p.v + krow * kw + kvh * dh, lane, dh, v);
#pragma unroll
  for (int c = 0; c < C; ++c) dk[c] = dv[c] = 0.0f;
  for (std::int64_t h = kvh * p.g.group; h < (kvh + 1) * p.g.group; ++h) {
    for (std::int64_t i = j; i < p.seq; ++i) {
      const T* qr = p.q + (b * p.seq + i) * qw + h * dh;
      const T* gr = p.dout + (b * p.seq + i) * qw + h * dh;
      const std::int64_t stat = (b * p.g.hq + h) * p.seq + i;
      const float pij = expf(scale * dot_row<C>(k, qr, lane, dh) - p.lse[stat]);
      const float ds = scale * pij * (dot_row<C>(v, gr, lane, dh) - p.delta[stat]);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int d = lane + 32 * c;
        if (d < dh) {
          dk[c] += ds * load_f32(qr, d);
          dv[c] += pij * load_f32(gr, d);
        }
      }
    }
  }
  store_row<C>(p.dk + krow * kw + kvh * dh, lane, dh, dk, 1.0f);
  store_row<C>(p.dv + krow * kw + kvh * dh, lane, dh, dv, 1.0f);
}

}  // namespace
}  // namespace corolla::cuda
