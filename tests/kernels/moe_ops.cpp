// tests/kernels/moe_ops.cpp — the CPU backend's mixture-of-experts row
// moves (moe_gather, moe_combine, moe_combine_weight_grad) against naive
// loops in double, the same with one thread as with two, and their bad
// inputs (indices out of range, shapes, dtypes, aliasing) as tensor_error.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"

using namespace corolla;
using namespace kernel_test;

namespace {

/// i32 host tensor of `shape` with values uniform in [0, limit).
Tensor random_indices(const shape_t& shape, std::int32_t limit, rng& r) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = r.integer(0, limit - 1);
  return Tensor::from_i32(v, shape);
}

/// out[r,:] = src[rows[r],:] * (weights ? weights[r] : 1).
std::vector<double> naive_gather(const Tensor& src, const Tensor& rows, const Tensor* weights) {
  const std::int64_t d = src.dim(1), m = rows.dim(0);
  const std::vector<double> s = to_double(src);
  const std::int32_t* idx = rows.data<std::int32_t>();
  std::vector<double> out(static_cast<std::size_t>(m * d));
  for (std::int64_t i = 0; i < m; ++i) {
    const double w = weights ? weights->data<float>()[i] : 1.0;
    for (std::int64_t c = 0; c < d; ++c)
      out[static_cast<std::size_t>(i * d + c)] = s[static_cast<std::size_t>(idx[i] * d + c)] * w;
  }
  return out;
}

/// out[t,:] = init[t,:] + sum_j weights[t,j] * src[slots[t,j],:] (init: zeros when null).
std::vector<double> naive_combine(const Tensor& src, const Tensor& slots, const Tensor* weights,
                                  const std::vector<double>* init) {
  const std::int64_t d = src.dim(1), n = slots.dim(0), k = slots.dim(1);
  const std::vector<double> s = to_double(src);
  const std::int32_t* sl = slots.data<std::int32_t>();
  std::vector<double> out = init ? *init : std::vector<double>(static_cast<std::size_t>(n * d), 0.0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      const double w = weights ? weights->data<float>()[t * k + j] : 1.0;
      for (std::int64_t c = 0; c < d; ++c)
        out[static_cast<std::size_t>(t * d + c)] += w * s[static_cast<std::size_t>(sl[t * k + j] * d + c)];
    }
  return out;
}

/// dweights[t,j] = dot(dy[t,:], src[slots[t,j],:]).
std::vector<double> naive_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots) {
  const std::int64_t d = src.dim(1), n = slots.dim(0), k = slots.dim(1);
  const std::vector<double> g = to_double(dy), s = to_double(src);
  const std::int32_t* sl = slots.data<std::int32_t>();
  std::vector<double> out(static_cast<std::size_t>(n * k), 0.0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < k; ++j)
      for (std::int64_t c = 0; c < d; ++c)
        out[static_cast<std::size_t>(t * k + j)] +=
            g[static_cast<std::size_t>(t * d + c)] * s[static_cast<std::size_t>(sl[t * k + j] * d + c)];
  return out;
}

}  // namespace

TEST_CASE("moe_gather copies (and scales) the listed rows, repeated rows included") {
  Backend& be = cpu_backend();
  rng r(51);
  // Small (serial) and large (parallel) shapes; rows may repeat and skip.
  for (auto [n, d, m] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{5, 7, 9}, {300, 96, 1200}}) {
    CAPTURE(m);
    const Tensor src = random_tensor({n, d}, r);
    const Tensor rows = random_indices({m}, static_cast<std::int32_t>(n), r);
    const Tensor weights = random_tensor({m}, r);
    Tensor out = filled({m, d}, NAN);  // every element is written
    be.moe_gather(src, rows, nullptr, out);
    check_close(out, naive_gather(src, rows, nullptr), 0.0, 0.0, "moe_gather, no weights");  // a copy: exact
    out = filled({m, d}, NAN);
    be.moe_gather(src, rows, &weights, out);
    check_close(out, naive_gather(src, rows, &weights), 1e-6, 1e-7, "moe_gather, weighted");
  }
  // No rows at all is fine.
  Tensor none = Tensor::empty({0, 4});
  be.moe_gather(random_tensor({3, 4}, r), Tensor::from_i32(std::vector<std::int32_t>{}, {0}), nullptr, none);
}

