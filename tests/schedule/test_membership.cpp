// schedule/membership: the present workers of a cluster file (standby and
// lost ones left out, what was measured carried over), and plans numbered
// again for a description that gained workers.
#include <doctest/doctest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

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

TEST_CASE("a machine the file does not describe describes itself in the file's terms: its node joins a cluster, its "
          "one worker comes last, and descriptions that do not fit are refused with the reason") {
  const cluster_description file = testing::two_sites();  // a0/0 a0/1 a1/0 a1/1 | b/0 b/1
  const char* c0 = R"(
cluster = "a"
name = "c0"
nic = "ib"
  [[worker]]
  model = "gpu"
  tflops = 50
  memory_gib = 40
)";
  const cluster_description grown = with_machine(file, c0, "machine c0");
  REQUIRE(grown.size() == 7);
  const worker_spec& c = grown.workers.back();
  CHECK(c.name == "c0/0");
  CHECK(c.rank == 6);
  CHECK(c.flops == doctest::Approx(50e12));
  CHECK(grown.clusters[static_cast<std::size_t>(c.cluster)].name == "a");
  CHECK(grown.nics[static_cast<std::size_t>(c.nic)].name == "ib");
  // Priced as a node of its cluster and class: IB to a0/0, the WAN to b/0.
  CHECK(grown.link_between(6, 0).bandwidth == doctest::Approx(grown.link_between(2, 0).bandwidth));
  CHECK(grown.link_between(6, 4).bandwidth == doctest::Approx(grown.link_between(0, 4).bandwidth));
  CHECK(names(file).count("c0/0") == 0);  // the file itself is unchanged

  auto refused = [&](const std::string& toml, const std::string& why) {
    CAPTURE(toml);
    CHECK_THROWS_WITH_AS(with_machine(file, toml, "machine x"), doctest::Contains(why.c_str()), model_error);
  };
  refused("cluster = 'z'\nname = 'c1'\nnic = 'ib'\n[[worker]]\ntflops = 1\nmemory_gib = 1\n",
          "unknown cluster 'z' (the file has 'a', 'b')");
  refused("cluster = 'a'\nname = 'b'\nnic = 'ib'\n[[worker]]\ntflops = 1\nmemory_gib = 1\n",
          "node name 'b' is the file's already");
  refused("cluster = 'a'\nname = 'c1'\nnic = 'ib'\n[[worker]]\ntflops = 1\nmemory_gib = 1\ncount = 2\n",
          "describe exactly one worker");
  refused("cluster = 'a'\nname = 'c1'\nnic = 'fddi'\n[[worker]]\ntflops = 1\nmemory_gib = 1\n", "unknown NIC class 'fddi'");
  refused("cluster = 'a'\nname = 'c1'\nnic = 'ib'\ncount = 3\n[[worker]]\ntflops = 1\nmemory_gib = 1\n",
          "count");
  refused("cluster = 'a'\nname = 'c1'\nnic = 'ib'\n", "no workers");
  refused("cluster = 'a'\nname = [", "invalid TOML");
}

TEST_CASE("membership: a machine that describes itself becomes an absent worker of the file and joins, and one whose "
          "description does not fit waits with the reason, once") {
  cluster_members m(testing::two_sites(), {"b/1"});
  const std::string c0 = "cluster = 'b'\nname = 'c0'\nnic = 'roce'\n[[worker]]\ntflops = 100\nmemory_gib = 80\n";
  std::vector<std::string> waits;
  const std::vector<machine_offer> pool = {{"n-1", "c0/0", c0},
                                           {"n-2", "c1/0", "cluster = 'nowhere'\nname = 'c1'\nnic = 'ib'\n"},
                                           {"n-3", "c2/0", c0}};  // c0's description under another name
  const auto joining = m.candidates(pool, &waits);
  REQUIRE(joining.size() == 1u);
  CHECK(joining[0].name == "c0/0");
  CHECK(m.file().size() == 7);
  CHECK(m.absent().count("c0/0") == 1);
  REQUIRE(waits.size() == 2u);
  CHECK(waits[0].find("worker c1/0 (node n-2) cannot join: ") != std::string::npos);
  CHECK(waits[0].find("unknown cluster 'nowhere'") != std::string::npos);
  CHECK(waits[1].find("worker c2/0 (node n-3) cannot join: ") != std::string::npos);
  CHECK(waits[1].find("node name 'c0' is the file's already") != std::string::npos);
  // The grown file's present description has it once it joined.
  const cluster_description before = m.present();
  CHECK(names(before).count("c0/0") == 0);
  CHECK(names(m.with_joined(joining, before)).count("c0/0") == 1);
  m.join(joining);
  CHECK(names(m.present()).count("c0/0") == 1);
  REQUIRE(m.machine_of("c0/0") != nullptr);
  CHECK(m.machine_of("c0/0")->node_id == "n-1");
  // Told once: the same pool again adds no lines.
  waits.clear();
  CHECK(m.candidates(pool, &waits).empty());
  CHECK(waits.empty());
}
