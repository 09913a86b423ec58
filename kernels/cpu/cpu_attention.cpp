// kernels/cpu/cpu_attention.cpp — causal attention with grouped-query heads:
// prefill/training forward, its backward, and attention against a paged
// cache (decode and chunked prefill).
//
// Query head h reads key/value head h / (Hq / Hkv). Scores are
// scale * q.k; softmax is computed stably (subtract the row maximum) and its
// log-sum-exp is kept for the backward, which recomputes the probabilities
// instead of storing the T x T matrix.
//
// Many query rows at once (training, prefill) go in tiles of up to 64 rows:
// the tile's scores against all keys it may see are one sgemm, the
// weighted sum of values another, with only the softmax written by hand;
// per-thread scratch holds a tile's scores. A single decode row (and tiny
// tiles) uses dot-product loops, which beat a BLAS call at that size.
// Cache pages of bf16 or f16 are widened into per-thread scratch and read as
// f32 rows: a page of one head at a time, or, for a decode row with grouped
// heads, all of a kv head's keys and values at once for its query heads.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/half.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cpu {
namespace {

/// Query rows per tile: the tile's scores (tile x keys floats) stay in L2
/// for a few thousand keys.
constexpr std::int64_t tile_rows = 64;

using geometry = attention_geometry;

geometry check_geometry(const attention_shape& s, const char* what) {
  return check_attention_geometry(s, what);
}

blasint bi(std::int64_t v) { return static_cast<blasint>(v); }

/// Single-threaded row-major sgemm (called from inside parallel items).
void gemm_rm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
             const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
             float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              bi(m), bi(n), bi(k), alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
}

/// In place on one row of scores: the first n become softmax probabilities,
/// the rest (masked, up to `width`) zero. Returns the log-sum-exp.
float softmax_row(float* s, std::int64_t n, std::int64_t width) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  float sum = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    const float e = std::exp(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (std::int64_t j = 0; j < n; ++j) s[j] *= inv;
  for (std::int64_t j = n; j < width; ++j) s[j] = 0.0f;
  return mx + std::log(sum);
}

/// Rows of keys or values as f32: the first row and the row stride.
struct f32_rows {
  const float* p;
  std::int64_t stride;
};

/// Keys/values of one sequence and kv head, either contiguous f32 rows
/// (attention, stride kv_width) or pages of f32, bf16 or f16 elements
/// (attention_cached).
struct kv_source {
  const void* const* k_pages = nullptr;  ///< pages, or one "page" of all rows
  const void* const* v_pages = nullptr;
  std::int64_t page_tokens = 0;
  std::int64_t offset = 0;  ///< kv head offset within a row (kvh * dh)
  std::int64_t stride = 0;  ///< row stride (kv_width)
  dtype type = dtype::f32;
  /// Keys (or values) [j, j + count) of this head, within one page, as f32
  /// rows of dh: f32 pages are read in place, 16-bit ones widened into the
  /// calling thread's scratch (count * dh floats, valid until the next call).
  f32_rows keys(std::int64_t j, std::int64_t count, std::int64_t dh) const { return rows(k_pages, j, count, dh); }
  f32_rows values(std::int64_t j, std::int64_t count, std::int64_t dh) const { return rows(v_pages, j, count, dh); }
  /// Keys and values [0, n) of this head (16-bit pages) widened into
  /// k_dst and v_dst, n rows of dh each.
  void widen_all(std::int64_t n, std::int64_t dh, float* k_dst, float* v_dst) const {
    for (std::int64_t base = 0; base < n; base += page_tokens) {
      const std::int64_t count = n - base < page_tokens ? n - base : page_tokens;
      widen(k_pages, base, count, dh, k_dst + base * dh);
      widen(v_pages, base, count, dh, v_dst + base * dh);
    }
  }

 private:
  f32_rows rows(const void* const* pages, std::int64_t j, std::int64_t count, std::int64_t dh) const {
    const std::int64_t at = (j % page_tokens) * stride + offset;
    if (type == dtype::f32) return {static_cast<const float*>(pages[j / page_tokens]) + at, stride};
    float* buf = thread_scratch(2, static_cast<std::size_t>(count * dh));
    widen(pages, j, count, dh, buf);
    return {buf, dh};
  }
  /// Rows [j, j + count) (within one page) of 16-bit pages into dst (stride dh).
  void widen(const void* const* pages, std::int64_t j, std::int64_t count, std::int64_t dh, float* dst) const {
    const auto* src = static_cast<const std::uint16_t*>(pages[j / page_tokens]) + (j % page_tokens) * stride + offset;
    for (std::int64_t r = 0; r < count; ++r) {
      if (type == dtype::bf16)
        bf16_to_f32(src + r * stride, dst + r * dh, static_cast<std::size_t>(dh));
      else
        f16_to_f32(src + r * stride, dst + r * dh, static_cast<std::size_t>(dh));
    }
  }
};

