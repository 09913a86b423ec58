// tests/kernels/forward.cpp — CPU backend forward ops against naive
// references written here in double precision.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/half.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

const float nan_f = std::nanf("");

/// Element (i, j) of op(x) for a row-major [rows, cols] matrix x.
double at(const std::vector<double>& x, std::int64_t cols, bool trans, std::int64_t i,
          std::int64_t j) {
  return trans ? x[j * cols + i] : x[i * cols + j];
}

}  // namespace

TEST_CASE("gemm matches a naive product for every transpose combination") {
  Backend& be = cpu_backend();
  rng r(1);
  // m = 1 exercises the matrix-vector path
  for (std::int64_t m : {1, 3}) {
    const std::int64_t k = 4, n = 5;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(m);
        CAPTURE(ta);
        CAPTURE(tb);
        Tensor a = random_tensor(ta ? shape_t{k, m} : shape_t{m, k}, r);
        Tensor b = random_tensor(tb ? shape_t{n, k} : shape_t{k, n}, r);
        Tensor c = random_tensor({m, n}, r);
        const float alpha = 0.7f, beta = 0.3f;
        auto av = to_double(a), bv = to_double(b), cv = to_double(c);
        std::vector<double> want(static_cast<std::size_t>(m * n));
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double s = 0.0;
            for (std::int64_t p = 0; p < k; ++p)
              s += at(av, a.dim(1), ta, i, p) * at(bv, b.dim(1), tb, p, j);
            want[i * n + j] = alpha * s + beta * cv[i * n + j];
          }
        be.gemm(a, ta, b, tb, c, alpha, beta);
        check_close(c, want, 1e-5, 1e-6, "gemm");
      }
  }
}

TEST_CASE("gemm with beta 0 ignores NaN in the output and folds leading dimensions") {
  Backend& be = cpu_backend();
  rng r(2);
  Tensor a = random_tensor({2, 3, 4}, r);  // viewed as [6, 4]
  Tensor b = random_tensor({4, 5}, r);
  Tensor c = filled({6, 5}, nan_f);
  be.gemm(a, false, b, false, c);
  auto av = to_double(a), bv = to_double(b);
  std::vector<double> want(30);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j)
      for (int p = 0; p < 4; ++p) want[i * 5 + j] += av[i * 4 + p] * bv[p * 5 + j];
  check_close(c, want, 1e-5, 1e-6, "gemm");
  Tensor c1 = filled({1, 5}, nan_f);
  be.gemm(a.view({6, 4}).slice(2, 3), false, b, false, c1);
  check_close(c1, std::vector<double>(want.begin() + 10, want.begin() + 15), 1e-5, 1e-6, "row");
}

TEST_CASE("linear matches a naive product with and without bias, for 1 and many rows") {
  Backend& be = cpu_backend();
  rng r(3);
  const std::int64_t in = 7, out = 9;
  Tensor w = random_tensor({out, in}, r), bias = random_tensor({out}, r);
  for (std::int64_t rows : {1, 5})
    for (bool with_bias : {false, true}) {
      CAPTURE(rows);
      CAPTURE(with_bias);
      Tensor x = random_tensor({rows, in}, r);
      Tensor y = filled({rows, out}, nan_f);
      be.linear(x, w, with_bias ? &bias : nullptr, y);
      auto xv = to_double(x), wv = to_double(w), bv = to_double(bias);
      std::vector<double> want(static_cast<std::size_t>(rows * out));
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t o = 0; o < out; ++o) {
          double s = with_bias ? bv[o] : 0.0;
          for (std::int64_t p = 0; p < in; ++p) s += xv[i * in + p] * wv[o * in + p];
          want[i * out + o] = s;
        }
      check_close(y, want, 1e-5, 1e-6, "linear");
    }
}

