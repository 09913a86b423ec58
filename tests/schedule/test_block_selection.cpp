// tests/schedule/test_block_selection.cpp — joining, rebalancing, gap-free moves.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "schedule/block_selection.hpp"

using namespace corolla::swarm;
using corolla::block_range;
using corolla::server_state;

namespace {

server_record srv(std::string id, int start, int end, double throughput,
                  server_state state = server_state::online) {
  server_record r;
  r.id = std::move(id);
  r.span = {start, end};
  r.state = state;
  r.throughput = throughput;
  return r;
}

block_range choose(const swarm_state& s, int k, double t = 1.0) {
  auto c = choose_blocks(s, k, t);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? std::string() : c.error().message));
  return c.value().span;
}

std::vector<server_id> ids_of(const swarm_state& s) {
  std::vector<server_id> ids;
  for (const auto& r : s.servers) ids.push_back(r.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// What the runtime does, with every server checking in turn (id order) and
// moves completing at once. Returns the number of moves made in `rounds`
// rounds; checks on the way that every move is gap-free, that the swarm
// throughput never drops and no gap ever opens.
struct loop_outcome {
  int moves = 0;
  int last_round_with_move = -1;
  swarm_state final;
};
loop_outcome run_rebalancing(swarm_state s, int rounds, const rebalance_params& p = {}) {
  loop_outcome out;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& id : ids_of(s)) {
      const auto d = should_move(s, id, p);
      if (!d.move) continue;
      const auto check = check_move(s, id, d.target);
      REQUIRE_MESSAGE(check.safe, check.message);
      const double before = swarm_throughput(s);
      const auto gaps_before = uncovered_blocks(s).size();
      s = with_server_moved(s, id, d.target);
      CHECK(swarm_throughput(s) >= before * (1 - 1e-9));
      CHECK(uncovered_blocks(s).size() <= gaps_before);
      ++out.moves;
      out.last_round_with_move = round;
    }
  }
  out.final = s;
  return out;
}

}  // namespace

TEST_CASE("a server joining an empty swarm starts at block 0") {
  const swarm_state empty{8, {}};
  auto c = choose_blocks(empty, 3, 5.0);
  REQUIRE(c.ok());
  CHECK(c.value().span == block_range{0, 3});
  CHECK(c.value().throughput_before == 0.0);
  CHECK(c.value().throughput_after == 0.0);  // blocks 3..7 are still missing

  // Never beyond the model: asking for more blocks than exist takes them all.
  auto all = choose_blocks(empty, 20, 5.0);
  REQUIRE(all.ok());
  CHECK(all.value().span == block_range{0, 8});
  CHECK(all.value().throughput_after == 5.0);
}

TEST_CASE("a joining server fills a gap first") {
  // [4, 8) is uncovered.
  swarm_state s{12, {srv("a", 0, 4, 5), srv("b", 8, 12, 5)}};
  CHECK(choose(s, 4) == block_range{4, 8});
  // A window longer than the gap covers it, leftmost among equal windows.
  CHECK(choose(s, 6) == block_range{2, 8});
  // A partial gap [6, 8): every window with both gap blocks ties; leftmost wins.
  s = {12, {srv("a", 0, 6, 5), srv("b", 8, 12, 5)}};
  CHECK(choose(s, 4) == block_range{4, 8});
  // A server announcing throughput 0 still closes a gap: an uncovered block
  // ranks below a covered one of throughput 0.
  s = {6, {srv("zero", 0, 3, 0.0)}};
  CHECK(choose(s, 3) == block_range{3, 6});
}

TEST_CASE("a redundant server goes to the weakest window") {
  // Blocks [4, 8) have half the capacity of [0, 4).
  swarm_state s{8, {srv("a", 0, 8, 10), srv("b", 0, 4, 10)}};
  auto c = choose_blocks(s, 4, 10.0);
  REQUIRE(c.ok());
  CHECK(c.value().span == block_range{4, 8});
  CHECK(c.value().throughput_before == 10.0);
  CHECK(c.value().throughput_after == 20.0);

  // Lexicographic beyond the minimum: [2, 4) holds two blocks at the minimum.
  s = {6, {srv("a", 0, 6, 1), srv("b", 0, 2, 1), srv("c", 4, 6, 0.5)}};  // 2 2 1 1 1.5 1.5
  CHECK(choose(s, 2) == block_range{2, 4});
  // Equal windows at both ends: the leftmost.
  s = {8, {srv("a", 0, 8, 3), srv("b", 2, 6, 1)}};  // 3 3 4 4 4 4 3 3
  CHECK(choose(s, 2) == block_range{0, 2});
  CHECK(choose(s, 3) == block_range{0, 3});
}

