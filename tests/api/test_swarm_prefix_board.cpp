// The swarm engine's prefix board (api/swarm_prefix_board.hpp): a prompt
// starts on the running session holding the most of it (a page at least),
// waits for a running one still computing a page more of it, and stops
// waiting once that one's prompt is computed, withdrawn, or the wait is up.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "api/swarm_prefix_board.hpp"
#include "tests/support/eventually.hpp"

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

/// Whether one generation is waiting on `board` within 30 s.
bool waiting_soon(const swarm_prefix_board& board) {
  return testing::eventually([&] { return board.stats().waiting == 1; }, std::chrono::seconds(30));
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
  REQUIRE(waiting_soon(board));  // (however late b's thread starts)
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
  REQUIRE(waiting_soon(board));
  CHECK(y.wait_for(100ms) == std::future_status::timeout);
  board.computed("x", {});
  REQUIRE(y.wait_for(30s) == std::future_status::ready);
  CHECK(y.get().empty());
  CHECK(board.stats().waits == 2);
  CHECK(board.stats().waiting == 0);

  // A wait ends when the board's time is up.
  swarm_prefix_board quick(16, 100ms);
  CHECK(quick.enter("r", q).empty());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(quick.enter("s", q).empty());
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  CHECK(quick.stats().waits == 1);
}

TEST_CASE("finished generations are kept up to a count, a chat's next turn continues one, and one gone from its servers is let go") {
  swarm_prefix_board board(16, 50ms, 2);
  // Turn 1: its prompt and reply (the last token never fed back).
  const auto turn1 = prompt_of(20, 0, 0);
  CHECK(board.enter("t1", turn1).empty());
  board.computed("t1", held("t1.0", 20));
  std::vector<std::int32_t> ids1 = turn1;
  for (int i = 0; i < 11; ++i) ids1.push_back(500 + i);
  auto f1 = board.finished("t1", held("t1.0", 31), ids1, false);
  CHECK(f1.keep);
  CHECK(f1.close.empty());
  board.leave("t1");  // (the engine's guard): a kept one stays
  // Turn 2 begins with all turn 1 held, then the reply's last token and the
  // user's next message: it continues turn 1's pages.
  std::vector<std::int32_t> turn2 = ids1;
  for (int i = 0; i < 5; ++i) turn2.push_back(700 + i);
  const swarm_prefix start = board.enter("t2", turn2);
  CHECK(start.tokens == 31);
  CHECK(start.hops.at(0).session == "t1.0");
  // Once turn 2 holds its prompt, turn 1 is superseded: the caller closes it.
  const swarm_prefix superseded = board.computed("t2", held("t2.0", 36));
  REQUIRE(superseded.hops.size() == 1u);
  CHECK(superseded.hops[0].session == "t1.0");
  CHECK(board.finished("t2", held("t2.0", 40), turn2, false).keep);

  // At most two kept: the oldest goes, for the caller to close.
  const auto other = prompt_of(30, 0, 0, 3000), third = prompt_of(30, 0, 0, 4000);
  CHECK(board.enter("o", other).empty());
  CHECK(board.finished("o", held("o.0", 30), other, false).close.empty());
  CHECK(board.enter("p", third).empty());
  auto fp = board.finished("p", held("p.0", 30), third, false);
  REQUIRE(fp.close.size() == 1u);
  CHECK(fp.close[0].hops.at(0).session == "t2.0");
  // A request offered a kept session that its servers had closed (it got
  // none of it) lets that session go.
  std::vector<std::int32_t> again = other;
  again.push_back(9);
  CHECK(board.enter("q", again).tokens == 30);
  auto fq = board.finished("q", {}, again, true);
  CHECK_FALSE(fq.keep);  // nothing to offer
  REQUIRE(fq.close.size() == 1u);
  CHECK(fq.close[0].hops.at(0).session == "o.0");
  CHECK(board.enter("r", again).empty());
  // What remains kept goes when the engine stops.
  const auto rest = board.drop_all_kept();
  REQUIRE(rest.size() == 1u);
  CHECK(rest[0].hops.at(0).session == "p.0");
  const prefix_board_stats s = board.stats();
  CHECK(s.kept == 4);
  CHECK(s.dropped == 4);
}