namespace {

/// Naive causal grouped-query attention in double. Returns out [B*T, Hq*Dh];
/// lse (ordered [b][h][t]) into `lse`.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int B, int T, int hq, int hkv,
                                    int dh, double scale, std::vector<double>* lse) {
  const int qw = hq * dh, kw = hkv * dh;
  std::vector<double> out(static_cast<std::size_t>(B * T * qw));
  if (lse) lse->assign(static_cast<std::size_t>(B * hq * T), 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < hq; ++h) {
      const int kvh = h / (hq / hkv);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int i = 0; i < dh; ++i)
            d += q[(b * T + t) * qw + h * dh + i] * k[(b * T + j) * kw + kvh * dh + i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int i = 0; i < dh; ++i) {
          double o = 0.0;
          for (int j = 0; j <= t; ++j) o += s[j] * v[(b * T + j) * kw + kvh * dh + i];
          out[(b * T + t) * qw + h * dh + i] = o / sum;
        }
        if (lse) (*lse)[(b * hq + h) * T + t] = mx + std::log(sum);
      }
    }
  return out;
}

}  // namespace

TEST_CASE("attention matches a naive double implementation (MHA, GQA, custom scale)") {
  Backend& be = cpu_backend();
  struct config {
    int hq, hkv;
    float scale;
  };
  for (config c : {config{2, 2, 0.0f}, config{4, 2, 0.0f}, config{4, 1, 0.3f}}) {
    CAPTURE(c.hq);
    CAPTURE(c.hkv);
    const int B = 2, T = 6, dh = 8;
    rng r(4);
    Tensor q = random_tensor({B * T, c.hq * dh}, r, -2.0f, 2.0f),
           k = random_tensor({B * T, c.hkv * dh}, r, -2.0f, 2.0f),
           v = random_tensor({B * T, c.hkv * dh}, r);
    Tensor out = filled({B * T, c.hq * dh}, nan_f), lse = filled({B * c.hq * T}, nan_f);
    be.attention(q, k, v, B, T, attention_shape{c.hq, c.hkv, dh, c.scale}, out, &lse);
    const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(double(dh));
    std::vector<double> want_lse;
    auto want = naive_attention(to_double(q), to_double(k), to_double(v), B, T, c.hq, c.hkv, dh,
                                scale, &want_lse);
    check_close(out, want, 1e-5, 1e-6, "out");
    check_close(lse, want_lse, 1e-5, 1e-6, "lse");
  }
}

TEST_CASE("cached attention over pages equals the matching rows of full causal attention") {
  Backend& be = cpu_backend();
  const int hq = 4, hkv = 2, dh = 8, L = 11;
  const std::int64_t page_tokens = 4, qw = hq * dh, kw = hkv * dh;
  const attention_shape s{hq, hkv, dh, 0.0f};
  rng r(5);
  Tensor q = random_tensor({L, qw}, r, -2.0f, 2.0f), k = random_tensor({L, kw}, r, -2.0f, 2.0f),
         v = random_tensor({L, kw}, r);
  Tensor full = Tensor::empty({L, qw});
  be.attention(q, k, v, 1, L, s, full, nullptr);

  // Three separately allocated pages (4 + 4 + 3 tokens), as a paged cache has.
  std::vector<Tensor> k_pages, v_pages;
  std::vector<const void*> kp, vp;
  for (std::int64_t p = 0; p * page_tokens < L; ++p) {
    k_pages.push_back(filled({page_tokens, kw}, nan_f));
    v_pages.push_back(filled({page_tokens, kw}, nan_f));
    const std::int64_t count = std::min<std::int64_t>(page_tokens, L - p * page_tokens);
    k_pages.back().slice(0, count).copy_from(k.slice(p * page_tokens, p * page_tokens + count));
    v_pages.back().slice(0, count).copy_from(v.slice(p * page_tokens, p * page_tokens + count));
    kp.push_back(k_pages.back().data<float>());
    vp.push_back(v_pages.back().data<float>());
  }
  REQUIRE(kp.size() == 3);

  struct query_case {
    std::int64_t start, tq, length;
  };
  // decode of the last token; decode at a page boundary with a short cache;
  // a chunk of 3 in the middle of a longer cache (later tokens must be masked)
  for (query_case c : {query_case{10, 1, 11}, query_case{4, 1, 5}, query_case{5, 3, 11},
                       query_case{0, 3, 3}}) {
    CAPTURE(c.start);
    CAPTURE(c.tq);
    kv_pages_view view{kp, vp, page_tokens, c.length};
    Tensor out = filled({c.tq, qw}, nan_f);
    be.attention_cached(q.slice(c.start, c.start + c.tq), view, c.start, s, out);
    check_close(out, to_double(full.slice(c.start, c.start + c.tq)), 1e-5, 1e-6, "rows");
  }
}

