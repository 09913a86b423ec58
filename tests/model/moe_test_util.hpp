// tests/model/moe_test_util.hpp — what the mixture-of-experts tests share:
// routing a few rows by hand, HF's routing weights in double, every
// consistency property of a routing, and logits whose top-k margins are not
// tiny (so finite differences do not cross a change of experts).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/moe.hpp"

namespace corolla::moe_test {

// ---- routing ------------------------------------------------------------------

inline moe_routing routed(const std::vector<float>& logits, std::int64_t n, int e, int k, bool renormalise) {
  moe_routing r;
  r.logits = Tensor::from_f32(logits, {n, e});
  route_rows(k, renormalise, r);
  return r;
}

inline std::vector<std::int32_t> ints(const Tensor& t) {
  const std::int32_t* p = t.data<std::int32_t>();
  return {p, p + t.numel()};
}

/// The routing weights of one row as HF computes them, in double, for a
/// given choice of experts: softmax over all logits, then the chosen
/// probabilities, divided by their sum when renormalised.
inline std::vector<double> reference_weights(const std::vector<double>& logits, const std::vector<int>& chosen,
                                      bool renormalise) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double l : logits) z += std::exp(l - top);
  std::vector<double> w;
  double s = 0;
  for (int e : chosen) {
    w.push_back(std::exp(logits[static_cast<std::size_t>(e)] - top) / z);
    s += w.back();
  }
  if (renormalise)
    for (double& x : w) x /= s;
  return w;
}

/// Every consistency property of a routing of n rows to e experts, k each.
inline void check_routing_consistent(const moe_routing& r, std::int64_t n, int e, int k) {
  const std::int64_t m = n * k;
  REQUIRE(r.rows == n);
  REQUIRE(r.k == k);
  REQUIRE(r.experts == e);
  REQUIRE(r.chosen.size() == static_cast<std::size_t>(m));
  REQUIRE(r.offsets.size() == static_cast<std::size_t>(e) + 1);
  CHECK(r.slots.shape() == shape_t{n, k});
  CHECK(r.sorted_rows.shape() == shape_t{m});
  CHECK(r.weights_host.shape() == shape_t{n, k});
  CHECK(r.row_weights_host.shape() == shape_t{m});
  CHECK(r.offsets.front() == 0);
  CHECK(r.offsets.back() == m);
  // Offsets count the rows of each expert.
  std::vector<std::int64_t> count(static_cast<std::size_t>(e), 0);
  for (std::int32_t x : r.chosen) {
    REQUIRE(x >= 0);
    REQUIRE(x < e);
    ++count[static_cast<std::size_t>(x)];
  }
  for (int x = 0; x < e; ++x) CHECK(r.offsets[x + 1] - r.offsets[x] == count[static_cast<std::size_t>(x)]);
  const std::vector<std::int32_t> slots = ints(r.slots), sorted = ints(r.sorted_rows);
  const float* w = r.weights_host.data<float>();
  const float* row_w = r.row_weights_host.data<float>();
  std::vector<int> seen(static_cast<std::size_t>(m), 0);
  for (std::int64_t t = 0; t < n; ++t) {
    std::vector<std::int32_t> experts;
    for (int j = 0; j < k; ++j) {
      const std::int64_t i = t * k + j;
      const std::int32_t x = r.chosen[static_cast<std::size_t>(i)], at = slots[static_cast<std::size_t>(i)];
      REQUIRE(at >= 0);
      REQUIRE(at < m);
      ++seen[static_cast<std::size_t>(at)];
      // The slot lies in its expert's range and holds this row, with this weight.
      CHECK(at >= r.offsets[x]);
      CHECK(at < r.offsets[x + 1]);
      CHECK(sorted[static_cast<std::size_t>(at)] == t);
      CHECK(row_w[at] == w[i]);
      experts.push_back(x);
    }
    // k distinct experts per row, largest probability first.
    std::sort(experts.begin(), experts.end());
    CHECK(std::adjacent_find(experts.begin(), experts.end()) == experts.end());
    const float* p = r.probs.data() + t * e;
    for (int j = 1; j < k; ++j) CHECK(p[r.chosen[t * k + j - 1]] >= p[r.chosen[t * k + j]]);
    // No expert left out beats a chosen one.
    const float kth = p[r.chosen[t * k + k - 1]];
    for (int x = 0; x < e; ++x)
      if (std::find(experts.begin(), experts.end(), x) == experts.end()) CHECK(p[x] <= kth);
  }
  // The slots are a permutation of the sorted rows.
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  // Within an expert, rows keep their order (a stable sort).
  for (int x = 0; x < e; ++x)
    for (std::int64_t i = r.offsets[x] + 1; i < r.offsets[x + 1]; ++i)
      CHECK(sorted[static_cast<std::size_t>(i - 1)] <= sorted[static_cast<std::size_t>(i)]);
}

/// Logits [n, e] from N(0, scale), redrawn row by row until the k-th and
/// (k+1)-th largest of each row are at least `margin` apart.
inline std::vector<float> logits_with_margin(std::int64_t n, int e, int k, double margin, std::uint64_t seed,
                                      float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out;
  for (std::int64_t t = 0; t < n; ++t) {
    std::vector<float> row(static_cast<std::size_t>(e));
    for (;;) {
      for (float& x : row) x = normal(rng);
      std::vector<float> sorted = row;
      std::sort(sorted.rbegin(), sorted.rend());
      if (k == e || sorted[static_cast<std::size_t>(k - 1)] - sorted[static_cast<std::size_t>(k)] >= margin) break;
    }
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}


}  // namespace corolla::moe_test
