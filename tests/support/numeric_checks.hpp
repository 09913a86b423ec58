// tests/support/numeric_checks.hpp — seeded random tensors, relative
// differences, and gradients checked against extrapolated central
// differences (shared by the model tests).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla::testing {

/// f32 tensor of N(0, scale) values from `seed`.
inline Tensor random_tensor(shape_t shape, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = normal(rng);
  return Tensor::from_f32(v, std::move(shape));
}

/// Largest |a - b| relative to max(1, |b|), elementwise.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]) / std::max(1.0, std::abs(static_cast<double>(y[i]))));
  return worst;
}

/// ||a - b|| / ||b||, normwise in f64 (b is the reference; 1e-30 guards a
/// zero one).
template <class A, class B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

/// Largest |a - b| elementwise.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  return worst;
}

/// Sum of a * b over all elements, in f64.
inline double dot(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

/// <grad, d> against the central difference of `loss` along a random d,
/// extrapolated (Richardson, steps h and 2h) so that neither the curvature
/// of the loss (large steps) nor fp32 rounding in the forward (small steps)
/// dominates. `target` (f32, host) is perturbed in place and restored.
inline void check_direction(const std::string& what, Tensor target, const Tensor& grad,
                            const std::function<double()>& loss, std::uint64_t seed, double h = 2e-3) {
  Tensor d = random_tensor(target.shape(), seed);
  Tensor saved = target.clone();
  float* p = target.data<float>();
  const float* dv = d.data<float>();
  const float* s = saved.data<float>();
  auto central = [&](double step) {
    for (std::int64_t i = 0; i < target.numel(); ++i) p[i] = s[i] + static_cast<float>(step) * dv[i];
    const double plus = loss();
    for (std::int64_t i = 0; i < target.numel(); ++i) p[i] = s[i] - static_cast<float>(step) * dv[i];
    const double minus = loss();
    return (plus - minus) / (2 * step);
  };
  const double numeric = (4 * central(h) - central(2 * h)) / 3;
  target.copy_from(saved);
  const double analytic = dot(grad, d);
  INFO(what << ": analytic " << analytic << ", numeric " << numeric);
  CHECK(std::abs(analytic - numeric) <= 5e-3 * std::max(1.0, std::abs(analytic)));
}

}  // namespace corolla::testing
