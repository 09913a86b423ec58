// tests/support/batcher_start.hpp — a token callback that makes concurrent
// generations through a decode batcher decode together, however late their
// threads start on a loaded machine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "actors/decode_batcher.hpp"
#include "model/generator.hpp"
#include "tests/support/eventually.hpp"

namespace corolla::testing {

/// Holds a generation at its first token until `n` sessions have opened in
/// `b` and every generation sharing this callback (`n` less the sessions
/// opened before it was made) has reached its first token too, i.e. has
/// prefilled (at most `limit`). Without it, on a busy machine the first
/// generations can decode to the end before the last threads even open
/// theirs, and no batch holds them all; waiting only for the sessions to
/// open was not enough: a thread descheduled between its open and its
/// prefill let the others run their few-millisecond steps without it (CI
/// saw max_batch 3 of 4). Released together, the held generations' next
/// steps meet in one batch.
inline token_callback hold_until_opened(decode_batcher& b, std::uint64_t n,
                                        std::chrono::seconds limit = std::chrono::seconds(60)) {
  const std::uint64_t before = b.stats().sessions_opened;
  auto arrived = std::make_shared<std::atomic<std::uint64_t>>(0);
  return [&b, n, limit, before, arrived, held = false](std::int32_t) mutable {
    if (held) return;
    held = true;
    arrived->fetch_add(1);
    eventually([&] { return b.stats().sessions_opened >= n && before + arrived->load() >= n; }, limit,
               std::chrono::milliseconds(1));
  };
}

}  // namespace corolla::testing
