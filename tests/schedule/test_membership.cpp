// schedule/membership: the present workers of a cluster file (standby and
// lost ones left out, what was measured carried over), and plans numbered
// again for a description that gained workers.
#include <doctest/doctest.h>

#include <filesystem>
#include <set>
#include <string>

#include "model/error.hpp"
#include "schedule/membership.hpp"
#include "schedule/replan.hpp"
#include "tests/schedule/two_sites.hpp"

using namespace corolla;
using namespace corolla::schedule;

namespace {

model_config llama_7b() {
  return load_config(std::filesystem::path(COROLLA_SOURCE_DIR) / "docs" / "clusters" / "models" / "llama2-7b.json");
}

std::set<std::string> names(const cluster_description& c) {
  std::set<std::string> out;
  for (const worker_spec& w : c.workers) out.insert(w.name);
  return out;
}

}  // namespace

TEST_CASE("present workers: the file without the absent ones, in file order, with what was measured of the others") {
  const cluster_description file = testing::two_sites();  // a0/0 a0/1 a1/0 a1/1 | b/0 b/1
  const cluster_description all = present_workers(file, {});
  CHECK(all.size() == 6);
  const cluster_description no_b = present_workers(file, {"b/0", "b/1"});
  CHECK(names(no_b) == std::set<std::string>{"a0/0", "a0/1", "a1/0", "a1/1"});
  CHECK(no_b.clusters.size() == 1);  // cluster b went with its workers
  const cluster_description gap = present_workers(file, {"a0/1"});
  REQUIRE(gap.size() == 5);
  CHECK(gap.workers[1].name == "a1/0");  // numbered again, in file order
  CHECK_THROWS_WITH_AS(present_workers(file, {"c/0"}), doctest::Contains("has no worker 'c/0'"), model_error);
  CHECK_THROWS_AS(present_workers(file, names(file)), model_error);

  // Measured on the smaller description: a slow link and a straggler.
  cluster_description learned = with_measurements(no_b, {{0, 2, 125e3}});  // a0/0 <-> a1/0
  learned.nominal_flops["a0/1"] = learned.workers[1].flops;
  learned.workers[1].flops /= 4;
  // b/0 comes back: the file's b/0, and what was learned of the others.
  const cluster_description back = present_workers(file, {"b/1"}, &learned);
  REQUIRE(back.size() == 5);
  CHECK(back.workers[4].name == "b/0");
  CHECK(back.link_between(0, 2).bandwidth == doctest::Approx(125e3));
  CHECK(back.link_between(2, 0).bandwidth == doctest::Approx(125e3));
  CHECK(back.link_between(0, 4).bandwidth == doctest::Approx(file.link_between(0, 4).bandwidth));
  CHECK(back.workers[1].flops == doctest::Approx(file.workers[1].flops / 4));
  CHECK(back.nominal_flops.at("a0/1") == doctest::Approx(file.workers[1].flops));
  // A measurement of a worker that is absent again is not carried.
  const cluster_description without_a10 = present_workers(file, {"a1/0"}, &learned);
  CHECK(without_a10.measured.empty());
}

TEST_CASE("a plan numbered again for a grown description keeps its workers and its price, and the new worker is idle") {
  const cluster_description file = testing::two_sites();
  const model_config cfg = llama_7b();
  training_setup setup;
  setup.global_batch = 32;
  const cluster_description five = present_workers(file, {"a0/1"});
  const plan running = make_plan(five, cfg, setup).best;
  REQUIRE(running.feasible);
  const cluster_description six = present_workers(file, {}, &five);
  const plan moved = renumber_plan(running, five, six);
  REQUIRE(moved.stages.size() == running.stages.size());
  for (std::size_t s = 0; s < moved.stages.size(); ++s) {
    REQUIRE(moved.stages[s].workers.size() == running.stages[s].workers.size());
    for (std::size_t r = 0; r < moved.stages[s].workers.size(); ++r)
      CHECK(six.workers[static_cast<std::size_t>(moved.stages[s].workers[r])].name ==
            five.workers[static_cast<std::size_t>(running.stages[s].workers[r])].name);
    if (running.stages[s].cluster >= 0)
      CHECK(six.clusters[static_cast<std::size_t>(moved.stages[s].cluster)].name ==
            five.clusters[static_cast<std::size_t>(running.stages[s].cluster)].name);
  }
  // a0/1, which joined, is idle (with whatever the plan left idle before).
  bool joined_idle = false;
  for (int r : moved.idle) joined_idle = joined_idle || six.workers[static_cast<std::size_t>(r)].name == "a0/1";
  CHECK(joined_idle);
  // The same layout on the same machines costs the same: the scheduler
  // prices the running plan on the grown description as it ran.
  const replan_advice a = advise_replan(six, moved, cfg, setup, 1000, 5.0);
  CHECK(a.current_s == doctest::Approx(running.step_s()).epsilon(1e-6));
  CHECK(a.next.feasible);
  // A plan over a worker the other description lacks cannot be numbered.
  const plan on_six = make_plan(six, cfg, setup).best;
  bool uses_a01 = false;
  for (const stage_plan& s : on_six.stages)
    for (int r : s.workers) uses_a01 = uses_a01 || six.workers[static_cast<std::size_t>(r)].name == "a0/1";
  if (uses_a01) CHECK_THROWS_WITH_AS(renumber_plan(on_six, six, five), doctest::Contains("'a0/1'"), model_error);
}
