// tests/support/batcher_start.hpp — a token callback that makes concurrent
// generations through a decode batcher decode together, however late their
// threads start on a loaded machine.
#pragma once

#include <chrono>
#include <cstdint>

#include "actors/decode_batcher.hpp"
#include "model/generator.hpp"
#include "tests/support/eventually.hpp"

namespace corolla::testing {

/// Holds a generation at its first token until `n` sessions have opened in
/// `b` (at most `limit`). Without it, on a busy machine the first
/// generations can decode to the end before the last threads even open
/// theirs, and no batch holds them all. The generations that opened meanwhile
/// have their prompts queued, waiting (the gathering) for the held ones' next
/// step, so all of them run in the next batch.
inline token_callback hold_until_opened(decode_batcher& b, std::uint64_t n,
                                        std::chrono::seconds limit = std::chrono::seconds(60)) {
  return [&b, n, limit, held = false](std::int32_t) mutable {
    if (held) return;
    held = true;
    eventually([&] { return b.stats().sessions_opened >= n; }, limit, std::chrono::milliseconds(1));
  };
}

}  // namespace corolla::testing