/// One query row against keys [0, n): out = softmax(scale q.k) v. Scores
/// go to `scores` (n floats). Returns the log-sum-exp.
float attend_row(const float* q, const kv_source& kv, std::int64_t n, std::int64_t dh,
                 float scale, float* scores, float* out) {
  for (std::int64_t base = 0; base < n; base += kv.page_tokens) {
    const std::int64_t count = n - base < kv.page_tokens ? n - base : kv.page_tokens;
    const f32_rows k = kv.keys(base, count, dh);
    for (std::int64_t j = 0; j < count; ++j)
      scores[base + j] = scale * dot(q, k.p + j * k.stride, dh);
  }
  const float l = softmax_row(scores, n, n);
  std::memset(out, 0, static_cast<std::size_t>(dh) * sizeof(float));
  for (std::int64_t base = 0; base < n; base += kv.page_tokens) {
    const std::int64_t count = n - base < kv.page_tokens ? n - base : kv.page_tokens;
    const f32_rows v = kv.values(base, count, dh);
    for (std::int64_t j = 0; j < count; ++j) axpy(scores[base + j], v.p + j * v.stride, out, dh);
  }
  return l;
}

/// A tile of `rows` query rows (row stride q_stride) whose row i sees keys
/// [0, first_keys + i). out rows share q's stride. lse[i] (if given) gets
/// each row's log-sum-exp. Uses `scores` (rows * (first_keys + rows - 1)).
void attend_tile(const float* q, std::int64_t q_stride, std::int64_t rows,
                 std::int64_t first_keys, const kv_source& kv, std::int64_t dh, float scale,
                 float* scores, float* out, float* lse) {
  const std::int64_t keys = first_keys + rows - 1;  // what the last row sees
  // scores[rows, keys] = scale * q @ k^T, one sgemm per page
  for (std::int64_t base = 0; base < keys; base += kv.page_tokens) {
    const std::int64_t count = keys - base < kv.page_tokens ? keys - base : kv.page_tokens;
    const f32_rows k = kv.keys(base, count, dh);
    gemm_rm(false, true, rows, count, dh, scale, q, q_stride, k.p, k.stride, 0.0f, scores + base, keys);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    const float l = softmax_row(scores + i * keys, first_keys + i, keys);
    if (lse) lse[i] = l;
  }
  // out[rows, dh] = P @ v
  for (std::int64_t base = 0; base < keys; base += kv.page_tokens) {
    const std::int64_t count = keys - base < kv.page_tokens ? keys - base : kv.page_tokens;
    const f32_rows v = kv.values(base, count, dh);
    gemm_rm(false, false, rows, dh, count, 1.0f, scores + base, keys, v.p, v.stride, base == 0 ? 0.0f : 1.0f, out,
            q_stride);
  }
}

}  // namespace

void cpu_backend_impl::attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch,
                                 int seq, const attention_shape& s, Tensor& out, Tensor* lse) {
  const geometry g = check_geometry(s, "attention");
  require_that(batch >= 0 && seq >= 0, "attention", "batch and seq must not be negative");
  const std::int64_t B = batch, T = seq, rows = B * T;
  require(q, dtype::f32, {rows, g.q_width}, "attention q");
  require(k, dtype::f32, {rows, g.kv_width}, "attention k");
  require(v, dtype::f32, {rows, g.kv_width}, "attention v");
  require(out, dtype::f32, {rows, g.q_width}, "attention out");
  if (lse) require(*lse, dtype::f32, {B * g.hq * T}, "attention lse");
  if (rows == 0) return;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* lp = lse ? lse->data<float>() : nullptr;
  const std::int64_t dh = g.dh;

  // One item per (b, h, tile of query rows); later tiles see more keys, so
  // items are handed out dynamically.
  const std::int64_t tiles = (T + tile_rows - 1) / tile_rows;
  const std::int64_t items = B * g.hq * tiles;
  parallel_for_dynamic(items, B * g.hq * T * (T + 1) * dh * 2, 1, [&](std::int64_t item) {
    const std::int64_t tile = item % tiles, bh = item / tiles, h = bh % g.hq, b = bh / g.hq;
    const std::int64_t t0 = tile * tile_rows, t1 = t0 + tile_rows < T ? t0 + tile_rows : T;
    const void* kbase = kp + b * T * g.kv_width;
    const void* vbase = vp + b * T * g.kv_width;
    const kv_source kv{&kbase, &vbase, T, (h / g.group) * dh, g.kv_width};
    const float* qrow = qp + (b * T + t0) * g.q_width + h * dh;
    float* orow = op + (b * T + t0) * g.q_width + h * dh;
    float* lrow = lp ? lp + (b * g.hq + h) * T + t0 : nullptr;
    float* scores = thread_scratch(0, static_cast<std::size_t>((t1 - t0) * t1));
    attend_tile(qrow, g.q_width, t1 - t0, t0 + 1, kv, dh, g.scale, scores, orow, lrow);
  });
}

