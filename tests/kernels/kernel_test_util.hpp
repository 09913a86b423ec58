// tests/kernels/kernel_test_util.hpp — small helpers shared by the kernel
// tests: seeded random tensors, double-precision views, finite differences
// and element-wise comparison with a readable failure report.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/tensor.hpp"

namespace kernel_test {

using corolla::dtype;
using corolla::shape_t;
using corolla::Tensor;

/// Deterministic uniform random numbers.
class rng {
 public:
  explicit rng(std::uint32_t seed) : gen_(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return std::uniform_real_distribution<float>(lo, hi)(gen_);
  }
  std::int32_t integer(std::int32_t lo, std::int32_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int32_t>(lo, hi)(gen_);
  }

 private:
  std::mt19937 gen_;
};

/// f32 tensor of `shape` with values uniform in [lo, hi).
inline Tensor random_tensor(const shape_t& shape, rng& r, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = r.uniform(lo, hi);
  return t;
}

/// f32 tensor of `shape` with every element `value` (NaN to catch outputs
/// that are read before being written).
inline Tensor filled(const shape_t& shape, float value) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  std::vector<float> f = t.to_vector();
  return {f.begin(), f.end()};
}

/// sum(out .* weights) in double: the scalar loss whose gradient with
/// respect to `out` is `weights`.
inline double weighted_sum(const Tensor& out, const Tensor& weights) {
  const float* a = out.data<float>();
  const float* b = weights.data<float>();
  REQUIRE(out.numel() == weights.numel());
  double s = 0.0;
  for (std::int64_t i = 0; i < out.numel(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

/// Central finite differences of `loss` with respect to every element of
/// `t` (perturbed in place and restored).
inline std::vector<double> numeric_grad(Tensor& t, const std::function<double()>& loss,
                                        float eps = 1e-2f) {
  float* p = t.data<float>();
  std::vector<double> g(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float saved = p[i];
    p[i] = saved + eps;
    const double up = loss();
    p[i] = saved - eps;
    const double down = loss();
    p[i] = saved;
    // the perturbation actually applied, after f32 rounding
    const double h = double(saved + eps) - double(saved - eps);
    g[static_cast<std::size_t>(i)] = (up - down) / h;
  }
  return g;
}

/// Checks |got - want| <= atol + rtol * max(|got|, |want|) element-wise and
/// reports the count and the worst offender on failure.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double rtol, double atol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what << ": sizes differ");
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    const double tol = atol + rtol * std::max(std::fabs(got[i]), std::fabs(want[i]));
    const bool ok = diff <= tol;  // false for NaN
    if (!ok) {
      ++bad;
      const double excess = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff - tol;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.size()
                               << " elements differ; worst at " << worst << ": got "
                               << (got.empty() ? 0.0 : got[worst]) << ", want "
                               << (want.empty() ? 0.0 : want[worst]));
}

inline void check_close(const Tensor& got, const std::vector<double>& want, double rtol,
                        double atol, const std::string& what) {
  check_close(to_double(got), want, rtol, atol, what);
}

/// got - offset, element-wise (to isolate what an accumulating op added).
inline std::vector<double> minus(const Tensor& got, double offset) {
  std::vector<double> d = to_double(got);
  for (double& x : d) x -= offset;
  return d;
}

/// Bitwise-equal contents.
inline bool same_values(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace kernel_test
