// schedule/replan: measured links folded into the description, and whether
// re-planning around them pays off.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "schedule/replan.hpp"
#include "tests/schedule/two_sites.hpp"

using namespace corolla;
using namespace corolla::schedule;

namespace {

cluster_description sites() { return corolla::schedule::testing::two_sites(); }

model_config llama_7b() {
  return load_config(std::filesystem::path(COROLLA_SOURCE_DIR) / "docs" / "clusters" / "models" / "llama2-7b.json");
}

training_setup setup32() {
  training_setup s;
  s.global_batch = 32;
  return s;
}

/// A pair of workers the plan sends over every micro-batch: stage 0 to
/// stage 1 of replica 0, or the first DP ring hop with one stage.
std::pair<int, int> busy_pair(const plan& p) {
  if (p.pp > 1) return {p.stages[0].workers[0], p.stages[1].workers[0]};
  REQUIRE(p.dp > 1);
  return {p.stages[0].workers[0], p.stages[0].workers[1]};
}

}  // namespace

TEST_CASE("a link measured far below its rule becomes a measured link, both ways, and heals") {
  const cluster_description c = sites();
  const double planned = c.link_between(0, 2).bandwidth;  // a0/0 -> a1/0: the IB class link
  std::vector<std::string> changes;
  cluster_description m = with_measurements(c, {{0, 2, 125e3}}, {}, &changes);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].find("a0/0 <-> a1/0") != std::string::npos);
  CHECK(changes[0].find("1 Mbit/s measured") != std::string::npos);
  CHECK(m.link_between(0, 2).bandwidth == doctest::Approx(125e3));
  CHECK(m.link_between(2, 0).bandwidth == doctest::Approx(125e3));
  CHECK(m.link_between(0, 2).latency == doctest::Approx(c.link_between(0, 2).latency));
  CHECK(m.link_between(0, 3).bandwidth == doctest::Approx(planned));  // other links keep the rule

  // Within the threshold of the rule: nothing changes; a small wobble of a
  // link already measured slow is not a change either.
  changes.clear();
  CHECK(with_measurements(c, {{0, 2, 0.6 * planned}}, {}, &changes).measured.empty());
  CHECK(with_measurements(m, {{0, 2, 130e3}}, {}, &changes).link_between(0, 2).bandwidth == doctest::Approx(125e3));
  CHECK(changes.empty());
  // Much slower again counts.
  CHECK(with_measurements(m, {{2, 0, 20e3}}, {}, &changes).link_between(0, 2).bandwidth == doctest::Approx(20e3));
  CHECK(changes.size() == 1);

  // Back at the rule's speed, or too fast to measure: the rule again.
  changes.clear();
  CHECK(with_measurements(m, {{0, 2, planned}}, {}, &changes).measured.empty());
  CHECK(with_measurements(m, {{2, 0, 0}}, {}, &changes).measured.empty());
  REQUIRE(changes.size() == 2);
  CHECK(changes[1].find("too fast to measure, back to the planned") != std::string::npos);

  // Nonsense ranks are ignored, not thrown.
  CHECK(with_measurements(c, {{0, 0, 1}, {-1, 2, 1}, {0, 99, 1}}).measured.empty());
}

TEST_CASE("measured links follow their workers through without_workers") {
  cluster_description m = with_measurements(sites(), {{0, 2, 125e3}, {4, 5, 125e3}});
  REQUIRE(m.measured.size() == 4);
  // Worker 1 goes: a1/0 is rank 1 now, and its measured link to a0/0 stays.
  const cluster_description left = without_workers(m, {1});
  CHECK(left.measured.size() == 4);
  CHECK(left.workers[1].name == "a1/0");
  CHECK(left.link_between(0, 1).bandwidth == doctest::Approx(125e3));
  // Worker 2 (a1/0) goes: its links go with it.
  CHECK(without_workers(m, {2}).measured.size() == 2);
}