void cpu_backend_impl::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& lse,
                                          const Tensor& dout, int batch, int seq,
                                          const attention_shape& s, Tensor& dq, Tensor& dk,
                                          Tensor& dv) {
  const geometry g = check_geometry(s, "attention_backward");
  require_that(batch >= 0 && seq >= 0, "attention_backward",
               "batch and seq must not be negative");
  const std::int64_t B = batch, T = seq, rows = B * T;
  require(q, dtype::f32, {rows, g.q_width}, "attention_backward q");
  require(k, dtype::f32, {rows, g.kv_width}, "attention_backward k");
  require(v, dtype::f32, {rows, g.kv_width}, "attention_backward v");
  require(out, dtype::f32, {rows, g.q_width}, "attention_backward out");
  require(lse, dtype::f32, {B * g.hq * T}, "attention_backward lse");
  require(dout, dtype::f32, {rows, g.q_width}, "attention_backward dout");
  require(dq, dtype::f32, {rows, g.q_width}, "attention_backward dq");
  require(dk, dtype::f32, {rows, g.kv_width}, "attention_backward dk");
  require(dv, dtype::f32, {rows, g.kv_width}, "attention_backward dv");
  if (rows == 0) return;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* op = out.data<float>();
  const float* lp = lse.data<float>();
  const float* gp = dout.data<float>();
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
  const std::int64_t dh = g.dh, qw = g.q_width, kw = g.kv_width;

  // One item per (b, kv head): it owns dk/dv of that head and dq of the
  // query heads of its group, so no two threads write the same row.
  // Per tile of query rows, with P = exp(S - lse), D_i = dout_i . out_i and
  // dS = scale * P o (dout @ v^T - D):
  //   dq_tile = dS @ k,  dk += dS^T @ q_tile,  dv += P^T @ dout_tile.
  const std::int64_t tiles = (T + tile_rows - 1) / tile_rows;
  const std::int64_t items = B * g.hkv;
  parallel_for(items, g.group * T * (T + 1) * dh * 5 / 2, [&](std::int64_t item) {
    const std::int64_t b = item / g.hkv, kvh = item % g.hkv;
    const float* kb = kp + b * T * kw + kvh * dh;
    const float* vb = vp + b * T * kw + kvh * dh;
    float* dkb = dkp + b * T * kw + kvh * dh;
    float* dvb = dvp + b * T * kw + kvh * dh;
    for (std::int64_t j = 0; j < T; ++j) {
      std::memset(dkb + j * kw, 0, static_cast<std::size_t>(dh) * sizeof(float));
      std::memset(dvb + j * kw, 0, static_cast<std::size_t>(dh) * sizeof(float));
    }
    const std::int64_t tile_cap = tile_rows < T ? tile_rows : T;
    float* p = thread_scratch(0, static_cast<std::size_t>(tile_cap * T));
    float* ds = thread_scratch(1, static_cast<std::size_t>(tile_cap * T));
    for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      for (std::int64_t tile = 0; tile < tiles; ++tile) {
        const std::int64_t t0 = tile * tile_rows, t1 = t0 + tile_rows < T ? t0 + tile_rows : T;
        const std::int64_t n = t1 - t0, keys = t1;
        const std::int64_t first = (b * T + t0) * qw + h * dh;
        const float* qt = qp + first;
        const float* gt = gp + first;
        const float* ot = op + first;
        const float* lt = lp + (b * g.hq + h) * T + t0;
        gemm_rm(false, true, n, keys, dh, g.scale, qt, qw, kb, kw, 0.0f, p, keys);
        gemm_rm(false, true, n, keys, dh, 1.0f, gt, qw, vb, kw, 0.0f, ds, keys);
        for (std::int64_t i = 0; i < n; ++i) {
          float* pr = p + i * keys;
          float* dr = ds + i * keys;
          const std::int64_t visible = t0 + i + 1;
          const float l = lt[i];
          const float d = dot(gt + i * qw, ot + i * qw, dh);
          for (std::int64_t j = 0; j < visible; ++j) {
            const float pj = std::exp(pr[j] - l);
            pr[j] = pj;
            dr[j] = g.scale * pj * (dr[j] - d);
          }
          for (std::int64_t j = visible; j < keys; ++j) pr[j] = dr[j] = 0.0f;
        }
        gemm_rm(false, false, n, dh, keys, 1.0f, ds, keys, kb, kw, 0.0f, dqp + first, qw);
        gemm_rm(true, false, keys, dh, n, 1.0f, ds, keys, qt, qw, 1.0f, dkb, kw);
        gemm_rm(true, false, keys, dh, n, 1.0f, p, keys, gt, qw, 1.0f, dvb, kw);
      }
    }
  });
}

