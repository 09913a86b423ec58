// The swarm engine's prefix board (api/swarm_prefix_board.hpp): a prompt
// starts on the running session holding the most of it (a page at least),
// waits for a running one still computing a page more of it, and stops
// waiting once that one's prompt is computed, withdrawn, or the wait is up.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "api/swarm_prefix_board.hpp"

using namespace std::chrono_literals;

namespace corolla::api {
namespace {

/// `shared` tokens counting from `base`, then `own` tokens of its own (from `seed`).
std::vector<std::int32_t> prompt_of(int shared, int own, int seed, int base = 1000) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < shared; ++i) p.push_back(base + i);
  for (int i = 0; i < own; ++i) p.push_back(seed * 100 + i);
  return p;
}

/// What a request's session on one server holds: `tokens` positions.
swarm_prefix held(const std::string& session, std::int64_t tokens) {
  swarm_prefix p;
  p.tokens = tokens;
  p.hops.push_back({swarm::route_hop{}, session, {}});
  return p;
}

}  // namespace

TEST_CASE("the prefix board starts a prompt on the running session holding the most of it, a page at least") {
  swarm_prefix_board board(16, 50ms);
  const auto a = prompt_of(32, 8, 1);
  CHECK(board.enter("a", a).empty());
  board.computed("a", held("a.0", 40));
  // 32 tokens in common with a: on a's session, cut to them.
  const swarm_prefix b = board.enter("b", prompt_of(32, 6, 2));
  CHECK(b.tokens == 32);
  REQUIRE(b.hops.size() == 1u);
  CHECK(b.hops[0].session == "a.0");
  board.computed("b", held("b.0", 38));
  // The same prompt as a: all of it but its last token (its logits are the
  // first sample's).
  CHECK(board.enter("c", a).tokens == 39);
  board.computed("c", held("c.0", 40));
  // Under a page in common: computed, not tied to another's route.
  CHECK(board.enter("d", prompt_of(10, 20, 4)).empty());
  board.computed("d", held("d.0", 30));
  // A session that left is nobody's start; one still running is.
  board.leave("a");
  board.leave("c");
  const swarm_prefix e = board.enter("e", a);
  CHECK(e.tokens == 32);
  CHECK(e.hops.at(0).session == "b.0");
  // A session whose prompt was withdrawn (its generation ended) neither.
  board.computed("b", {});
  board.leave("e");  // (else f would wait for e, computing the same prompt)
  CHECK(board.enter("f", a).empty());
  const prefix_board_stats s = board.stats();
  CHECK(s.shared_sessions == 3);
  CHECK(s.shared_tokens == 32 + 39 + 32);
  CHECK(s.waits == 0);
}

TEST_CASE("a prompt waits for a running one still computing a page more of it, until it is computed, withdrawn or the wait is up") {
  swarm_prefix_board board(16, 60s);
  const auto p = prompt_of(48, 4, 1);
  CHECK(board.enter("a", p).empty());
  // b begins as a does for 48 tokens, which a is computing: b waits.
  auto b = std::async(std::launch::async, [&] { return board.enter("b", prompt_of(48, 2, 2)); });
  CHECK(b.wait_for(100ms) == std::future_status::timeout);
  board.computed("a", held("a.0", 52));
  REQUIRE(b.wait_for(30s) == std::future_status::ready);
  CHECK(b.get().tokens == 48);
  CHECK(board.stats().waits == 1);

  // Withdrawn before its prompt was computed (its generation failed): the
  // waiting one computes its own.
  const auto q = prompt_of(20, 30, 3, 5000);
  CHECK(board.enter("x", q).empty());
  auto y = std::async(std::launch::async, [&] { return board.enter("y", q); });
  CHECK(y.wait_for(100ms) == std::future_status::timeout);
  board.computed("x", {});
  REQUIRE(y.wait_for(30s) == std::future_status::ready);
  CHECK(y.get().empty());
  CHECK(board.stats().waits == 2);

  // A wait ends when the board's time is up.
  swarm_prefix_board quick(16, 100ms);
  CHECK(quick.enter("r", q).empty());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(quick.enter("s", q).empty());
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  CHECK(quick.stats().waits == 1);
}

}  // namespace corolla::api