TEST_CASE("moe_combine sums each row's k slots, weighted or not, overwriting or accumulating") {
  Backend& be = cpu_backend();
  rng r(52);
  for (auto [n, k, d] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{6, 2, 5}, {7, 1, 3}, {256, 3, 128}}) {
    CAPTURE(n);
    CAPTURE(k);
    const std::int64_t m = n * k;
    const Tensor src = random_tensor({m, d}, r);
    const Tensor slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
    const Tensor weights = random_tensor({n, k}, r);
    for (const Tensor* w : {static_cast<const Tensor*>(nullptr), &weights}) {
      CAPTURE(w != nullptr);
      Tensor out = filled({n, d}, NAN);  // not read when not accumulating
      be.moe_combine(src, slots, w, false, out);
      check_close(out, naive_combine(src, slots, w, nullptr), 1e-5, 1e-6, "moe_combine");
      const Tensor before = random_tensor({n, d}, r);
      const std::vector<double> init = to_double(before);
      out = before.clone();
      be.moe_combine(src, slots, w, true, out);
      check_close(out, naive_combine(src, slots, w, &init), 1e-5, 1e-6, "moe_combine, accumulating");
    }
  }
  // A permutation with k = 1 and no weights is an exact scatter back.
  const Tensor src = random_tensor({4, 3}, r);
  const Tensor perm = Tensor::from_i32(std::vector<std::int32_t>{2, 0, 3, 1}, {4, 1});
  Tensor out = filled({4, 3}, NAN);
  be.moe_combine(src, perm, nullptr, false, out);
  const std::vector<float> s = src.to_vector(), o = out.to_vector();
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 3; ++c) CHECK(o[t * 3 + c] == s[perm.data<std::int32_t>()[t] * 3 + c]);
}

TEST_CASE("moe_combine_weight_grad is each slot's dot product with its row's gradient") {
  Backend& be = cpu_backend();
  rng r(53);
  for (auto [n, k, d] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{6, 2, 5}, {200, 2, 160}}) {
    CAPTURE(n);
    const std::int64_t m = n * k;
    const Tensor src = random_tensor({m, d}, r), dy = random_tensor({n, d}, r);
    const Tensor slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
    Tensor dw = filled({n, k}, NAN);
    be.moe_combine_weight_grad(dy, src, slots, dw);
    check_close(dw, naive_weight_grad(dy, src, slots), 1e-5, 1e-6, "moe_combine_weight_grad");
  }
  // It is the gradient of moe_combine's weights: L = sum(out * dy).
  const std::int64_t n = 5, k = 2, d = 4, m = n * k;
  const Tensor src = random_tensor({m, d}, r), dy = random_tensor({n, d}, r);
  const Tensor slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
  Tensor weights = random_tensor({n, k}, r);
  Tensor dw = Tensor::empty({n, k});
  be.moe_combine_weight_grad(dy, src, slots, dw);
  const std::vector<double> numeric = numeric_grad(weights, [&] {
    Tensor out = Tensor::empty({n, d});
    be.moe_combine(src, slots, &weights, false, out);
    return weighted_sum(out, dy);
  });
  check_close(dw, numeric, 1e-3, 1e-4, "moe_combine_weight_grad vs finite differences");
}

TEST_CASE("moe ops give the same results with one thread as with two") {
  Backend& be = cpu_backend();
  const int saved = cpu_threads();
  rng r(54);
  const std::int64_t n = 512, k = 2, d = 128, m = n * k;  // above the serial work limit
  const Tensor x = random_tensor({n, d}, r), dy = random_tensor({n, d}, r), ys = random_tensor({m, d}, r);
  const Tensor rows = random_indices({m}, static_cast<std::int32_t>(n), r);
  const Tensor slots = random_indices({n, k}, static_cast<std::int32_t>(m), r);
  const Tensor rw = random_tensor({m}, r), w = random_tensor({n, k}, r);
  auto run = [&](int threads) {
    set_cpu_threads(threads);
    std::vector<Tensor> out{Tensor::empty({m, d}), Tensor::empty({n, d}), Tensor::empty({n, k})};
    be.moe_gather(x, rows, &rw, out[0]);
    be.moe_combine(ys, slots, &w, false, out[1]);
    be.moe_combine_weight_grad(dy, ys, slots, out[2]);
    return out;
  };
  const auto one = run(1), two = run(2);
  set_cpu_threads(saved);
  for (std::size_t i = 0; i < one.size(); ++i) CHECK(same_values(one[i], two[i]));
}