TEST_CASE("block selection counts JOINING servers and ignores OFFLINE ones and the server itself") {
  swarm_state s{8, {srv("a", 0, 4, 5, server_state::joining), srv("b", 4, 8, 5, server_state::offline)}};
  CHECK(choose(s, 4) == block_range{4, 8});
  CHECK(block_throughputs(s) == std::vector<double>{5, 5, 5, 5, 0, 0, 0, 0});
  CHECK(online_coverage(s) == std::vector<int>(8, 0));
  CHECK(uncovered_blocks(s) == std::vector<int>{4, 5, 6, 7});

  // A server re-joining under its own id does not count its stale record.
  s = {8, {srv("a", 0, 4, 5), srv("me", 4, 8, 5)}};
  auto c = choose_blocks(s, 4, 5.0, "me");
  REQUIRE(c.ok());
  CHECK(c.value().span == block_range{4, 8});
  CHECK(c.value().throughput_before == 0.0);
}

TEST_CASE("block selection rejects bad input with a clear error") {
  swarm_state s{8, {srv("a", 0, 4, 5)}};
  auto zero = choose_blocks(s, 0, 1.0);
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().code == schedule_errc::invalid_argument);
  auto neg = choose_blocks(s, 2, -1.0);
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.error().code == schedule_errc::invalid_argument);
  CHECK_THROWS_AS(neg.value(), std::logic_error);

  swarm_state bad{8, {srv("a", 6, 10, 5)}};
  auto b = choose_blocks(bad, 2, 1.0);
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().code == schedule_errc::invalid_swarm);
  CHECK(b.error().message.find("'a'") != std::string::npos);
  CHECK(b.error().message.find("[6, 10)") != std::string::npos);

  swarm_state overlap{8, {srv("a", 0, 4, 5), srv("a", 3, 6, 5)}};
  REQUIRE(validate(overlap).has_value());
  CHECK(validate(overlap)->message.find("overlapping") != std::string::npos);
  CHECK_FALSE(validate(swarm_state{8, {srv("a", 0, 4, 5), srv("a", 4, 6, 5)}}).has_value());
  CHECK(validate(swarm_state{0, {}}).has_value());
}

