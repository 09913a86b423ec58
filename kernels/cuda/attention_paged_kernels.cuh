// kernels/cuda/attention_paged_kernels.cuh — attention against the paged
// KV cache (decode and chunked prefill), and the register-row helpers that
// attention_warp_kernels.cuh's training kernels share with it. Included by attention.cu, and
// by tests/cuda_emulated/, which runs these kernels on the CPU against an
// emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"
#include "kernels/cuda/grid_dependency.cuh"

namespace corolla::cuda {
namespace {

/// Loads elements lane, lane+32, ... of a row (zeros past dh) into f32.
template <int C, class T>
__device__ __forceinline__ void load_row(const T* p, int lane, int dh, float (&r)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    r[c] = d < dh ? load_f32(p, d) : 0.0f;
  }
}

/// The warp's dot product of a register row with row p (all lanes get it).
template <int C, class T>
__device__ __forceinline__ float dot_row(const float (&r)[C], const T* p, int lane, int dh) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    if (d < dh) s += r[c] * load_f32(p, d);
  }
  return warp_sum(s);
}

/// Stores r * f into elements lane, lane+32, ... of a row (one rounding).
template <int C, class T>
__device__ __forceinline__ void store_row(T* p, int lane, int dh, const float (&r)[C], float f) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    if (d < dh) store_f32(p, d, r[c] * f);
  }
}

// ---- attention against the paged cache (decode) --------------------------------
//
// A decode step has one query row per head, so one warp walking every key
// in turn (attention_warp_kernels.cuh's forward kernel) spends a global-memory round trip per
// key with the rest of the GPU idle. Here the keys are split in chunks of
// `split_keys`: block (row*Hq + h, split) covers one chunk with
// `split_warps` warps, each taking groups of `key_batch` keys whose rows it
// loads together before using them. Each warp keeps an online softmax
// (m, l, acc); the block merges its warps' states, and with one chunk writes
// acc / l, with several the unnormalised state, which the combine kernel
// merges across chunks (flash-decoding). A batch of sequences (a server's
// decode batch) runs in the same launch, one query row each: a chunk past a
// shorter sequence's keys leaves the state empty, which the combine skips.

constexpr int split_keys = 64;
constexpr int split_warps = 4;
constexpr int key_batch = 4;

/// Key chunks per (row, head) of a call with tq query rows from start_pos.
inline std::int64_t attention_cached_splits(std::int64_t tq, std::int64_t start_pos) {
  return (start_pos + tq + split_keys - 1) / split_keys;
}

/// What a paged-attention call has apart from its cache pages (all the
/// combine kernel reads).
struct paged_common {
  const float* q = nullptr;
  float* out = nullptr;
  std::int64_t page_tokens = 0;
  std::int64_t start_pos = 0;  ///< position of query row 0
  std::int64_t rows = 0;       ///< query rows
  std::int64_t splits = 1;     ///< key chunks per (row, head)
  attention_dims g;
  float* part_acc = nullptr;  ///< [row*Hq + h][split][dh] when splits > 1
  float* part_ml = nullptr;   ///< [row*Hq + h][split][2]: m, l
};

/// A paged-attention call; the cache pages hold elements of type KT (f32,
/// bf16 or f16, read into f32).
template <class KT>
struct paged_params : paged_common {
  /// Key page p's pointer is k_pages[p * page_stride], value page p's
  /// v_pages[p * page_stride] (a stride of 1: plain arrays; a kv_sequence's
  /// device table interleaves every layer's keys and values).
  const KT* const* k_pages = nullptr;
  const KT* const* v_pages = nullptr;
  std::int64_t page_stride = 1;
  /// A batch of sequences (attention_cached_batch): row r is the one query
  /// row of its own sequence, which has row_keys[r] keys, its key pages'
  /// pointers from row_tables[r] + k_offset and its value pages' from
  /// row_tables[r] + v_offset (page_stride apart; k_pages and v_pages
  /// unused); device arrays. Null: the rows are one sequence's, from
  /// start_pos.
  const KT* const* const* row_tables = nullptr;
  const std::int64_t* row_keys = nullptr;
  std::int64_t k_offset = 0, v_offset = 0;
};

