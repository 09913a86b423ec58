// tests/model/test_moe_routing.cpp — the host routing of a mixture of
// experts (model/moe.hpp route_rows, route_rows_backward): top-k order,
// ties, renormalisation, the counting sort of rows by expert, bad input, and
// the routing weights' backward against finite differences.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/moe.hpp"
#include "tests/model/moe_test_util.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::moe_test;
using corolla::testing::random_tensor;

TEST_CASE("route_rows picks the top-k experts largest first with their softmax probabilities") {
  // One row: experts 1 (2.0) and 3 (1.5) of four.
  moe_routing r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 2, false);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 3});
  const std::vector<double> p = reference_weights({0.1, 2.0, -1.0, 1.5}, {0, 1, 2, 3}, false);
  for (int e = 0; e < 4; ++e) CHECK(r.probs[static_cast<std::size_t>(e)] == doctest::Approx(p[static_cast<std::size_t>(e)]).epsilon(1e-6));
  CHECK(r.weights_host.data<float>()[0] == doctest::Approx(p[1]).epsilon(1e-6));
  CHECK(r.weights_host.data<float>()[1] == doctest::Approx(p[3]).epsilon(1e-6));
  CHECK_FALSE(r.renormalised);
  // Renormalised: the same experts, weights p / (p1 + p3), summing to 1.
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 2, true);
  CHECK(r.renormalised);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 3});
  CHECK(r.weights_host.data<float>()[0] == doctest::Approx(p[1] / (p[1] + p[3])).epsilon(1e-6));
  CHECK(r.weights_host.data<float>()[1] == doctest::Approx(p[3] / (p[1] + p[3])).epsilon(1e-6));
  // Top-3, and k == E (every expert, by probability).
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 3, false);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 3, 0});
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 4, true);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 3, 0, 2});
  float sum = 0;
  for (int j = 0; j < 4; ++j) sum += r.weights_host.data<float>()[j];
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
  // Top-1 renormalised is weight 1 exactly.
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 1, true);
  CHECK(r.chosen == std::vector<std::int32_t>{1});
  CHECK(r.weights_host.data<float>()[0] == 1.0f);
  // Softmax is shift-invariant, also for large logits (no overflow).
  r = routed({1000.1f, 1002.0f, 999.0f, 1001.5f}, 1, 4, 2, false);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 3});
  CHECK(r.weights_host.data<float>()[0] == doctest::Approx(p[1]).epsilon(1e-4));
}

TEST_CASE("route_rows breaks ties towards the lower expert index") {
  moe_routing r = routed({1.0f, 1.0f, 1.0f, 0.0f}, 1, 4, 2, true);
  CHECK(r.chosen == std::vector<std::int32_t>{0, 1});
  CHECK(r.weights_host.data<float>()[0] == 0.5f);
  CHECK(r.weights_host.data<float>()[1] == 0.5f);
  r = routed({0.0f, 2.0f, 2.0f, 2.0f}, 1, 4, 2, false);
  CHECK(r.chosen == std::vector<std::int32_t>{1, 2});
  r = routed({-1.0f, 0.5f, 3.0f, 3.0f}, 1, 4, 1, false);
  CHECK(r.chosen == std::vector<std::int32_t>{2});
  r = routed({5.0f, 0.5f, 5.0f, 0.5f}, 1, 4, 3, false);
  CHECK(r.chosen == std::vector<std::int32_t>{0, 2, 1});
  // All equal: experts 0..k-1, uniform weights.
  r = routed(std::vector<float>(8, 0.25f), 1, 8, 3, false);
  CHECK(r.chosen == std::vector<std::int32_t>{0, 1, 2});
  for (int j = 0; j < 3; ++j) CHECK(r.weights_host.data<float>()[j] == doctest::Approx(0.125).epsilon(1e-6));
}

