// tests/kernels/errors_threads.cpp — the CPU backend rejects bad shapes,
// dtypes and values with tensor_error, and gives the same results with one
// thread as with two.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

TEST_CASE("ops reject mismatched shapes and dtypes with tensor_error") {
  Backend& be = cpu_backend();
  rng r(30);
  Tensor x = random_tensor({3, 8}, r), w = random_tensor({4, 8}, r);
  Tensor y = Tensor::empty({3, 4});
  CHECK_THROWS_AS(be.linear(x, random_tensor({4, 7}, r), nullptr, y), tensor_error);
  Tensor y_wrong = Tensor::empty({3, 5});
  CHECK_THROWS_AS(be.linear(x, w, nullptr, y_wrong), tensor_error);
  Tensor bad_bias = Tensor::empty({5});
  CHECK_THROWS_AS(be.linear(x, w, &bad_bias, y), tensor_error);
  Tensor y_i32 = Tensor::empty({3, 4}, dtype::i32);
  CHECK_THROWS_AS(be.linear(x, w, nullptr, y_i32), tensor_error);
  Tensor dw_wrong = Tensor::empty({8, 4});
  CHECK_THROWS_AS(be.linear_backward(x, w, y, nullptr, dw_wrong, nullptr), tensor_error);
  Tensor c = Tensor::empty({3, 3});
  CHECK_THROWS_WITH_AS(be.gemm(x, false, w, false, c), doctest::Contains("gemm"), tensor_error);

  Tensor rn = Tensor::empty({3, 8});
  CHECK_THROWS_AS(be.rmsnorm(x, random_tensor({7}, r), 1e-5f, rn, nullptr), tensor_error);
  Tensor rstd_wrong = Tensor::empty({4});
  CHECK_THROWS_AS(be.rmsnorm(x, random_tensor({8}, r), 1e-5f, rn, &rstd_wrong), tensor_error);
  CHECK_THROWS_AS(be.layernorm(x, random_tensor({8}, r), random_tensor({9}, r), 1e-5f, rn,
                               nullptr, nullptr),
                  tensor_error);

  Tensor sum = Tensor::empty({3, 8});
  CHECK_THROWS_AS(be.add(x, random_tensor({8, 3}, r), sum), tensor_error);
  CHECK_THROWS_AS(be.swiglu(x, x, y), tensor_error);
  CHECK_THROWS_AS(be.gelu(x, y), tensor_error);

  const std::vector<std::int32_t> pos_values{0, 1, 2};
  Tensor pos = Tensor::from_i32(pos_values, {3});
  Tensor xr = x.clone();
  CHECK_THROWS_AS(be.rope(xr, pos, 1, 7, 10000.0f), tensor_error);  // odd head_dim
  CHECK_THROWS_AS(be.rope(xr, pos, 3, 2, 10000.0f), tensor_error);  // 3*2 != 8
  const std::vector<std::int32_t> neg_values{0, -1, 2};
  CHECK_THROWS_WITH_AS(be.rope(xr, Tensor::from_i32(neg_values, {3}), 2, 4, 10000.0f),
                       doctest::Contains("-1"), tensor_error);
  CHECK_THROWS_AS(be.rope(xr, x.slice(0, 3).view({-1}).slice(0, 3), 2, 4, 10000.0f),
                  tensor_error);  // f32 positions

  const std::vector<std::int32_t> bad_ids{1, 9};
  Tensor table = random_tensor({5, 8}, r), emb = Tensor::empty({2, 8});
  CHECK_THROWS_WITH_AS(be.embedding(Tensor::from_i32(bad_ids, {2}), table, emb),
                       doctest::Contains("id 9"), tensor_error);
  Tensor dtable = Tensor::zeros({5, 8});
  CHECK_THROWS_AS(be.embedding_backward(Tensor::from_i32(bad_ids, {2}), emb, dtable),
                  tensor_error);

  Tensor logits = random_tensor({2, 5}, r), losses = Tensor::empty({2});
  const std::vector<std::int32_t> out_of_range{1, 5}, minus_two{-2, 0};
  CHECK_THROWS_WITH_AS(be.cross_entropy(logits, Tensor::from_i32(out_of_range, {2}), losses,
                                        nullptr, 1.0f),
                       doctest::Contains("target 5"), tensor_error);
  CHECK_THROWS_AS(
      be.cross_entropy(logits, Tensor::from_i32(minus_two, {2}), losses, nullptr, 1.0f),
      tensor_error);

  const attention_shape gqa_bad{3, 2, 4, 0.0f};
  Tensor q = random_tensor({4, 12}, r), kv = random_tensor({4, 8}, r), o = Tensor::empty({4, 12});
  CHECK_THROWS_AS(be.attention(q, kv, kv, 1, 4, gqa_bad, o, nullptr), tensor_error);
  const attention_shape s{2, 1, 4, 0.0f};
  Tensor q2 = random_tensor({4, 8}, r), k2 = random_tensor({4, 4}, r), o2 = Tensor::empty({4, 8});
  CHECK_THROWS_AS(be.attention(q2, k2, k2, 2, 4, s, o2, nullptr), tensor_error);  // 2*4 rows
  Tensor lse_wrong = Tensor::empty({7});
  CHECK_THROWS_AS(be.attention(q2, k2, k2, 1, 4, s, o2, &lse_wrong), tensor_error);

  // a cache shorter than start_pos + Tq, and too few pages for its length
  std::vector<const void*> pages{k2.data<float>()};
  kv_pages_view short_cache{pages, pages, 4, 3};
  Tensor q1 = random_tensor({1, 8}, r), o1 = Tensor::empty({1, 8});
  CHECK_THROWS_AS(be.attention_cached(q1, short_cache, 3, s, o1), tensor_error);
  kv_pages_view few_pages{pages, pages, 4, 6};
  CHECK_THROWS_AS(be.attention_cached(q1, few_pages, 5, s, o1), tensor_error);

  Tensor p = random_tensor({10}, r), g = random_tensor({9}, r), m = Tensor::zeros({10}),
         v = Tensor::zeros({10});
  CHECK_THROWS_AS(be.adamw(p, g, m, v, adamw_params{}, 1), tensor_error);
  CHECK_THROWS_AS(be.adamw(p, p, m, v, adamw_params{}, 0), tensor_error);

  Tensor qi = Tensor::empty({10}, dtype::i8), scales = Tensor::empty({2});
  CHECK_THROWS_AS(be.quantize_int8(p, 4, qi, scales), tensor_error);  // needs 3 scales
  CHECK_THROWS_AS(be.quantize_int8(p, 0, qi, scales), tensor_error);
  CHECK_THROWS_AS(be.dequantize_int8(qi, scales, 4, p), tensor_error);
}