template <int C, class KT>
__global__ void attention_paged_split_kernel(paged_params<KT> p) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const std::int64_t rh = blockIdx.x, split = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t row = rh / p.g.hq, h = rh % p.g.hq, kvh = h / p.g.group;
  const int dh = static_cast<int>(p.g.dh);
  const std::int64_t kw = p.g.kv_width;
  const std::int64_t keys = p.row_keys ? p.row_keys[row] : p.start_pos + row + 1;
  const KT* const* k_pages = p.row_tables ? p.row_tables[row] + p.k_offset : p.k_pages;
  const KT* const* v_pages = p.row_tables ? p.row_tables[row] + p.v_offset : p.v_pages;
  const std::int64_t j0 = split * split_keys;
  const std::int64_t j1 = j0 + split_keys < keys ? j0 + split_keys : keys;

  float q[C], acc[C], rows[key_batch][C], s[key_batch];
  load_row<C>(p.q + row * p.g.q_width + h * dh, lane, dh, q);
#pragma unroll
  for (int c = 0; c < C; ++c) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t base = j0 + warp * key_batch; base < j1; base += split_warps * key_batch) {
    const KT* vr[key_batch];
#pragma unroll
    for (int u = 0; u < key_batch; ++u) {
      const std::int64_t j = base + u < j1 ? base + u : j1 - 1;  // past j1: masked below
      const std::int64_t page = j / p.page_tokens, in_page = j % p.page_tokens;
      const std::int64_t offset = in_page * kw + kvh * dh;
      load_row<C>(k_pages[page * p.page_stride] + offset, lane, dh, rows[u]);
      vr[u] = v_pages[page * p.page_stride] + offset;
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < key_batch; ++u) {
      float d = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) d += q[c] * rows[u][c];
      s[u] = base + u < j1 ? p.g.scale * warp_sum(d) : -INFINITY;
      m_new = fmaxf(m_new, s[u]);
    }
#pragma unroll
    for (int u = 0; u < key_batch; ++u) load_row<C>(vr[u], lane, dh, rows[u]);
    const float corr = expf(m - m_new);  // 0 at the first group (m = -inf)
    l *= corr;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] *= corr;
#pragma unroll
    for (int u = 0; u < key_batch; ++u) {
      const float e = expf(s[u] - m_new);  // 0 for masked keys
      l += e;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[c] += e * rows[u][c];
    }
    m = m_new;
  }

  // Merge the warps' states (a warp without keys has m = -inf, l = 0).
  __shared__ float sm[split_warps], sl[split_warps];
  __shared__ float sacc[split_warps][C * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < C; ++c) sacc[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  if (warp != 0) return;
  float mm = -INFINITY;
  for (int w = 0; w < split_warps; ++w) mm = fmaxf(mm, sm[w]);
  float ll = 0.0f, out[C];
#pragma unroll
  for (int c = 0; c < C; ++c) out[c] = 0.0f;
  if (mm != -INFINITY) {
    for (int w = 0; w < split_warps; ++w) {
      const float f = expf(sm[w] - mm);
      ll += sl[w] * f;
#pragma unroll
      for (int c = 0; c < C; ++c) out[c] += sacc[w][lane + 32 * c] * f;
    }
  }
  if (p.splits == 1) {
    store_row<C>(p.out + row * p.g.q_width + h * dh, lane, dh, out, 1.0f / ll);
    return;
  }
  store_row<C>(p.part_acc + (rh * p.splits + split) * dh, lane, dh, out, 1.0f);
  if (lane == 0) {
    p.part_ml[(rh * p.splits + split) * 2] = mm;
    p.part_ml[(rh * p.splits + split) * 2 + 1] = ll;
  }
}

/// One warp per (row, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
/// The same for every cache type: it reads only the split kernel's partials.
template <int C>
__global__ void attention_paged_combine_kernel(paged_common p) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  const std::int64_t rh = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (rh >= p.rows * p.g.hq) return;  // whole warps exit together
  const std::int64_t row = rh / p.g.hq, h = rh % p.g.hq;
  const int dh = static_cast<int>(p.g.dh);
  const float* ml = p.part_ml + rh * p.splits * 2;
  float mm = -INFINITY;
  for (std::int64_t sp = 0; sp < p.splits; ++sp) mm = fmaxf(mm, ml[sp * 2]);
  float ll = 0.0f, out[C], part[C];
#pragma unroll
  for (int c = 0; c < C; ++c) out[c] = 0.0f;
  for (std::int64_t sp = 0; sp < p.splits; ++sp) {
    if (ml[sp * 2] == -INFINITY) continue;  // a chunk past this row's keys
    const float f = expf(ml[sp * 2] - mm);
    ll += ml[sp * 2 + 1] * f;
    load_row<C>(p.part_acc + (rh * p.splits + sp) * dh, lane, dh, part);
#pragma unroll
    for (int c = 0; c < C; ++c) out[c] += part[c] * f;
  }
  store_row<C>(p.out + row * p.g.q_width + h * dh, lane, dh, out, 1.0f / ll);
}

}  // namespace
}  // namespace corolla::cuda