TEST_CASE("the prefix board keeps cache domains apart: no start on, or wait for, another salt's session, running or kept") {
  swarm_prefix_board board(16, 20s, 2);
  const auto a = prompt_of(32, 8, 1);
  CHECK(board.enter("a", a, "alice").empty());
  // Another domain's request with the same system prompt, while a's is
  // still being computed: no wait (it would have waited up to 20 s).
  const auto started = std::chrono::steady_clock::now();
  CHECK(board.enter("m", prompt_of(32, 6, 2), "mallory").empty());
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  CHECK(board.stats().waits == 0);
  board.computed("a", held("a.0", 40));
  board.computed("m", held("m.0", 38));
  // Running: each domain starts on its own, the default one on neither.
  CHECK(board.enter("a2", prompt_of(32, 6, 3), "alice").hops.at(0).session == "a.0");
  CHECK(board.enter("m2", prompt_of(32, 6, 4), "mallory").hops.at(0).session == "m.0");
  CHECK(board.enter("n", prompt_of(32, 6, 5)).empty());
  board.leave("a2");
  board.leave("m2");
  board.leave("n");
  // Kept after finishing: still only for its own domain.
  std::vector<std::int32_t> ids = a;
  ids.push_back(77);
  CHECK(board.finished("a", held("a.0", 41), ids, false).keep);
  board.leave("m");
  std::vector<std::int32_t> next = ids;
  next.push_back(78);
  CHECK(board.enter("x", next, "mallory").empty());
  board.leave("x");
  const swarm_prefix own = board.enter("y", next, "alice");
  CHECK(own.tokens == 41);
  CHECK(own.hops.at(0).session == "a.0");
  board.leave("y");

  // A request whose prompt offered nothing while it ran (computed() with
  // nothing held), kept when it finished: still its own domain's.
  const auto z = prompt_of(32, 8, 9, 5000);
  CHECK(board.enter("z", z, "zed").empty());
  board.computed("z", {});
  CHECK(board.finished("z", held("z.0", 40), z, false).keep);
  CHECK(board.enter("u", z).empty());
  board.leave("u");
  CHECK(board.enter("w", z, "zed").hops.at(0).session == "z.0");
}

TEST_CASE("the prefix board lets a flooding domain's kept sessions go before another domain's") {
  swarm_prefix_board board(16, 20s, 3);
  // Finished with ids as the request's prompt and reply: kept.
  auto finish = [&board](const std::string& id, const std::vector<std::int32_t>& prompt, const std::string& domain) {
    CHECK(board.enter(id, prompt, domain).empty());
    board.computed(id, held(id + ".0", static_cast<std::int64_t>(prompt.size())));
    return board.finished(id, held(id + ".0", static_cast<std::int64_t>(prompt.size())), prompt, false);
  };
  const auto a = prompt_of(32, 8, 1);
  CHECK(finish("a", a, "alice").keep);
  // Mallory's burst after it: three of her own, one more than the board
  // keeps. The first that overflows lets Mallory's oldest go, not Alice's.
  CHECK(finish("m1", prompt_of(32, 8, 2, 2000), "mallory").close.empty());
  CHECK(finish("m2", prompt_of(32, 8, 3, 3000), "mallory").close.empty());
  const auto m3 = finish("m3", prompt_of(32, 8, 4, 4000), "mallory");
  CHECK(m3.keep);
  REQUIRE(m3.close.size() == 1u);
  CHECK(m3.close[0].hops.at(0).session == "m1.0");
  // Alice's next turn still continues her kept session.
  std::vector<std::int32_t> next = a;
  next.push_back(99);
  const swarm_prefix own = board.enter("a2", next, "alice");
  CHECK(own.hops.at(0).session == "a.0");
  board.leave("a2");
}

}  // namespace corolla::api
