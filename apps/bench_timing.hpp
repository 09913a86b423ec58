// apps/bench_timing.hpp — how the benches time a piece of work on a backend.
#pragma once

#include <chrono>

#include "kernels/backend.hpp"

namespace corolla::app {

/// Seconds per call of f: one warm-up call, then the best of `rounds` rounds
/// of `calls` calls and one synchronisation of `be` (a device's queued work
/// counts).
template <class F>
double best_seconds(Backend& be, int rounds, int calls, F&& f) {
  f();
  be.synchronize();
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) f();
    be.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    if (r == 0 || s < best) best = s;
  }
  return best;
}

}  // namespace corolla::app
