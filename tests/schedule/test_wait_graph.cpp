// schedule/wait_graph: which rank (or which cycle of waits) a stalled
// training job is stuck on, from two samples of every rank's activity.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "schedule/wait_graph.hpp"

using namespace corolla::schedule;

namespace {

std::string label(int r) { return "rank " + std::to_string(r) + " (stage " + std::to_string(r % 2) + ")"; }

rank_activity waiting(int rank, std::vector<party_wait> waits, std::uint64_t progress = 10) {
  rank_activity a;
  a.rank = rank;
  a.answered = true;
  a.progress = progress;
  a.waits = std::move(waits);
  return a;
}

party_wait report_of(int rank, double s = 6.0) { return {"report of step 5 from " + label(rank), rank, s}; }
party_wait act_from(int rank, double s = 5.0) { return {"activations of micro-batch 0 from " + label(rank), rank, s}; }
party_wait grad_from(int rank, double s = 4.9) { return {"gradient of micro-batch 0 from " + label(rank), rank, s}; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a lost activation: two stages wait on each other, the verdict names the cycle and both waits") {
  const std::vector<rank_activity> both{waiting(0, {grad_from(1)}), waiting(1, {act_from(0)})};
  const stall_verdict v = diagnose_stall(both, both, {report_of(0), report_of(1)}, label);
  CHECK(v.stuck());
  CHECK(v.what == stall_verdict::kind::deadlock);
  CHECK(v.ranks == std::vector<int>{0, 1});
  CHECK(has(v.reason, "deadlocked"));
  CHECK(has(v.reason, "rank 0 (stage 0) waits for gradient of micro-batch 0 from rank 1 (stage 1) (4.9 s)"));
  CHECK(has(v.reason, "rank 1 (stage 1) waits for activations of micro-batch 0 from rank 0 (stage 0) (5.0 s)"));
  CHECK_FALSE(has(v.reason, "the coordinator"));  // it only waits on the cycle
}

TEST_CASE("a cycle through the coordinator: a rank waits for its verdict while it waits for that rank's report") {
  // Rank 0 reported and waits for the gradient norm; rank 1 never got rank
  // 0's activations, so its report is missing.
  const std::vector<rank_activity> s{waiting(0, {{"gradient norm of step 5 from the coordinator", from_coordinator, 5.0}}),
                                     waiting(1, {act_from(0)})};
  const stall_verdict v = diagnose_stall(s, s, {report_of(1)}, label);
  REQUIRE(v.what == stall_verdict::kind::deadlock);
  CHECK(v.ranks == std::vector<int>{from_coordinator, 1, 0});
  CHECK(has(v.reason, "the coordinator waits for report of step 5 from rank 1 (stage 1)"));
  CHECK(has(v.reason, "rank 0 (stage 0) waits for gradient norm of step 5 from the coordinator"));
}

TEST_CASE("work that still moves is not a stall: a progress counter that changed, or a compute call") {
  const std::vector<rank_activity> before{waiting(0, {grad_from(1)}), waiting(1, {act_from(0)}, 10)};
  std::vector<rank_activity> after{waiting(0, {grad_from(1)}), waiting(1, {act_from(0)}, 11)};
  stall_verdict v = diagnose_stall(before, after, {report_of(0), report_of(1)}, label);
  CHECK_FALSE(v.stuck());
  CHECK(v.ranks == std::vector<int>{1});
  after[1].progress = 10;
  after[1].waits.clear();
  after[1].computing = "backward";  // its own watchdog judges compute calls
  after[1].computing_s = 30;
  v = diagnose_stall(before, after, {report_of(0), report_of(1)}, label);
  CHECK_FALSE(v.stuck());
  // Nothing awaited by the coordinator: nothing to judge.
  CHECK_FALSE(diagnose_stall(after, after, {}, label).stuck());
}

TEST_CASE("a rank that does not answer is blamed, with who waits for it, and a victim is not") {
  rank_activity mute;
  mute.rank = 1;
  const std::vector<rank_activity> s{waiting(0, {grad_from(1)}), mute};
  const stall_verdict v = diagnose_stall(s, s, {report_of(0), report_of(1)}, label);
  REQUIRE(v.what == stall_verdict::kind::silent);
  CHECK(v.ranks == std::vector<int>{1});
  CHECK(has(v.reason, "rank 1 (stage 1) does not answer while its node is up"));
  CHECK(has(v.reason, "the coordinator waits for report of step 5 from rank 1 (stage 1)"));
  CHECK(has(v.reason, "rank 0 (stage 0) waits for gradient"));
  // Answering the second time only is not enough.
  std::vector<rank_activity> later = s;
  later[1] = waiting(1, {});
  CHECK(diagnose_stall(s, later, {report_of(0), report_of(1)}, label).what == stall_verdict::kind::silent);
}

TEST_CASE("a rank that neither computes nor waits while others wait for it is frozen, and ranks nobody waits on are ignored") {
  // 2x2: rank 2 stopped outside compute and waits; rank 0 waits for its
  // gradient, the coordinator for its report. Rank 3 is silent but nobody
  // waits on it (its report is in).
  rank_activity mute;
  mute.rank = 3;
  const std::vector<rank_activity> s{waiting(0, {grad_from(2)}), waiting(1, {}), waiting(2, {}), mute};
  const stall_verdict v = diagnose_stall(s, s, {report_of(0), report_of(2)}, label);
  REQUIRE(v.what == stall_verdict::kind::frozen);
  CHECK(v.ranks == std::vector<int>{2});
  CHECK(has(v.reason, "rank 2 (stage 0) makes no progress: it neither computes nor waits for a message"));
  CHECK(has(v.reason, "rank 0 (stage 0) waits for gradient of micro-batch 0 from rank 2 (stage 0)"));
  // A wait on a sender nobody knows is a dead end too, named as such.
  const std::vector<rank_activity> t{waiting(0, {{"the group id of ring 0", from_unknown, 8.0}})};
  const stall_verdict u = diagnose_stall(t, t, {report_of(0)}, label);
  REQUIRE(u.what == stall_verdict::kind::frozen);
  CHECK(has(u.reason, "it waits only for the group id of ring 0 (8.0 s)"));
}

TEST_CASE("a moving rank anywhere the coordinator waits makes the verdict wait, even beside a silent one") {
  rank_activity mute;
  mute.rank = 1;
  const std::vector<rank_activity> before{waiting(0, {}, 3), mute};
  const std::vector<rank_activity> after{waiting(0, {}, 4), mute};
  CHECK_FALSE(diagnose_stall(before, after, {report_of(0), report_of(1)}, label).stuck());
}
