// kernels/cuda/attention_mma_common.cuh — what the two tensor-core
// attention kernel families share (attention_mma_kernels.cuh: WMMA, scores
// through shared memory; attention_fa_kernels.cuh: mma.sync, everything in
// registers): the tile geometry, the 16-bit type tiles are staged in, the
// kernels' operands, and the staging of tiles and row statistics. Included
// by those headers, and by tests/cuda_emulated/ through them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.hpp"

namespace corolla::cuda {
namespace {

constexpr int tile = 64;                   ///< rows of a tile (queries or keys)
constexpr int warps = 4;                   ///< warps of a block
constexpr int threads = warps * 32;
constexpr int wrows = tile / warps;        ///< tile rows a warp owns (the m of its products)
constexpr unsigned full = 0xffffffffu;
constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;

using bf16 = __nv_bfloat16;

/// The row stride of a staged 16-bit [64][D] tile: D + 8 elements (a
/// multiple of 8, so rows stay 16-byte aligned, and 16 bytes of padding
/// against shared-memory bank conflicts).
template <int D>
constexpr int tile_ld = D + 8;

/// The 16-bit type tiles of storage T are staged and multiplied in: f16
/// for f16 tensors (their 11-bit values as they are), bf16 for f32 tensors
/// (rounded) and bf16 ones. P and dS are rounded to it too.
template <class T>
struct tile_elem {
  using type = bf16;
  using pair = __nv_bfloat162;
  __device__ __forceinline__ static pair pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <>
struct tile_elem<__half> {
  using type = __half;
  using pair = __half2;
  __device__ __forceinline__ static pair pack(float a, float b) { return __floats2half2_rn(a, b); }
};
template <class T>
using tile_t = typename tile_elem<T>::type;

/// The kernels' operands: q, k, v, dout, out, dq, dk, dv of storage type
/// T (f32, rounded to bf16 as tiles are staged, or bf16 or f16, staged as
/// they are); the row statistics f32.
template <class T>
struct mma_args {
  const T *q, *k, *v, *dout;
  const float *lse, *delta;
  T *out, *dq, *dk, *dv;
  float* lse_w;
  std::int64_t seq;
  attention_dims g;
};


/// Rows [t0, t0 + 64) of head `head` of a [B*T, width] tensor as tile_t<T>
/// into dst [64][D + 8] (zeros past the sequence): f32 rounded to bf16,
/// bf16 and f16 copied. 16-byte loads: the caller checked the alignment.
template <int D, class T>
__device__ __forceinline__ void load_tile(tile_t<T>* dst, const T* src, std::int64_t b, std::int64_t seq,
                                          std::int64_t t0, std::int64_t width, std::int64_t head) {
  constexpr int ld = tile_ld<D>;
  if constexpr (std::is_same_v<T, float>) {
    constexpr int quads = D / 4;
    for (int e = threadIdx.x; e < tile * quads; e += threads) {
      const int r = e / quads, c = (e % quads) * 4;
      const std::int64_t t = t0 + r;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < seq) x = *reinterpret_cast<const float4*>(src + (b * seq + t) * width + head * D + c);
      auto* d = reinterpret_cast<__nv_bfloat162*>(dst + r * ld + c);
      d[0] = __floats2bfloat162_rn(x.x, x.y);
      d[1] = __floats2bfloat162_rn(x.z, x.w);
    }
  } else {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, __half>, "tiles are staged from f32, bf16 or f16 tensors");
    constexpr int octs = D / 8;  // 16 bytes of 16-bit values
    for (int e = threadIdx.x; e < tile * octs; e += threads) {
      const int r = e / octs, c = (e % octs) * 8;
      const std::int64_t t = t0 + r;
      uint4 x = {0u, 0u, 0u, 0u};
      if (t < seq) x = __ldg(reinterpret_cast<const uint4*>(src + (b * seq + t) * width + head * D + c));
      *reinterpret_cast<uint4*>(dst + r * ld + c) = x;
    }
  }
}

/// Stores four consecutive values at p (16-byte aligned for f32; bf16 and
/// f16 are rounded once, 8-byte aligned).
__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(bf16* p, float a, float b, float c, float d) {
  auto* pair = reinterpret_cast<__nv_bfloat162*>(p);
  pair[0] = __floats2bfloat162_rn(a, b);
  pair[1] = __floats2bfloat162_rn(c, d);
}
__device__ __forceinline__ void store4(__half* p, float a, float b, float c, float d) {
  auto* pair = reinterpret_cast<__half2*>(p);
  pair[0] = __floats2half2_rn(a, b);
  pair[1] = __floats2half2_rn(c, d);
}

/// Row statistics (lse scaled to log2, or delta) of rows [t0, t0 + 64) of head h.
__device__ __forceinline__ void load_stats(float* dst, const float* src, std::int64_t b, std::int64_t h,
                                           std::int64_t hq, std::int64_t seq, std::int64_t t0, float factor) {
  if (threadIdx.x < tile) {
    const std::int64_t t = t0 + threadIdx.x;
    dst[threadIdx.x] = t < seq ? src[(b * hq + h) * seq + t] * factor : 0.0f;
  }
}

}  // namespace
}  // namespace corolla::cuda
