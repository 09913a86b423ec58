// The spot checks' decisions (schedule/spot_check.hpp).
#include "schedule/spot_check.hpp"

#include <algorithm>
#include <cmath>

namespace corolla::swarm {

bool should_check(const spot_check_policy& p, int agreed, double draw) {
  return agreed < p.probation_steps || draw < p.fraction;
}

double spot_check_tolerance(const std::string& weights, bool compressed) {
  // Honest servers with the same weights differ by summation order (1e-6
  // relative), and a session whose cache keeps keys and values in bf16
  // differs from an f32 recomputation by a few 1e-3 after several blocks.
  // Quantised weights read by a decode kernel and by dequantise-and-GEMM
  // differ a little more. Int8 hidden states on the wire add up to 1/127
  // of each 4096-value block's largest value per hop. A wrong answer (noise,
  // a wrong block, stale weights) is off by tens of percent.
  double tol = (weights == "i8" || weights == "nf4") ? 0.08 : 0.04;
  if (compressed) tol += 0.05;
  return tol;
}

namespace {

/// ||a - b|| / max(||a||, ||b||) of one row; infinite for a NaN or an infinity.
double row_difference(const float* a, const float* b, std::size_t width) {
  double diff = 0, na = 0, nb = 0;
  for (std::size_t c = 0; c < width; ++c) {
    const double x = a[c], y = b[c];
    diff += (x - y) * (x - y);
    na += x * x;
    nb += y * y;
  }
  const double norm = std::max(na, nb);
  // NaN or infinity in an answer is as wrong as it gets.
  const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return std::isfinite(rel) ? rel : INFINITY;
}

}  // namespace

double relative_difference(const float* a, const float* b, std::size_t rows, std::size_t width) {
  double worst = 0;
  for (std::size_t r = 0; r < rows; ++r) worst = std::max(worst, row_difference(a + r * width, b + r * width, width));
  return worst;
}

double routing_tie(double tol) { return tol / 4; }

row_comparison compare_rows(const float* a, const float* b, std::size_t rows, std::size_t width, double tol,
                            std::span<const float> margins, double tie, std::size_t seq, bool flipped) {
  row_comparison c;
  bool apart = flipped;  // this sequence holds a row routed apart
  for (std::size_t r = 0; r < rows; ++r) {
    if (seq > 0 && r > 0 && r % seq == 0) apart = false;  // the next sequence
    const double d = row_difference(a + r * width, b + r * width, width);
    if (d <= tol) {
      c.worst = std::max(c.worst, d);
      continue;
    }
    const bool tied = r < margins.size() && margins[r] < tie;
    if (std::isfinite(d) && (tied || apart)) {
      ++c.excused;  // a near tie of the routing, here or before: honest servers may choose apart
      apart = true;
      continue;
    }
    c.agree = false;
    c.worst = std::max(c.worst, d);
  }
  return c;
}

earlier_rows compare_earlier_rows(const float* a, const float* b, std::size_t rows, std::size_t width, double tol,
                                  std::span<const float> margins, double tie) {
  if (!b) {
    for (std::size_t r = 0; r < rows && r < margins.size(); ++r)
      if (margins[r] < tie) return earlier_rows::routed_apart;
    return earlier_rows::same;
  }
  const row_comparison c = compare_rows(a, b, rows, width, tol, margins, tie);
  if (!c.agree) return earlier_rows::differ;
  return c.excused > 0 ? earlier_rows::routed_apart : earlier_rows::same;
}

spot_verdict judge(const std::vector<std::vector<bool>>& agree) {
  const std::size_t n = agree.size();
  std::size_t best = 0, best_support = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t support = 0;
    for (std::size_t j = 0; j < n; ++j) support += (i == j || agree[i][j]) ? 1 : 0;
    if (support > best_support) best = i, best_support = support;
  }
  spot_verdict v;
  if (n == 0 || 2 * best_support <= n) return v;
  v.decided = true;
  for (std::size_t j = 0; j < n; ++j)
    if (j != best && !agree[best][j]) v.wrong.push_back(j);
  return v;
}

}  // namespace corolla::swarm
