// apps/membw.hpp — measures this machine's memory read bandwidth, the bound
// that batch-1 decode is compared against (every weight is read once per token).
#pragma once

#include <cstddef>

namespace corolla::app {

/// Result of a read-bandwidth measurement.
struct bandwidth_result {
  double read_gbps = 0;  ///< best observed read bandwidth, GB/s (1e9 bytes)
  std::size_t bytes = 0; ///< size of the buffer swept
  int threads = 0;       ///< OpenMP threads used (the CPU backend's count)
};

/// Sweeps a `bytes`-sized buffer (much larger than the last-level cache) with
/// all CPU backend threads, reading every byte, `repeats` times; returns the
/// best sweep. Takes about repeats * bytes / bandwidth seconds. On shared
/// machines bandwidth drifts by tens of percent: callers that compare against
/// it should interleave measurements with their own runs and keep the best.
bandwidth_result measure_read_bandwidth(std::size_t bytes = std::size_t{1} << 29, int repeats = 5);

}  // namespace corolla::app