TEST_CASE("the scheduler re-plans around a throttled link when it pays, and stays when it does not") {
  const cluster_description c = sites();
  const model_config cfg = llama_7b();
  const plan running = make_plan(c, cfg, setup32()).best;
  REQUIRE(running.feasible);
  REQUIRE(running.pp * running.dp > 1);

  // Unchanged links: the running layout is still the planner's choice.
  const replan_advice same = advise_replan(c, running, cfg, setup32(), 1000, 5.0);
  CHECK_FALSE(same.move);
  CHECK(same.why.find("still the best") != std::string::npos);
  CHECK(same.current_s == doctest::Approx(running.step_s()));

  // The busiest link of the plan drops to 1 Mbit/s.
  const auto [x, y] = busy_pair(running);
  const cluster_description slow = with_measurements(c, {{x, y, 125e3}});
  const replan_advice a = advise_replan(slow, running, cfg, setup32(), 1000, 5.0);
  MESSAGE(a.why);
  CHECK(a.current_s > 10 * running.step_s());  // the running layout, priced on what was measured
  REQUIRE(a.next.feasible);
  CHECK(a.next_s < a.current_s / 10);
  CHECK(a.move);
  CHECK(a.why.find("moving pays off") != std::string::npos);
  // The new plan no longer sends over the slow pair in its pipeline.
  for (std::size_t s = 0; s + 1 < a.next.stages.size(); ++s)
    for (int r = 0; r < a.next.dp; ++r) {
      const int from = a.next.stages[s].workers[static_cast<std::size_t>(r)];
      const int to = a.next.stages[s + 1].workers[static_cast<std::size_t>(r)];
      CHECK_FALSE(((from == x && to == y) || (from == y && to == x)));
    }

  // Two steps left and a switch that would take a day: staying is cheaper.
  const replan_advice late = advise_replan(slow, running, cfg, setup32(), 2, 86400.0);
  CHECK_FALSE(late.move);
  CHECK(late.why.find("staying") != std::string::npos);
}

TEST_CASE("a link counts as changed only when probes in a row agree") {
  const cluster_description c = sites();
  change_watch watch;
  const link_measurement slow{0, 2, 125e3};
  CHECK(watch.sustained(c, {slow}).empty());  // once: a busy host, maybe
  CHECK(watch.sustained(c, {{0, 2, c.link_between(0, 2).bandwidth}}).empty());  // then fine: the streak ends
  CHECK(watch.sustained(c, {slow}).empty());
  const auto twice = watch.sustained(c, {{2, 0, 130e3}});  // either end may probe
  REQUIRE(twice.size() == 1);
  CHECK(twice[0].bandwidth == doctest::Approx(130e3));
  // Folded in, the same rate again is no news; its return to the rule is, twice.
  const cluster_description m = with_measurements(c, twice);
  CHECK(watch.sustained(m, {slow}).empty());
  CHECK(watch.sustained(m, {{0, 2, 0}}).empty());
  CHECK(watch.sustained(m, {{0, 2, 0}}).size() == 1);
  replan_policy once;
  once.confirmations = 1;
  CHECK(change_watch{}.sustained(c, {slow}, once).size() == 1);
}

TEST_CASE("a straggler's measured compute lowers its speed in the description, and its recovery restores it") {
  const cluster_description c = sites();
  const model_config cfg = llama_7b();
  const plan running = make_plan(c, cfg, setup32()).best;
  REQUIRE(running.feasible);
  std::vector<compute_measurement> m = modeled_compute(c, running);
  REQUIRE(m.size() >= 2u);
  for (const auto& x : m) CHECK(x.modeled > 0);
  // Every worker runs at half the modelled time (a faster host than the
  // file says), except one at three times that: a straggler.
  const int slow = m[1].worker;
  for (auto& x : m) x.seconds = x.modeled * 0.5 * (x.worker == slow ? 3.0 : 1.0);
  change_watch watch;
  CHECK(watch.sustained_compute(c, m).empty());  // once is not enough
  const auto twice = watch.sustained_compute(c, m);
  REQUIRE(twice.size() == m.size());  // the straggler and the reference(s): the fastest, here all others
  std::vector<std::string> changes;
  const cluster_description d = with_compute(c, twice, {}, &changes);
  REQUIRE(changes.size() == 1u);
  CHECK(changes[0].find(c.workers[static_cast<std::size_t>(slow)].name + " computes 3x slower") == 0);
  CHECK(d.workers[static_cast<std::size_t>(slow)].flops == doctest::Approx(c.workers[static_cast<std::size_t>(slow)].flops / 3));
  CHECK(d.nominal_flops.at(c.workers[static_cast<std::size_t>(slow)].name) ==
        doctest::Approx(c.workers[static_cast<std::size_t>(slow)].flops));
  // Modelled at the nominal speed still: the straggler stays one until it is not.
  CHECK(modeled_compute(d, running)[1].modeled == doctest::Approx(m[1].modeled));
  CHECK(with_compute(d, m).workers[static_cast<std::size_t>(slow)].flops ==
        doctest::Approx(d.workers[static_cast<std::size_t>(slow)].flops));  // the same news: no change
  // A slow worker is priced slower, so the planner's step gets no faster.
  CHECK(advise_replan(d, running, cfg, setup32(), 1000, 5.0).current_s >= running.step_s());
  for (auto& x : m) x.seconds = x.modeled * 0.5;
  changes.clear();
  const cluster_description back = with_compute(d, m, {}, &changes);
  REQUIRE(changes.size() == 1u);
  CHECK(changes[0].find("at its nominal") != std::string::npos);
  CHECK(back.nominal_flops.empty());
  CHECK(back.workers[static_cast<std::size_t>(slow)].flops == doctest::Approx(c.workers[static_cast<std::size_t>(slow)].flops));
}