TEST_CASE("moe ops reject indices out of range, bad shapes and dtypes, and aliasing with tensor_error") {
  Backend& be = cpu_backend();
  rng r(55);
  const Tensor src = random_tensor({4, 3}, r);
  Tensor out = Tensor::empty({3, 3});
  // moe_gather: every row must be in [0, N).
  CHECK_THROWS_WITH_AS(be.moe_gather(src, Tensor::from_i32(std::vector<std::int32_t>{0, 4, 1}, {3}), nullptr, out),
                       doctest::Contains("index 4 at position 1 is outside [0, 4)"), tensor_error);
  CHECK_THROWS_WITH_AS(be.moe_gather(src, Tensor::from_i32(std::vector<std::int32_t>{0, 1, -1}, {3}), nullptr, out),
                       doctest::Contains("index -1"), tensor_error);
  const Tensor rows = Tensor::from_i32(std::vector<std::int32_t>{0, 1, 2}, {3});
  Tensor out_wrong = Tensor::empty({2, 3});
  CHECK_THROWS_AS(be.moe_gather(src, rows, nullptr, out_wrong), tensor_error);
  const Tensor w_wrong = Tensor::empty({4});
  CHECK_THROWS_AS(be.moe_gather(src, rows, &w_wrong, out), tensor_error);
  CHECK_THROWS_AS(be.moe_gather(src, rows.view({3, 1}), nullptr, out), tensor_error);  // rows must be 1-D
  CHECK_THROWS_AS(be.moe_gather(src, random_tensor({3}, r), nullptr, out), tensor_error);  // f32 rows
  CHECK_THROWS_AS(be.moe_gather(src.view({12}), rows, nullptr, out), tensor_error);  // 1-D src

  // moe_combine: every slot must be in [0, M).
  const Tensor ys = random_tensor({6, 3}, r);
  Tensor combined = Tensor::empty({3, 3});
  const Tensor slots = Tensor::from_i32(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}, {3, 2});
  const Tensor bad_slots = Tensor::from_i32(std::vector<std::int32_t>{0, 1, 2, 6, 4, 5}, {3, 2});
  CHECK_THROWS_WITH_AS(be.moe_combine(ys, bad_slots, nullptr, false, combined),
                       doctest::Contains("index 6 at position 3 is outside [0, 6)"), tensor_error);
  const Tensor neg_slots = Tensor::from_i32(std::vector<std::int32_t>{0, 1, 2, 3, -2, 5}, {3, 2});
  CHECK_THROWS_WITH_AS(be.moe_combine(ys, neg_slots, nullptr, true, combined), doctest::Contains("index -2"),
                       tensor_error);
  CHECK_THROWS_AS(be.moe_combine(ys, slots.view({6}), nullptr, false, combined), tensor_error);  // slots 2-D
  Tensor combined_wrong = Tensor::empty({3, 4});
  CHECK_THROWS_AS(be.moe_combine(ys, slots, nullptr, false, combined_wrong), tensor_error);
  const Tensor weights_wrong = Tensor::empty({2, 3});
  CHECK_THROWS_AS(be.moe_combine(ys, slots, &weights_wrong, false, combined), tensor_error);
  Tensor alias = random_tensor({3, 3}, r);
  const Tensor alias_slots = Tensor::from_i32(std::vector<std::int32_t>{0, 1, 2}, {3, 1});
  CHECK_THROWS_WITH_AS(be.moe_combine(alias, alias_slots, nullptr, false, alias), doctest::Contains("alias"),
                       tensor_error);
  // A failed call writes nothing.
  Tensor untouched = filled({3, 3}, 7.0f);
  CHECK_THROWS_AS(be.moe_combine(ys, bad_slots, nullptr, false, untouched), tensor_error);
  for (float v : untouched.to_vector()) CHECK(v == 7.0f);

  // moe_combine_weight_grad: the same slot checks, and dy / dweights shapes.
  const Tensor dy = random_tensor({3, 3}, r);
  Tensor dw = Tensor::empty({3, 2});
  CHECK_THROWS_WITH_AS(be.moe_combine_weight_grad(dy, ys, bad_slots, dw), doctest::Contains("index 6"),
                       tensor_error);
  CHECK_THROWS_AS(be.moe_combine_weight_grad(random_tensor({2, 3}, r), ys, slots, dw), tensor_error);
  Tensor dw_wrong = Tensor::empty({3, 1});
  CHECK_THROWS_AS(be.moe_combine_weight_grad(dy, ys, slots, dw_wrong), tensor_error);
  Tensor dw_i32 = Tensor::empty({3, 2}, dtype::i32);
  CHECK_THROWS_AS(be.moe_combine_weight_grad(dy, ys, slots, dw_i32), tensor_error);
}