TEST_CASE("the number of blocks follows from memory") {
  const std::uint64_t GiB = 1ull << 30;
  memory_budget m{10 * GiB, GiB, GiB / 4, 2 * GiB};  // (10 - 2) / 1.25 = 6.4
  auto n = blocks_that_fit(m, 32);
  REQUIRE(n.ok());
  CHECK(n.value() == 6);
  CHECK(blocks_that_fit(m, 4).value() == 4);  // never beyond the model

  auto none = blocks_that_fit(memory_budget{GiB, 2 * GiB, 0, 0}, 32);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == schedule_errc::not_enough_memory);
  CHECK(none.error().message.find("not even one block fits") != std::string::npos);
  CHECK_FALSE(blocks_that_fit(memory_budget{GiB, 0, 0, 0}, 32).ok());
  CHECK_FALSE(blocks_that_fit(memory_budget{GiB, GiB, 0, 2 * GiB}, 32).ok());  // reserve exceeds memory

  // The cache gets what the weights leave: 6 blocks take 6 GiB of the 8
  // usable, 2 GiB left for 6 blocks at 1 KiB a token each: 349,525 tokens,
  // 349,520 in whole pages of 16.
  const std::uint64_t KiB = 1024;
  auto t = cache_tokens_that_fit(m, 6, KiB, 16, 1000);
  REQUIRE(t.ok());
  CHECK(t.value() == 349'520);
  CHECK(t.value() * 6 * static_cast<std::int64_t>(KiB) <= static_cast<std::int64_t>(8 * GiB - 6 * GiB));
  // Fewer blocks, more cache each; every block of a small model: the rest.
  CHECK(cache_tokens_that_fit(m, 4, KiB, 16, 0).value() == 4 * GiB / (4 * KiB) / 16 * 16);
  CHECK(cache_tokens_that_fit(m, 6, KiB, 1, 0).value() == 2 * GiB / (6 * KiB));
  // Never fewer than the tokens the blocks were counted with, even when
  // whole pages fall short of them or nothing is left.
  CHECK(cache_tokens_that_fit(m, 6, KiB, 16, 349'525).value() == 349'525);
  CHECK(cache_tokens_that_fit(memory_budget{GiB, 2 * GiB, 0, 0}, 1, KiB, 16, 64).value() == 64);
  CHECK_FALSE(cache_tokens_that_fit(m, 0, KiB, 16, 0).ok());
  CHECK_FALSE(cache_tokens_that_fit(m, 6, 0, 16, 0).ok());
  CHECK_FALSE(cache_tokens_that_fit(m, 6, KiB, 0, 0).ok());
  CHECK_FALSE(cache_tokens_that_fit(m, 6, KiB, 16, -1).ok());

  swarm_state s{12, {srv("a", 0, 6, 5)}};
  auto c = choose_blocks_for_memory(s, m, 5.0);
  REQUIRE(c.ok());
  CHECK(c.value().span == block_range{6, 12});
  CHECK(c.value().throughput_after == 5.0);
}

TEST_CASE("throughput is per span and additive per block") {
  CHECK(announced_throughput(1000, 10, 500) == 100);
  CHECK(announced_throughput(1000, 10, 50) == 50);  // the network is the limit
  CHECK(announced_throughput(1000, 0, 50) == 0);
  CHECK(announced_throughput(0, 10, 50) == 0);
  // An unknown network rate (0) is not a zero-speed server: the compute figure.
  CHECK(announced_throughput(1000, 10, 0) == 100);
  CHECK(announced_throughput(1000, 10, -1) == 100);
  swarm_state s{4, {srv("a", 0, 4, 1.5), srv("b", 1, 3, 2)}};
  CHECK(block_throughputs(s) == std::vector<double>{1.5, 3.5, 3.5, 1.5});
  CHECK(swarm_throughput(s) == 1.5);
  // The order of records never changes the sums (summed in id order).
  swarm_state r{4, {srv("b", 1, 3, 2), srv("a", 0, 4, 1.5)}};
  CHECK(block_throughputs(r) == block_throughputs(s));
}

TEST_CASE("after a departure a redundant server moves to cover the hole") {
  swarm_state s{8, {srv("a", 0, 4, 1), srv("b", 4, 8, 1), srv("c", 0, 4, 1)}};
  // Balanced enough: nobody moves.
  CHECK(should_move(s, "a").reason == rebalance_reason::already_best);
  CHECK(should_move(s, "b").reason == rebalance_reason::sole_server);
  CHECK_FALSE(should_move(s, "c").move);

  s.servers[1].state = server_state::offline;  // b leaves: [4, 8) is a hole
  const auto d = should_move(s, "c");
  CHECK(d.move);
  CHECK(d.reason == rebalance_reason::move_fills_gap);
  CHECK(d.current == block_range{0, 4});
  CHECK(d.target == block_range{4, 8});
  CHECK(d.throughput_now == 0.0);
  CHECK(d.throughput_simulated == 1.0);
  CHECK(check_move(s, "c", d.target).safe);
  // a sees the same hole; whichever checks first announces [4, 8) JOINING,
  // and the other then sees no hole (JOINING counts for balancing).
  CHECK(should_move(s, "a").move);
  auto moving = s;
  moving.servers.push_back(srv("c", 4, 8, 1, server_state::joining));
  CHECK(should_move(moving, "a").reason == rebalance_reason::already_best);
  CHECK(should_move(moving, "c").reason == rebalance_reason::move_in_progress);
  // Once c has moved, a is the only server of [0, 4): it must stay.
  const auto moved = with_server_moved(s, "c", d.target);
  CHECK(swarm_throughput(moved) == 1.0);
  const auto da = should_move(moved, "a");
  CHECK_FALSE(da.move);
  CHECK(da.reason == rebalance_reason::sole_server);
  CHECK(da.target == da.current);
  CHECK(da.explanation.find("block 0") != std::string::npos);
}

TEST_CASE("a server moves only when the bottleneck improves beyond the threshold") {
  // Three servers on [0, 2), one on [2, 4): moving one doubles the bottleneck.
  swarm_state s{4, {srv("a", 0, 2, 1), srv("b", 2, 4, 1), srv("c", 0, 2, 1), srv("d", 0, 2, 1)}};
  auto d = should_move(s, "c");
  CHECK(d.move);
  CHECK(d.reason == rebalance_reason::move_improves);
  CHECK(d.target == block_range{2, 4});
  CHECK(d.throughput_now == doctest::Approx(1.0));
  CHECK(d.throughput_simulated == doctest::Approx(2.0));

  // A weak redundant server: the move would raise the bottleneck 0.9 -> 1.0
  // only (x1.11), below the default threshold x1.25.
  swarm_state w{4, {srv("a", 0, 2, 1), srv("b", 2, 4, 0.9), srv("c", 0, 2, 0.1)}};
  d = should_move(w, "c");
  CHECK_FALSE(d.move);
  CHECK(d.reason == rebalance_reason::below_threshold);
  CHECK(d.throughput_simulated == doctest::Approx(1.0));
  CHECK(d.explanation.find("threshold") != std::string::npos);
  // A lower threshold lets it move.
  rebalance_params eager;
  eager.min_improvement = 0.05;
  d = should_move(w, "c", eager);
  CHECK(d.move);
  CHECK(d.target == block_range{2, 4});
}

TEST_CASE("the local search credits moves that need other servers to follow") {
  // Ideal: two servers on [0, 3) and two on [3, 6) (bottleneck 2). Today c
  // and d both sit on [1, 4); the bottleneck is 1.
  swarm_state s{6, {srv("a", 0, 3, 1), srv("b", 3, 6, 1), srv("c", 1, 4, 1), srv("d", 1, 4, 1)}};
  auto d = should_move(s, "c");
  CHECK(d.move);
  CHECK(d.target == block_range{3, 6});
  CHECK(d.throughput_immediate == doctest::Approx(1.0));  // blocks 0 still at 1 ...
  CHECK(d.throughput_simulated == doctest::Approx(2.0));  // ... until d moves to [0, 3)
  auto out = run_rebalancing(s, 10);
  CHECK(out.moves == 2);
  CHECK(swarm_throughput(out.final) == doctest::Approx(2.0));
}

TEST_CASE("JOINING servers and servers in the middle of a move do not rebalance") {
  swarm_state s{4, {srv("a", 0, 2, 1), srv("b", 2, 4, 1), srv("c", 0, 2, 1, server_state::joining)}};
  CHECK(should_move(s, "c").reason == rebalance_reason::not_online);
  s.servers.push_back(srv("a", 2, 4, 1, server_state::joining));
  CHECK(should_move(s, "a").reason == rebalance_reason::move_in_progress);
  CHECK(should_move(s, "nobody").reason == rebalance_reason::unknown_server);
  CHECK(should_move(swarm_state{0, {}}, "a").reason == rebalance_reason::invalid_swarm);
}

TEST_CASE("equal servers do not swap places") {
  // c overlaps a and b by one block each; [0, 2) and [1, 3) are equally good
  // for it. A leftmost-always rule would move it back and forth with noise.
  swarm_state s{4, {srv("a", 0, 2, 1), srv("b", 2, 4, 1), srv("c", 1, 3, 1)}};
  for (const auto& id : {"a", "b", "c"}) CHECK_FALSE(should_move(s, id).move);
  auto out = run_rebalancing(s, 50);
  CHECK(out.moves == 0);

  // Two pairs of equal servers, each pair on one half.
  s = {8, {srv("a", 0, 4, 2), srv("b", 4, 8, 2), srv("c", 0, 4, 2), srv("d", 4, 8, 2)}};
  out = run_rebalancing(s, 50);
  CHECK(out.moves == 0);
}

TEST_CASE("the rebalancing loop converges on many swarms") {
  // Deterministic random swarms: every round each server checks once; moves
  // complete at once. Every move makes the sorted block throughputs strictly
  // larger, so the loop must stop; check that it does, quickly.
  std::mt19937_64 rng(20240607);
  int total_moves = 0, swarms_with_moves = 0, latest_round = -1;
  for (int trial = 0; trial < 200; ++trial) {
    const int n_blocks = 4 + static_cast<int>(rng() % 21);  // 4..24
    const int n_servers = 2 + static_cast<int>(rng() % 11);  // 2..12
    swarm_state s{n_blocks, {}};
    for (int i = 0; i < n_servers; ++i) {
      const int len = 1 + static_cast<int>(rng() % n_blocks);
      const int start = static_cast<int>(rng() % (n_blocks - len + 1));
      const double tp = 1.0 + static_cast<double>(rng() % 4) * 0.5 + static_cast<double>(rng() % 100) * 1e-3;
      s.servers.push_back(srv("s" + std::to_string(i), start, start + len, tp));
    }
    const auto out = run_rebalancing(s, 60);
    INFO("trial " << trial << ", moves " << out.moves);
    CHECK(out.last_round_with_move < 30);  // converged long before the end
    CHECK(out.moves <= 4 * n_servers);
    CHECK(swarm_throughput(out.final) >= swarm_throughput(s));
    total_moves += out.moves;
    latest_round = std::max(latest_round, out.last_round_with_move);
    swarms_with_moves += out.moves > 0;
  }
  MESSAGE("rebalancing: " << total_moves << " moves over 200 swarms, " << swarms_with_moves
                          << " swarms moved, last move in round " << latest_round);
  CHECK(swarms_with_moves > 0);  // the loop does something
}

TEST_CASE("measurement noise does not make servers move back and forth") {
  // Re-measured throughputs wander by up to +-10% each round; with the default
  // threshold no server moves on noise alone once the swarm is balanced.
  swarm_state base{12, {srv("a", 0, 6, 4), srv("b", 6, 12, 4), srv("c", 0, 6, 4), srv("d", 6, 12, 4),
                        srv("e", 3, 9, 4)}};
  std::mt19937_64 rng(7);
  int moves = 0;
  swarm_state s = base;
  for (int round = 0; round < 100; ++round) {
    for (std::size_t i = 0; i < s.servers.size(); ++i) {
      const double noise = 0.9 + 0.2 * static_cast<double>(rng() % 1001) / 1000.0;
      s.servers[i].throughput = base.servers[i].throughput * noise;
    }
    for (const auto& id : ids_of(s)) {
      const auto d = should_move(s, id);
      if (d.move) ++moves, s = with_server_moved(s, id, d.target);
    }
  }
  CHECK(moves == 0);
}

TEST_CASE("a planned move never leaves a block without a server") {
  swarm_state s{8, {srv("a", 0, 4, 1), srv("b", 4, 8, 1), srv("c", 0, 4, 1)}};

  // c is redundant: moving it is safe in every phase.
  auto plan = plan_move(s, "c", {2, 6});
  REQUIRE(plan.ok());
  REQUIRE(plan.value().size() == 3);
  const auto& joining = plan.value()[0];
  CHECK(joining.phase == move_phase::joining);
  REQUIRE(joining.records.size() == 2);
  CHECK(joining.records[0].span == block_range{0, 4});
  CHECK(joining.records[0].state == server_state::online);
  CHECK(joining.records[1].span == block_range{4, 6});
  CHECK(joining.records[1].state == server_state::joining);
  const auto& both = plan.value()[1];
  CHECK(both.phase == move_phase::serving_both);
  CHECK(both.records[1].state == server_state::online);
  const auto& left = plan.value()[2];
  CHECK(left.phase == move_phase::left_old);
  REQUIRE(left.records.size() == 2);
  CHECK(left.records[0].span == block_range{2, 6});
  CHECK(left.records[1].span == block_range{0, 2});
  CHECK(left.records[1].state == server_state::offline);
  CHECK(check_move(s, "c", {2, 6}).safe);
  CHECK(check_move(s, "c", {4, 8}).safe);

  // b is the only server of [4, 8): leaving it breaks the chain in the last phase.
  auto c = check_move(s, "b", {0, 4});
  CHECK_FALSE(c.safe);
  REQUIRE(c.failing_phase.has_value());
  CHECK(*c.failing_phase == move_phase::left_old);
  CHECK(c.uncovered_blocks == std::vector<int>{4, 5, 6, 7});
  CHECK(c.message.find("left_old") != std::string::npos);
  // An overlapping shift of b keeps [6, 8) but drops [4, 6).
  c = check_move(s, "b", {6, 8});
  CHECK_FALSE(c.safe);
  CHECK(c.uncovered_blocks == std::vector<int>{4, 5});

  // Checked again right before leaving: a was redundant when c planned its
  // move, but a has gone OFFLINE since; c must keep [0, 4) for now.
  CHECK(check_move(s, "c", {4, 8}).safe);
  s.servers[0].state = server_state::offline;
  c = check_move(s, "c", {4, 8});
  CHECK_FALSE(c.safe);
  CHECK(c.uncovered_blocks == std::vector<int>{0, 1, 2, 3});

  // A move into an existing hole is fine even if other holes remain.
  swarm_state h{8, {srv("a", 0, 2, 1), srv("b", 0, 2, 1)}};
  CHECK(check_move(h, "b", {2, 4}).safe);

  // Bad plans are unsafe with a reason, not a crash.
  CHECK_FALSE(check_move(s, "nobody", {0, 2}).safe);
  CHECK_FALSE(check_move(s, "c", {6, 10}).safe);
  CHECK_FALSE(plan_move(s, "c", {6, 10}).ok());
}
