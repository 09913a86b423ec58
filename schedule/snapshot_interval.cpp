#include "schedule/snapshot_interval.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace corolla::schedule {

int snapshot_interval(double copy_s, double step_s, int current, const snapshot_interval_policy& p) {
  current = std::clamp(current, 1, p.max_every);
  if (!(copy_s > 0) || !(step_s > 0) || !(p.budget > 0)) return current;
  const double need = std::ceil(copy_s / (p.budget * step_s));
  const int k = need >= p.max_every ? p.max_every : std::max(1, static_cast<int>(need));
  if (k > current) return k;
  return 2 * k <= current ? k : current;
}

double median_of(std::span<const double> xs) {
  if (xs.empty()) return 0;
  std::vector<double> v(xs.begin(), xs.end());
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double hi = v[mid];
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

}  // namespace corolla::schedule