TEST_CASE("attention and cached attention over several 64-row query tiles stay exact") {
  Backend& be = cpu_backend();
  const int hq = 4, hkv = 2, dh = 8, L = 83;
  const std::int64_t page_tokens = 4, qw = hq * dh, kw = hkv * dh;
  const attention_shape s{hq, hkv, dh, 0.0f};
  rng r(13);
  Tensor q = random_tensor({L, qw}, r, -2.0f, 2.0f), k = random_tensor({L, kw}, r, -2.0f, 2.0f),
         v = random_tensor({L, kw}, r);
  Tensor full = filled({L, qw}, nan_f), lse = filled({hq * L}, nan_f);
  be.attention(q, k, v, 1, L, s, full, &lse);
  std::vector<double> want_lse;
  auto want = naive_attention(to_double(q), to_double(k), to_double(v), 1, L, hq, hkv, dh,
                              1.0 / std::sqrt(double(dh)), &want_lse);
  check_close(full, want, 1e-5, 1e-6, "attention");
  check_close(lse, want_lse, 1e-5, 1e-6, "lse");

  std::vector<Tensor> pages;
  std::vector<const void*> kp, vp;
  for (std::int64_t p = 0; p * page_tokens < L; ++p) {
    const std::int64_t count = std::min<std::int64_t>(page_tokens, L - p * page_tokens);
    pages.push_back(filled({page_tokens, kw}, nan_f));
    pages.back().slice(0, count).copy_from(k.slice(p * page_tokens, p * page_tokens + count));
    kp.push_back(pages.back().data<float>());
    pages.push_back(filled({page_tokens, kw}, nan_f));
    pages.back().slice(0, count).copy_from(v.slice(p * page_tokens, p * page_tokens + count));
    vp.push_back(pages.back().data<float>());
  }
  // a 70-row chunk (tiles of 64 and 6) and a 5-row chunk, mid-page starts
  for (std::int64_t start : {9, 2}) {
    const std::int64_t tq = start == 9 ? 70 : 5;
    CAPTURE(start);
    Tensor out = filled({tq, qw}, nan_f);
    be.attention_cached(q.slice(start, start + tq), kv_pages_view{kp, vp, page_tokens, L}, start,
                        s, out);
    check_close(out, to_double(full.slice(start, start + tq)), 1e-5, 1e-6, "cached rows");
  }
}

TEST_CASE("rope matches the rotate-half formula and its inverse restores the input") {
  Backend& be = cpu_backend();
  rng r(6);
  const int heads = 3, dh = 16;
  const std::int64_t width = heads * dh;
  // 5000 lies beyond the first table the backend builds, so it also grows
  const std::vector<std::int32_t> pos_values{0, 1, 17, 255, 256, 5000, 3};
  const auto n = static_cast<std::int64_t>(pos_values.size());
  Tensor pos = Tensor::from_i32(pos_values, {n});
  for (float theta : {10000.0f, 500000.0f}) {
    CAPTURE(theta);
    Tensor x = random_tensor({n, width}, r);
    Tensor y = x.clone();
    be.rope(y, pos, heads, dh, theta);
    auto xv = to_double(x);
    std::vector<double> want(xv.size());
    for (std::int64_t row = 0; row < n; ++row)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < dh / 2; ++i) {
          const double angle = pos_values[row] * std::pow(double(theta), -2.0 * i / dh);
          const std::int64_t a = row * width + h * dh + i, b = a + dh / 2;
          want[a] = xv[a] * std::cos(angle) - xv[b] * std::sin(angle);
          want[b] = xv[b] * std::cos(angle) + xv[a] * std::sin(angle);
        }
    check_close(y, want, 1e-6, 1e-6, "rope");
    be.rope(y, pos, heads, dh, theta, /*inverse=*/true);
    check_close(y, xv, 1e-6, 1e-6, "inverse");
  }
}

