#include "actors/span_stats.hpp"

#include <algorithm>

namespace corolla {

const std::vector<double>& duration_histogram::bounds() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5, 5, 10};
  return b;
}

void duration_histogram::observe(double seconds) {
  const auto& b = bounds();
  const auto i = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), seconds) - b.begin());
  ++counts[i];
  sum += seconds;
  ++count;
}

}  // namespace corolla