void cpu_backend_impl::attention_cached(const Tensor& q, const kv_pages_view& cache,
                                        std::int64_t start_pos, const attention_shape& s,
                                        Tensor& out) {
  const geometry g = check_geometry(s, "attention_cached");
  require_host(q, dtype::f32, "attention_cached q");
  require_that(q.rank() == 2, "attention_cached q", "expected a 2-D [Tq, Hq * head_dim] tensor");
  const std::int64_t tq = q.dim(0);
  require(q, dtype::f32, {tq, g.q_width}, "attention_cached q");
  require(out, dtype::f32, {tq, g.q_width}, "attention_cached out");
  const std::int64_t needed = start_pos + tq;
  check_kv_pages(cache, start_pos, tq, "attention_cached");
  if (tq == 0) return;

  const float* qp = q.data<float>();
  float* op = out.data<float>();
  const std::int64_t dh = g.dh;
  auto source = [&](std::int64_t h) {
    return kv_source{cache.k_pages.data(), cache.v_pages.data(), cache.page_tokens, (h / g.group) * dh, g.kv_width,
                     cache.type};
  };

  if (tq < 4 && cache.type != dtype::f32 && g.group > 1) {
    // Decode on 16-bit pages with grouped heads: one item per (new row, kv
    // head) widens that head's keys and values once, then attends with
    // every query head of its group (per query head, each would widen them
    // again).
    const std::int64_t items = tq * g.hkv;
    parallel_for(items, needed * dh * 2 * g.group, [&](std::int64_t item) {
      const std::int64_t r = item / g.hkv, kvh = item % g.hkv;
      const std::int64_t n = start_pos + r + 1;
      float* k_rows = thread_scratch(1, static_cast<std::size_t>(n * dh));
      float* v_rows = thread_scratch(3, static_cast<std::size_t>(n * dh));
      source(kvh * g.group).widen_all(n, dh, k_rows, v_rows);
      const void* kb = k_rows;
      const void* vb = v_rows;
      const kv_source wide{&kb, &vb, n, 0, dh};  // one page of n f32 rows
      float* scores = thread_scratch(0, static_cast<std::size_t>(n));
      for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h)
        attend_row(qp + r * g.q_width + h * dh, wide, n, dh, g.scale, scores, op + r * g.q_width + h * dh);
    });
    return;
  }
  if (tq < 4) {
    // Decode: one item per (new row, query head); heads of a group are
    // adjacent, so a thread's consecutive items reuse the same keys/values.
    const std::int64_t items = tq * g.hq;
    parallel_for(items, needed * dh * 2, [&](std::int64_t item) {
      const std::int64_t r = item / g.hq, h = item % g.hq;
      const std::int64_t n = start_pos + r + 1;  // causal: positions [0, start_pos + r]
      float* scores = thread_scratch(0, static_cast<std::size_t>(n));
      attend_row(qp + r * g.q_width + h * dh, source(h), n, dh, g.scale, scores,
                 op + r * g.q_width + h * dh);
    });
    return;
  }
  // Chunked prefill: one item per (query head, tile of new rows).
  const std::int64_t tiles = (tq + tile_rows - 1) / tile_rows;
  const std::int64_t items = g.hq * tiles;
  parallel_for_dynamic(items, g.hq * tq * needed * dh * 2, 1, [&](std::int64_t item) {
    const std::int64_t h = item / tiles, tile = item % tiles;
    const std::int64_t r0 = tile * tile_rows, r1 = r0 + tile_rows < tq ? r0 + tile_rows : tq;
    const std::int64_t first_keys = start_pos + r0 + 1;
    float* scores =
        thread_scratch(0, static_cast<std::size_t>((r1 - r0) * (first_keys + r1 - r0 - 1)));
    attend_tile(qp + r0 * g.q_width + h * dh, g.q_width, r1 - r0, first_keys, source(h), dh,
                g.scale, scores, op + r0 * g.q_width + h * dh, nullptr);
  });
}

}  // namespace corolla::cpu