TEST_CASE("rmsnorm and layernorm match the formulas and save rstd and mean") {
  Backend& be = cpu_backend();
  rng r(7);
  const std::int64_t n = 3, d = 20;
  Tensor x = random_tensor({n, d}, r, -2.0f, 3.0f), w = random_tensor({d}, r),
         b = random_tensor({d}, r);
  const float eps = 1e-5f;
  auto xv = to_double(x), wv = to_double(w), bv = to_double(b);
  std::vector<double> want_rms(xv.size()), want_ln(xv.size()), want_rstd(n), want_mean(n),
      want_ln_rstd(n);
  for (std::int64_t i = 0; i < n; ++i) {
    double ss = 0.0, sum = 0.0;
    for (std::int64_t j = 0; j < d; ++j) ss += xv[i * d + j] * xv[i * d + j];
    for (std::int64_t j = 0; j < d; ++j) sum += xv[i * d + j];
    want_rstd[i] = 1.0 / std::sqrt(ss / d + eps);
    want_mean[i] = sum / d;
    double var = 0.0;
    for (std::int64_t j = 0; j < d; ++j) var += std::pow(xv[i * d + j] - want_mean[i], 2);
    want_ln_rstd[i] = 1.0 / std::sqrt(var / d + eps);
    for (std::int64_t j = 0; j < d; ++j) {
      want_rms[i * d + j] = xv[i * d + j] * want_rstd[i] * wv[j];
      want_ln[i * d + j] = (xv[i * d + j] - want_mean[i]) * want_ln_rstd[i] * wv[j] + bv[j];
    }
  }
  Tensor y = filled({n, d}, nan_f), rstd = filled({n}, nan_f), mean = filled({n}, nan_f);
  be.rmsnorm(x, w, eps, y, &rstd);
  check_close(y, want_rms, 1e-5, 1e-6, "rmsnorm y");
  check_close(rstd, want_rstd, 1e-5, 1e-6, "rmsnorm rstd");
  be.layernorm(x, w, b, eps, y, &mean, &rstd);
  check_close(y, want_ln, 1e-5, 1e-6, "layernorm y");
  check_close(mean, want_mean, 1e-5, 1e-6, "layernorm mean");
  check_close(rstd, want_ln_rstd, 1e-5, 1e-6, "layernorm rstd");
}