TEST_CASE("one thread and two threads give the same results") {
  Backend& be = cpu_backend();
  const int saved = cpu_threads();
  rng r(31);
  // Sizes above the serial work limit, so the two-thread run really forks.
  const int B = 2, T = 48, hq = 4, hkv = 2, dh = 16;
  const attention_shape s{hq, hkv, dh, 0.0f};
  const std::int64_t rows = B * T, qw = hq * dh, kw = hkv * dh, vocab = 600;
  Tensor q = random_tensor({rows, qw}, r), k = random_tensor({rows, kw}, r),
         v = random_tensor({rows, kw}, r), dout = random_tensor({rows, qw}, r);
  Tensor x = random_tensor({rows, 256}, r), w = random_tensor({256}, r),
         wl = random_tensor({vocab, 256}, r), logits = random_tensor({rows, vocab}, r, -4, 4);
  std::vector<std::int32_t> target_values(rows), pos_values(rows);
  for (std::int64_t i = 0; i < rows; ++i) {
    target_values[i] = r.integer(-1, vocab - 1);
    pos_values[i] = static_cast<std::int32_t>(i % T);
  }
  Tensor targets = Tensor::from_i32(target_values, {rows}),
         pos = Tensor::from_i32(pos_values, {rows});
  Tensor big = random_tensor({200000}, r), grads = random_tensor({200000}, r);

  struct results {
    std::vector<Tensor> exact;  // row-parallel ops: bitwise equal
    Tensor blas;                // OpenBLAS may block differently per thread count
    double sum_squares = 0.0;
  };
  auto run = [&](int threads) {
    set_cpu_threads(threads);
    CHECK(cpu_threads() == threads);
    results res;
    auto keep = [&](Tensor t) { res.exact.push_back(std::move(t)); };
    Tensor out = Tensor::empty({rows, qw}), lse = Tensor::empty({B * hq * T});
    be.attention(q, k, v, B, T, s, out, &lse);
    Tensor dq = Tensor::empty({rows, qw}), dk = Tensor::empty({rows, kw}),
           dv = Tensor::empty({rows, kw});
    be.attention_backward(q, k, v, out, lse, dout, B, T, s, dq, dk, dv);
    std::vector<const void*> pages{k.data<float>()}, vpages{v.data<float>()};
    Tensor cached = Tensor::empty({8, qw});
    be.attention_cached(q.slice(T - 8, T), kv_pages_view{pages, vpages, T, T}, T - 8, s, cached);
    Tensor y = Tensor::empty({rows, 256}), rstd = Tensor::empty({rows}),
           dx = Tensor::empty({rows, 256}), dw = Tensor::zeros({256});
    be.rmsnorm(x, w, 1e-5f, y, &rstd);
    be.rmsnorm_backward(x, w, rstd, y, dx, dw);
    Tensor roped = q.clone();
    be.rope(roped, pos, hq, dh, 10000.0f);
    Tensor losses = Tensor::empty({rows}), dlogits = Tensor::empty({rows, vocab});
    be.cross_entropy(logits, targets, losses, &dlogits, 0.01f);
    Tensor act = Tensor::empty({rows, 256});
    be.gelu(x, act);
    Tensor p = big.clone(), m = Tensor::zeros({200000}), vv = Tensor::zeros({200000});
    be.adamw(p, grads, m, vv, adamw_params{}, 1);
    Tensor dtable = Tensor::zeros({T, 256});
    be.embedding_backward(pos, x, dtable);
    for (Tensor t : {out, lse, dq, dk, dv, cached, y, rstd, dx, dw, roped, losses, dlogits, act,
                     p, m, vv, dtable})
      keep(t);
    res.blas = Tensor::empty({rows, vocab});
    be.linear(x, wl, nullptr, res.blas);
    res.sum_squares = be.sum_squares(big);
    return res;
  };
  results one = run(1), two = run(2);
  set_cpu_threads(saved);
  REQUIRE(one.exact.size() == two.exact.size());
  for (std::size_t i = 0; i < one.exact.size(); ++i) {
    CAPTURE(i);
    CHECK(same_values(one.exact[i], two.exact[i]));
  }
  check_close(two.blas, to_double(one.blas), 1e-5, 1e-5, "linear");
  CHECK(one.sum_squares == two.sum_squares);
}

TEST_CASE("set_cpu_threads rejects a count below one") {
  CHECK_THROWS_AS(set_cpu_threads(0), std::invalid_argument);
  CHECK(cpu_threads() >= 1);
}
