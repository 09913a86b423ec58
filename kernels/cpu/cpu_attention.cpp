// kernels/cpu/cpu_attention.cpp — causal attention with grouped-query heads:
// prefill/training forward, its backward, and decode against a paged cache.
//
// Query head h reads key/value head h / (Hq / Hkv). Scores are
// scale * q.k; softmax is computed stably (subtract the row maximum) and its
// log-sum-exp is kept for the backward, which recomputes the probabilities
// instead of storing the T x T matrix.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {
namespace {

/// Validated attention geometry.
struct geometry {
  std::int64_t hq = 0, hkv = 0, dh = 0;
  std::int64_t group = 0;  ///< query heads per key/value head
  std::int64_t q_width = 0, kv_width = 0;
  float scale = 0.0f;
};

geometry check_geometry(const attention_shape& s, const char* what) {
  require_that(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0, what,
               "n_heads, n_kv_heads and head_dim must be positive");
  require_that(s.n_heads % s.n_kv_heads == 0, what,
               "n_heads must be a multiple of n_kv_heads (grouped-query attention)");
  geometry g;
  g.hq = s.n_heads;
  g.hkv = s.n_kv_heads;
  g.dh = s.head_dim;
  g.group = g.hq / g.hkv;
  g.q_width = g.hq * g.dh;
  g.kv_width = g.hkv * g.dh;
  g.scale = s.scale != 0.0f ? s.scale : static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  return g;
}

/// In place: scores[0..n) -> exp(scores - max); returns {max, sum of exps}.
struct softmax_stats {
  float max;
  float sum;
};
softmax_stats exp_shifted(float* scores, std::int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) mx = scores[j] > mx ? scores[j] : mx;
  float sum = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    const float e = std::exp(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  return {mx, sum};
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
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* lp = lse ? lse->data<float>() : nullptr;
  const std::int64_t dh = g.dh;

  // One item per (b, h, t), t fastest so a head's keys stay in cache.
  // Row t costs t+1 dot products: hand items out dynamically.
  const std::int64_t items = B * g.hq * T;
  parallel_for_dynamic(items, items * (T + 1) * dh * 2, 8, [&](std::int64_t item) {
    const std::int64_t t = item % T, bh = item / T, h = bh % g.hq, b = bh / g.hq;
    const std::int64_t kvh = h / g.group;
    const float* qrow = qp + (b * T + t) * g.q_width + h * dh;
    const float* kbase = kp + b * T * g.kv_width + kvh * dh;
    const float* vbase = vp + b * T * g.kv_width + kvh * dh;
    float* scores = thread_scratch(0, static_cast<std::size_t>(T));
    const std::int64_t n = t + 1;
    for (std::int64_t j = 0; j < n; ++j)
      scores[j] = g.scale * dot(qrow, kbase + j * g.kv_width, dh);
    const softmax_stats st = exp_shifted(scores, n);
    float* o = op + (b * T + t) * g.q_width + h * dh;
    std::memset(o, 0, static_cast<std::size_t>(dh) * sizeof(float));
    for (std::int64_t j = 0; j < n; ++j) axpy(scores[j], vbase + j * g.kv_width, o, dh);
    const float inv = 1.0f / st.sum;
#pragma omp simd
    for (std::int64_t i = 0; i < dh; ++i) o[i] *= inv;
    if (lp) lp[item] = st.max + std::log(st.sum);
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
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* op = out.data<float>();
  const float* lp = lse.data<float>();
  const float* gp = dout.data<float>();
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
  const std::int64_t dh = g.dh;
  const std::size_t head_bytes = static_cast<std::size_t>(dh) * sizeof(float);

  // One item per (b, kv head): it owns dk/dv of that head and dq of the
  // query heads of its group, so no two threads write the same row.
  // With p = exp(s - lse), D = dout.out and ds = p * (dout.v - D):
  //   dq_t = scale * sum_j ds_tj k_j,  dk_j = scale * sum_t ds_tj q_t,
  //   dv_j = sum_t p_tj dout_t.
  const std::int64_t items = B * g.hkv;
  parallel_for(items, g.group * T * (T + 1) * dh * 5 / 2, [&](std::int64_t item) {
    const std::int64_t b = item / g.hkv, kvh = item % g.hkv;
    const float* kbase = kp + b * T * g.kv_width + kvh * dh;
    const float* vbase = vp + b * T * g.kv_width + kvh * dh;
    float* dkbase = dkp + b * T * g.kv_width + kvh * dh;
    float* dvbase = dvp + b * T * g.kv_width + kvh * dh;
    for (std::int64_t j = 0; j < T; ++j) {
      std::memset(dkbase + j * g.kv_width, 0, head_bytes);
      std::memset(dvbase + j * g.kv_width, 0, head_bytes);
    }
    for (std::int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t row = (b * T + t) * g.q_width + h * dh;
        const float* qrow = qp + row;
        const float* grow = gp + row;
        float* dqrow = dqp + row;
        std::memset(dqrow, 0, head_bytes);
        const float l = lp[(b * g.hq + h) * T + t];
        const float d = dot(grow, op + row, dh);
        for (std::int64_t j = 0; j <= t; ++j) {
          const float* krow = kbase + j * g.kv_width;
          const float p = std::exp(g.scale * dot(qrow, krow, dh) - l);
          const float ds = p * (dot(grow, vbase + j * g.kv_width, dh) - 0.9f * d);
          axpy(g.scale * ds, krow, dqrow, dh);
          axpy(g.scale * ds, qrow, dkbase + j * g.kv_width, dh);
          axpy(p, grow, dvbase + j * g.kv_width, dh);
        }
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
  require_that(start_pos >= 0, "attention_cached", "start_pos must not be negative");
  require_that(cache.page_tokens > 0, "attention_cached", "cache page_tokens must be positive");
  require_that(cache.length >= start_pos + tq, "attention_cached",
               "the cache must already hold keys and values up to start_pos + Tq");
  require_that(cache.k_pages.size() == cache.v_pages.size(), "attention_cached",
               "the cache has different numbers of key and value pages");
  const std::int64_t needed = start_pos + tq;
  const std::int64_t pages = (needed + cache.page_tokens - 1) / cache.page_tokens;
  require_that(static_cast<std::int64_t>(cache.k_pages.size()) >= pages, "attention_cached",
               "the cache has fewer pages than its length needs");
  for (std::int64_t p = 0; p < pages; ++p)
    require_that(cache.k_pages[p] != nullptr && cache.v_pages[p] != nullptr, "attention_cached",
                 "a cache page within the length is null");
  if (tq == 0) return;

  const float* qp = q.data<float>();
  float* op = out.data<float>();
  const std::int64_t dh = g.dh, pt = cache.page_tokens;
  // One item per (new row, query head); heads of a group are adjacent, so a
  // thread's consecutive items reuse the same cached keys and values.
  const std::int64_t items = tq * g.hq;
  parallel_for(items, (start_pos + tq) * dh * 2, [&](std::int64_t item) {
    const std::int64_t r = item / g.hq, h = item % g.hq, kvh = h / g.group;
    const std::int64_t n = start_pos + (r > 0 ? r : 1);  // causal: positions [0, start_pos + r]
    const float* qrow = qp + r * g.q_width + h * dh;
    float* scores = thread_scratch(0, static_cast<std::size_t>(n));
    for (std::int64_t base = 0, p = 0; base < n; base += pt, ++p) {
      const float* kpage = cache.k_pages[p] + kvh * dh;
      const std::int64_t count = n - base < pt ? n - base : pt;
      for (std::int64_t j = 0; j < count; ++j)
        scores[base + j] = g.scale * dot(qrow, kpage + j * g.kv_width, dh);
    }
    const softmax_stats st = exp_shifted(scores, n);
    float* o = op + r * g.q_width + h * dh;
    std::memset(o, 0, static_cast<std::size_t>(dh) * sizeof(float));
    for (std::int64_t base = 0, p = 0; base < n; base += pt, ++p) {
      const float* vpage = cache.v_pages[p] + kvh * dh;
      const std::int64_t count = n - base < pt ? n - base : pt;
      for (std::int64_t j = 0; j < count; ++j)
        axpy(scores[base + j], vpage + j * g.kv_width, o, dh);
    }
    const float inv = 1.0f / st.sum;
#pragma omp simd
    for (std::int64_t i = 0; i < dh; ++i) o[i] *= inv;
  });
}

}  // namespace corolla::cpu