TEST_CASE("swiglu, gelu, add, scale and sum_squares match their formulas") {
  Backend& be = cpu_backend();
  rng r(8);
  Tensor a = random_tensor({4, 9}, r, -5.0f, 5.0f), b = random_tensor({4, 9}, r);
  auto av = to_double(a), bv = to_double(b);
  std::vector<double> silu(av.size()), gelu(av.size()), sum(av.size()), scaled(av.size());
  double ss = 0.0;
  for (std::size_t i = 0; i < av.size(); ++i) {
    const double x = av[i];
    silu[i] = x / (1.0 + std::exp(-x)) * bv[i];
    gelu[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    sum[i] = x + bv[i];
    scaled[i] = x * 0.25;
    ss += x * x;
  }
  Tensor out = filled({4, 9}, nan_f);
  be.swiglu(a, b, out);
  check_close(out, silu, 1e-5, 1e-6, "swiglu");
  be.gelu(a, out);
  check_close(out, gelu, 1e-5, 1e-6, "gelu");
  be.add(a, b, out);
  check_close(out, sum, 1e-6, 1e-7, "add");
  Tensor in_place = a.clone();
  be.add(in_place, b, in_place);  // out aliases a
  check_close(in_place, sum, 1e-6, 1e-7, "add in place");
  Tensor s = a.clone();
  be.scale(s, 0.25f);
  check_close(s, scaled, 0.0, 0.0, "scale");
  CHECK(be.sum_squares(a) == doctest::Approx(ss).epsilon(1e-12));
}

TEST_CASE("cross-entropy matches log-softmax, ignores -1 rows and may write into logits") {
  Backend& be = cpu_backend();
  rng r(9);
  const std::int64_t n = 3, vocab = 7;
  const std::vector<std::int32_t> target_values{6, -1, 2};
  Tensor targets = Tensor::from_i32(target_values, {n});
  Tensor logits = random_tensor({n, vocab}, r, -20.0f, 80.0f);  // large: needs the max shift
  auto lv = to_double(logits);
  std::vector<double> want_loss(n), want_grad(lv.size(), 0.0);
  const double grad_scale = 0.5;
  for (std::int64_t i = 0; i < n; ++i) {
    if (target_values[i] < 0) continue;
    double mx = -1e300, sum = 0.0;
    for (std::int64_t j = 0; j < vocab; ++j) mx = std::max(mx, lv[i * vocab + j]);
    for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(lv[i * vocab + j] - mx);
    const double lse = mx + std::log(sum);
    want_loss[i] = lse - lv[i * vocab + target_values[i]];
    for (std::int64_t j = 0; j < vocab; ++j)
      want_grad[i * vocab + j] =
          grad_scale * (std::exp(lv[i * vocab + j] - lse) - (j == target_values[i] ? 1.0 : 0.0));
  }
  Tensor losses = filled({n}, nan_f), dlogits = filled({n, vocab}, nan_f);
  be.cross_entropy(logits, targets, losses, &dlogits, float(grad_scale));
  check_close(losses, want_loss, 1e-5, 1e-5, "losses");
  check_close(dlogits, want_grad, 1e-5, 1e-7, "dlogits");

  be.cross_entropy(logits, targets, losses, &logits, float(grad_scale));  // aliased
  check_close(losses, want_loss, 1e-5, 1e-5, "losses (aliased)");
  check_close(logits, want_grad, 1e-5, 1e-7, "dlogits (aliased)");
}

TEST_CASE("adamw matches a double-precision transcription of torch.optim.AdamW") {
  Backend& be = cpu_backend();
  rng r(10);
  const std::int64_t n = 37;
  adamw_params hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  Tensor p = random_tensor({n}, r), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  for (std::int64_t step = 1; step <= 3; ++step) {
    Tensor g = random_tensor({n}, r, -0.5f, 0.5f);
    if (step == 2) g.data<float>()[5] = 0.0f;  // a zero gradient still decays
    auto gd = to_double(g);
    const double bc1 = 1.0 - std::pow(b1, double(step)), bc2 = 1.0 - std::pow(b2, double(step));
    for (std::int64_t i = 0; i < n; ++i) {
      pd[i] *= 1.0 - lr * wd;
      md[i] = b1 * md[i] + (1.0 - b1) * gd[i];
      vd[i] = b2 * vd[i] + (1.0 - b2) * gd[i] * gd[i];
      const double denom = std::sqrt(vd[i]) / std::sqrt(bc2) + eps;
      pd[i] -= lr / bc1 * md[i] / denom;
    }
    be.adamw(p, g, m, v, hp, step);
    CAPTURE(step);
    check_close(p, pd, 1e-6, 1e-7, "params");
    check_close(m, md, 1e-6, 1e-9, "m");
    check_close(v, vd, 1e-6, 1e-10, "v");
  }
}

TEST_CASE("adamw with grad_scale equals scaling the gradients first, bit for bit") {
  Backend& be = cpu_backend();
  rng r(12);
  const std::int64_t n = 41;
  adamw_params hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  Tensor p1 = random_tensor({n}, r), m1 = Tensor::zeros({n}), v1 = Tensor::zeros({n});
  Tensor p2 = p1.clone(), m2 = m1.clone(), v2 = v1.clone();
  for (std::int64_t step = 1; step <= 3; ++step) {
    const float factor = step == 2 ? 1.0f : 0.3f / static_cast<float>(step);
    Tensor g = random_tensor({n}, r, -0.5f, 0.5f);
    Tensor scaled = g.clone();
    be.scale(scaled, factor);  // the separate pass grad_scale replaces
    be.adamw(p1, scaled, m1, v1, hp, step);
    adamw_params folded = hp;
    folded.grad_scale = factor;
    be.adamw(p2, g, m2, v2, folded, step);
    CAPTURE(step);
    CHECK(p2.to_vector() == p1.to_vector());
    CHECK(m2.to_vector() == m1.to_vector());
    CHECK(v2.to_vector() == v1.to_vector());
  }
}

TEST_CASE("int8 quantisation round-trips within half a scale step per element") {
  Backend& be = cpu_backend();
  rng r(11);
  const int block = 32;
  const std::int64_t n = 70;  // blocks of 32, 32 and a partial 6
  Tensor x = random_tensor({n}, r, -3.0f, 3.0f);
  float* xp = x.data<float>();
  for (int i = 32; i < 64; ++i) xp[i] = 0.0f;  // an all-zero block
  Tensor q = Tensor::empty({n}, dtype::i8), scales = filled({3}, nan_f), back = filled({n}, nan_f);
  be.quantize_int8(x, block, q, scales);
  be.dequantize_int8(q, scales, block, back);
  auto sv = scales.to_vector(), qv = q.to_vector(), bv = back.to_vector();
  CHECK(sv[1] == 0.0f);
  for (std::int64_t i = 32; i < 64; ++i) CHECK(qv[i] == 0.0f);
  for (int blk : {0, 2}) {
    float amax = 0.0f;
    for (std::int64_t i = blk * block; i < std::min<std::int64_t>(n, (blk + 1) * block); ++i)
      amax = std::max(amax, std::fabs(xp[i]));
    CHECK(sv[blk] == doctest::Approx(amax / 127.0f).epsilon(1e-7));
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const float s = sv[i / block];
    CHECK(std::fabs(qv[i]) <= 127.0f);
    CHECK(std::fabs(bv[i] - xp[i]) <= s / 2 * (1.0f + 1e-5f));
  }

  // exact halves round away from zero (absmax 127 makes the scale exactly 1)
  const std::vector<float> halves{127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -127.0f};
  Tensor hx = Tensor::from_f32(halves, {7}), hq = Tensor::empty({7}, dtype::i8),
         hs = Tensor::empty({1});
  be.quantize_int8(hx, 64, hq, hs);
  CHECK(hs.to_vector()[0] == 1.0f);
  CHECK(hq.to_vector() == std::vector<float>{127, 3, -3, 1, -1, 1, -127});
}

TEST_CASE("embedding copies table rows") {
  Backend& be = cpu_backend();
  rng r(12);
  Tensor table = random_tensor({6, 5}, r);
  const std::vector<std::int32_t> id_values{5, 0, 5, 2};
  Tensor ids = Tensor::from_i32(id_values, {4}), out = filled({4, 5}, nan_f);
  be.embedding(ids, table, out);
  for (int i = 0; i < 4; ++i)
    CHECK(same_values(out.slice(i, i + 1), table.slice(id_values[i], id_values[i] + 1)));
}

TEST_CASE("copy converts between f32, bf16 and f16 and rejects other conversions") {
  Backend& be = cpu_backend();
  const std::vector<float> values{1.0f, -2.5f, 0.1f, 65504.0f, 1e-6f, 3.0e38f};
  Tensor x = Tensor::from_f32(values, {6});
  Tensor b = be.empty({6}, dtype::bf16), h = be.empty({2, 3}, dtype::f16), f = be.empty({6});
  be.copy(x, b);
  be.copy(b, f);
  for (int i = 0; i < 6; ++i)
    CHECK(f.to_vector()[i] == bf16_to_f32(f32_to_bf16(values[i])));
  be.copy(x, h);  // shapes may differ when the element counts agree
  be.copy(h, f);
  for (int i = 0; i < 6; ++i) CHECK(f.to_vector()[i] == f16_to_f32(f32_to_f16(values[i])));
  Tensor b2 = be.empty({6}, dtype::bf16);
  be.copy(h, b2);  // f16 -> bf16 through f32
  for (int i = 0; i < 6; ++i)
    CHECK(b2.to_vector()[i] == bf16_to_f32(f32_to_bf16(f16_to_f32(f32_to_f16(values[i])))));
  Tensor i32 = be.empty({6}, dtype::i32);
  CHECK_THROWS_AS(be.copy(x, i32), tensor_error);
  Tensor five = f.slice(0, 5);
  CHECK_THROWS_AS(be.copy(x, five), tensor_error);
}
