// apps/bench_timing.hpp — how the benches time a piece of work on a backend.
#pragma once

#include <chrono>

#include "kernels/backend.hpp"

namespace corolla::app {

/// Calls f, untimed in the result, until a call takes no more than 1.5x
/// the one before it (at most 5 calls, at least 2): a process's first calls
/// can stall for longer than the op (on the cpu its thread pools starting,
/// 20 ms a call, 2026-12-03; on a device code loading and clocks ramping),
/// and one warm-up call did not always absorb it.
template <class F>
void warm_up(Backend& be, F&& f) {
  double before = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0 && s <= 1.5 * before) return;
    before = s;
  }
}

/// Seconds per call of f: warm_up, then the best of `rounds` rounds of
/// `calls` calls and one synchronisation of `be` (a device's queued work
/// counts).
template <class F>
double best_seconds(Backend& be, int rounds, int calls, F&& f) {
  warm_up(be, f);
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