TEST_CASE("route_rows sorts rows by expert: offsets, slots and sorted rows agree") {
  // A hand-checked case: 3 rows, 3 experts, top-2.
  //   row 0: experts 2, 0   row 1: experts 0, 1   row 2: experts 2, 1
  moe_routing r = routed({1.0f, -1.0f, 2.0f, 3.0f, 2.0f, 0.0f, -1.0f, 0.5f, 1.0f}, 3, 3, 2, true);
  CHECK(r.chosen == std::vector<std::int32_t>{2, 0, 0, 1, 2, 1});
  CHECK(r.offsets == std::vector<std::int64_t>{0, 2, 4, 6});
  // Expert 0 gets rows 0, 1; expert 1 rows 1, 2; expert 2 rows 0, 2.
  CHECK(ints(r.sorted_rows) == std::vector<std::int32_t>{0, 1, 1, 2, 0, 2});
  CHECK(ints(r.slots) == std::vector<std::int32_t>{4, 0, 1, 2, 5, 3});
  check_routing_consistent(r, 3, 3, 2);
  for (std::int64_t t = 0; t < 3; ++t)
    CHECK(r.weights_host.data<float>()[2 * t] + r.weights_host.data<float>()[2 * t + 1] ==
          doctest::Approx(1.0).epsilon(1e-6));

  // Many random rows, several shapes; the same routing reused for fewer rows
  // (its buffers regrown) stays consistent.
  moe_routing reused;
  for (auto [n, e, k] : {std::tuple<std::int64_t, int, int>{100, 8, 3}, {37, 4, 2}, {1, 8, 2}, {5, 3, 3}, {64, 6, 1}}) {
    CAPTURE(n);
    CAPTURE(e);
    CAPTURE(k);
    for (bool renorm : {false, true}) {
      const std::vector<float> logits = logits_with_margin(n, e, 1, 0.0, 7 + static_cast<std::uint64_t>(n));
      reused.logits = Tensor::from_f32(logits, {n, e});
      route_rows(k, renorm, reused);
      check_routing_consistent(reused, n, e, k);
      const float* w = reused.weights_host.data<float>();
      for (std::int64_t t = 0; t < n; ++t) {
        std::vector<double> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
        std::vector<int> chosen(reused.chosen.begin() + t * k, reused.chosen.begin() + (t + 1) * k);
        const std::vector<double> want = reference_weights(row, chosen, renorm);
        double sum = 0;
        for (int j = 0; j < k; ++j) {
          CHECK(w[t * k + j] == doctest::Approx(want[static_cast<std::size_t>(j)]).epsilon(1e-5));
          sum += w[t * k + j];
        }
        if (renorm) CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("route_rows rejects k outside [1, E] and logits that are not host f32 [N, E]") {
  moe_routing r;
  r.logits = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK_THROWS_WITH_AS(route_rows(4, true, r), doctest::Contains("4 experts per row of 3"), tensor_error);
  CHECK_THROWS_AS(route_rows(0, true, r), tensor_error);
  r.logits = Tensor::from_f32(std::vector<float>{1, 2, 3}, {3});
  CHECK_THROWS_AS(route_rows(1, true, r), tensor_error);
  r.logits = Tensor::from_i32(std::vector<std::int32_t>{1, 2, 3, 4}, {2, 2});
  CHECK_THROWS_AS(route_rows(1, true, r), tensor_error);
  r.logits = Tensor();
  CHECK_THROWS_AS(route_rows(1, true, r), tensor_error);
  // route_rows_backward checks its shapes.
  r = routed({1, 2, 3, 4, 5, 6}, 2, 3, 2, true);
  Tensor dw = Tensor::zeros({2, 2}), dl = Tensor::empty({2, 3});
  Tensor dw_wrong = Tensor::zeros({2, 3}), dl_wrong = Tensor::empty({3, 2});
  CHECK_THROWS_AS(route_rows_backward(r, dw_wrong, dl), tensor_error);
  CHECK_THROWS_AS(route_rows_backward(r, dw, dl_wrong), tensor_error);
}

TEST_CASE("route_rows_backward is the gradient of the routing weights by the logits (finite differences)") {
  const std::int64_t n = 12;
  for (auto [e, k] : {std::pair{4, 2}, {8, 3}, {4, 1}, {5, 5}}) {
    for (bool renorm : {false, true}) {
      CAPTURE(e);
      CAPTURE(k);
      CAPTURE(renorm);
      // Away from ties: the k-th and (k+1)-th logits at least 0.05 apart.
      const std::vector<float> logits = logits_with_margin(n, e, k, 0.05, 31 + static_cast<std::uint64_t>(e * 10 + k));
      moe_routing r = routed(logits, n, e, k, renorm);
      const Tensor dw = random_tensor({n, k}, 41);
      Tensor dl = Tensor::empty({n, e});
      route_rows_backward(r, dw, dl);
      const float* g = dw.data<float>();
      const float* got = dl.data<float>();
      // L = sum_j dw_j w_j(logits), differentiated in double (the chosen
      // experts held fixed: a 1e-6 step moves no logit past a 0.05 margin).
      double worst = 0, biggest = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        const std::vector<int> chosen(r.chosen.begin() + t * k, r.chosen.begin() + (t + 1) * k);
        const std::vector<double> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
        auto loss = [&](const std::vector<double>& l) {
          const std::vector<double> w = reference_weights(l, chosen, renorm);
          double s = 0;
          for (int j = 0; j < k; ++j) s += g[t * k + j] * w[static_cast<std::size_t>(j)];
          return s;
        };
        for (int x = 0; x < e; ++x) {
          const double step = 1e-6;
          std::vector<double> up = row, down = row;
          up[static_cast<std::size_t>(x)] += step;
          down[static_cast<std::size_t>(x)] -= step;
          const double numeric = (loss(up) - loss(down)) / (2 * step);
          worst = std::max(worst, std::abs(numeric - got[t * e + x]));
          biggest = std::max(biggest, std::abs(numeric));
          // Renormalised weights do not depend on the experts left out.
          const bool chosen_x = std::find(chosen.begin(), chosen.end(), x) != chosen.end();
          if (renorm && !chosen_x) CHECK(std::abs(got[t * e + x]) < 1e-7);
        }
      }
      INFO("largest difference " << worst << " of gradients up to " << biggest);
      CHECK(worst < 2e-6);
      if (k == 1 && renorm)
        CHECK(biggest < 1e-9);  // the one weight is 1 whatever the logits
      else
        CHECK(biggest > 1e-2);  // the check has teeth
      // Every row's logit gradients sum to zero (softmax is shift-invariant).
      for (std::int64_t t = 0; t < n; ++t) {
        double s = 0;
        for (int x = 0; x < e; ++x) s += got[t * e + x];
        CHECK(std::abs(s) < 1e-6);
      }
    }
  }
}

TEST_CASE("routing_margin: the gap between the k-th and the next router logit, relative to the logits' spread") {
  // Row 0: logits 0.1, 2.0, -1.0, 1.5 (spread 3.0); top-2 is {1, 3}, the
  // next is expert 0: (1.5 - 0.1) / 3. Row 1: experts 0 and 2 tie for the
  // second place: 0. Row 2: all equal: 0.
  moe_routing r = routed({0.1f, 2.0f, -1.0f, 1.5f, 1.0f, 3.0f, 1.0f, -2.0f, 0.5f, 0.5f, 0.5f, 0.5f}, 3, 4, 2, true);
  CHECK(routing_margin(r, 0) == doctest::Approx(1.4 / 3.0).epsilon(1e-6));
  CHECK(routing_margin(r, 1) == 0.0f);
  CHECK(routing_margin(r, 2) == 0.0f);
  // Top-1: the gap to the second largest. k == E: no other choice.
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 1, false);
  CHECK(routing_margin(r, 0) == doctest::Approx(0.5 / 3.0).epsilon(1e-6));
  r = routed({0.1f, 2.0f, -1.0f, 1.5f}, 1, 4, 4, false);
  CHECK(std::isinf(routing_margin(r, 0)));
  // Random rows: the margin is how far the logits may move before the
  // choice changes. Moving the k-th and the next one towards each other by
  // less than half of it keeps the experts; by more, it does not.
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::vector<float> l = logits_with_margin(1, 6, 1, 0.0, seed);
    r = routed(l, 1, 6, 3, false);
    const float m = routing_margin(r, 0);
    REQUIRE(m > 0);
    const float spread = *std::max_element(l.begin(), l.end()) - *std::min_element(l.begin(), l.end());
    const std::int32_t kth = r.chosen[2];
    int next = -1;
    for (int e = 0; e < 6; ++e)
      if (std::find(r.chosen.begin(), r.chosen.end(), e) == r.chosen.end() && (next < 0 || l[e] > l[next])) next = e;
    for (double f : {0.45, 0.55}) {
      std::vector<float> moved = l;
      moved[kth] -= static_cast<float>(f * m * spread);
      moved[next] += static_cast<float>(f * m * spread);
      const moe_routing again = routed(moved, 1, 6, 3, false);
      std::vector<std::int32_t> a(r.chosen.begin(), r.chosen.end()), b(again.chosen.begin(), again.chosen.end());
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      CHECK((a == b) == (f < 0.5));
    }
  }
}
