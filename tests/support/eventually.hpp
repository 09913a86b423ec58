// tests/support/eventually.hpp — waits for a condition that another thread
// or process makes true, bounded. The bound only limits how long a failing
// test takes: a passing one returns as soon as the condition holds, so the
// limit can (and should) be generous enough for a busy 2-core machine
// running the suite under `ctest -j2` (docs/architecture.md, "Tests").
#pragma once

#include <chrono>
#include <thread>
#include <utility>

namespace corolla::testing {

/// Polls `holds()` every `poll` until it returns true or `limit` has passed;
/// whether it held. It is asked once more at the limit, so a condition that
/// became true during the last sleep still counts.
template <class Condition>
bool eventually(Condition&& holds, std::chrono::milliseconds limit,
                std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!holds()) {
    if (std::chrono::steady_clock::now() >= deadline) return static_cast<bool>(holds());
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace corolla::testing
