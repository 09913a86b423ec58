// `corolla train --elastic` growing onto workers that join: `corolla train
// --join` from another address, killed, stopped or hung workers, and with
// --cluster machines joining as standby workers of the file or describing
// themselves; every step printed once, the single-process losses.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/node_control.hpp"
#include "actors/train_store.hpp"
#include "tests/apps/elastic_test_util.hpp"
#include "tests/apps/train_test_util.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/eventually.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;
using namespace corolla::testing::train_test;
using namespace corolla::testing::elastic_test;

/// Where the elastic launcher's lobby takes workers (its --json "lobby" event).
std::string wait_lobby(child_process& launcher) {
  const auto m = launcher.wait_line(std::regex(R"re("endpoint":"([^"]+)","event":"lobby")re"), std::chrono::seconds(60));
  REQUIRE(m);
  return (*m)[1];
}

/// A 1x2 elastic job of `j` that takes workers (a check every 3 steps);
/// `lobby` gets where they join.
child_process start_joinable(const job& j, int timeout_s, std::string& lobby, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--pp", "1", "--dp", "2", "--elastic", "--link-profile", "lat=4ms",
                                   "--join-check-every", "3", "--timeout-s", std::to_string(timeout_s)};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process launcher = child_process::corolla(train_args(j, args));
  lobby = wait_lobby(launcher);
  return launcher;
}

/// An elastic job of `j` (batch 4, `steps`) on the three-node file with
/// n1/0 and n2/0 on standby and a join check every 3 steps, plus `extra`
/// flags; `lobby` gets where machines join.
child_process start_standby_job(const temp_dir_guard& tmp, job& j, int steps, std::vector<std::string> extra,
                                std::string& lobby) {
  j.batch = 4;
  j.steps = steps;
  std::ofstream(tmp / "three.toml") << three_nodes_toml;
  std::vector<std::string> args = {"--cluster", (tmp / "three.toml").string(), "--elastic", "--standby", "n1/0,n2/0",
                                   "--join-check-every", "3", "--timeout-s", "60"};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process launcher = child_process::corolla(train_args(j, args));
  lobby = wait_lobby(launcher);
  return launcher;
}

/// A worker named w1 joining at `lobby` (its ranks listening on `listen`'s host).
/// With `tmpdir`, the worker's temporary directory (TMPDIR, where it
/// writes its rank's job file).
child_process start_worker(const std::string& lobby, const std::string& listen = "",
                           const std::filesystem::path& tmpdir = {}) {
  std::vector<std::string> args = {"train", "--join", lobby, "--join-name", "w1"};
  if (!listen.empty()) args.insert(args.end(), {"--listen", listen});
  if (tmpdir.empty()) return child_process::corolla(args);
  std::filesystem::create_directories(tmpdir);
  args.insert(args.begin(), {"TMPDIR=" + tmpdir.string(), COROLLA_BINARY});
  return child_process("/usr/bin/env", args);
}

/// A 1x2 job of `j` (start_joinable) grown to 1x3 onto a worker that
/// joined after step 4: the launcher and the worker.
std::pair<child_process, child_process> grown_onto_worker(const job& j, const std::filesystem::path& worker_tmpdir = {}) {
  std::string lobby;
  child_process launcher = start_joinable(j, 60, lobby);
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  child_process worker = start_worker(lobby, "", worker_tmpdir);
  REQUIRE(launcher.wait_line(std::regex(R"("reason":"workers joined")"), std::chrono::seconds(60)));
  return {std::move(launcher), std::move(worker)};
}

}  // namespace

TEST_CASE("--elastic: a worker joins a running job with corolla train --join from another address, the grid grows "
          "onto it at a step boundary without losing a step, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-join");
  const job j = slow_job(tmp, 80);  // enough steps left for a larger grid to pay for the switch
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  std::string lobby;
  // Two "machines" on loopback: the launcher at 127.0.0.3 (its coordinator
  // and ranks listen there too), the worker at 127.0.0.2.
  child_process launcher = start_joinable(j, 60, lobby, {"--join-listen", "tcp://127.0.0.3:0"});
  CHECK(lobby.rfind("tcp://127.0.0.3:", 0) == 0);
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  CHECK(rank_entry(launcher.lines(), 0)["endpoint"].get<std::string>().rfind("tcp://127.0.0.3:", 0) == 0);
  child_process worker = start_worker(lobby, "tcp://127.0.0.2:0");
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  INFO("worker: " << worker.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["reason"] == "workers joined");
  CHECK(events[0]["from"] == "1x2 [0,4)");
  CHECK(events[0]["to"] == "1x3 [0,4)");
  CHECK(events[0]["replayed_steps"] == 0);
  CHECK(events[0]["resume_from"].get<int>() % 3 == 0);
  // The drained ranks held the drain step in memory; the worker's rank
  // read its share from them (no checkpoint of the drain step).
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["bytes"].get<double>() > 0);
  // The worker ran rank 2 and left when released.
  const auto left = worker.wait(std::chrono::seconds(30));
  REQUIRE(left.has_value());
  CHECK(*left == 0);
  CHECK(worker.err().find("running rank 2 (listening on 127.0.0.2)") != std::string::npos);
  CHECK(worker.err().find("released") != std::string::npos);
  CHECK(rank_entry(launcher.lines(), 2)["endpoint"].get<std::string>().rfind("tcp://127.0.0.2:", 0) == 0);
  CHECK(rank_entry(launcher.lines(), 1)["endpoint"].get<std::string>().rfind("tcp://127.0.0.3:", 0) == 0);
}

TEST_CASE("--elastic: a joined worker killed while it runs a rank is a lost rank: the job shrinks again and keeps the "
          "single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-join-kill");
  const job j = slow_job(tmp, 80);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  // The "workers joined" line grown_onto_worker waits for comes after the
  // grown grid's first step: the worker's rank runs (it read its job file).
  auto [launcher, worker] = grown_onto_worker(j, tmp / "worker-tmp");
  ::kill(worker.pid(), SIGKILL);  // its rank (a child of the worker) dies with it
  const auto events = finished_replans(launcher, want);
  // The rank removed its job file once read: the worker killed leaves none.
  for (const auto& e : std::filesystem::directory_iterator(tmp / "worker-tmp"))
    CHECK(e.path().filename().string().rfind("corolla-joined-", 0) != 0);
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["to"] == "1x3 [0,4)");
  CHECK(events[1]["from"] == "1x3 [0,4)");
  CHECK(events[1]["lost_ranks"] == nlohmann::json::array({2}));
  CHECK(events[1]["to"] == "1x2 [0,4)");
  CHECK(events[1]["replayed_steps"].get<int>() <= 1);
}

TEST_CASE("--elastic: a joined worker killed before the grown grid's first step: the job goes back to the drained "
          "ranks, which still hold the drain step in memory, and loses no step") {
  temp_dir_guard tmp("mp-train-elastic-join-kill-early");
  const job j = slow_job(tmp, 24);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  // Slow links (20 ms): the grown grid's first step takes long enough to be hit before it ends.
  child_process launcher = child_process::corolla(train_args(
      j, {"--pp", "1", "--dp", "2", "--elastic", "--link-profile", "lat=20ms", "--join-check-every", "3", "--timeout-s",
          "60"}));
  const std::string lobby = wait_lobby(launcher);
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  child_process worker = start_worker(lobby);
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks","layout":"1x3)"), std::chrono::seconds(60)));
  ::kill(worker.pid(), SIGKILL);  // its rank (a child of the worker) dies with it
  const auto events = finished_replans(launcher, want);
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["reason"] == "workers joined");
  CHECK(events[0]["completed"] == false);  // the 1x3 grid failed before its first step
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[1]["from"] == "1x3 [0,4)");
  CHECK(events[1]["to"] == "1x2 [0,4)");
  CHECK(events[1]["lost_ranks"] == nlohmann::json::array({2}));
  CHECK(events[1]["completed"] == true);
  // The drained 1x2 ranks still held the drain step: read from them again, nothing replayed.
  CHECK(events[1]["from_memory"] == true);
  CHECK(events[1]["resume_from"] == events[0]["resume_from"]);
  CHECK(events[1]["replayed_steps"] == 0);
  CHECK(launcher.err().find("still held in memory") != std::string::npos);
}

TEST_CASE("--elastic: a joined worker's rank stopped (SIGSTOP) is killed by its worker after 2 s, a lost rank "
          "found before the peers' 10 s timeout, and the worker is taken again") {
  temp_dir_guard tmp("mp-train-elastic-join-stop");
  const job j = slow_job(tmp, 80);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  auto [launcher, worker] = grown_onto_worker(j);
  const std::vector<pid_t> rank = children_with_arg(worker.pid(), {"--rank"});
  REQUIRE(rank.size() == 1u);
  ::kill(rank[0], SIGSTOP);
  const int status = finish(launcher);
  ::kill(rank[0], SIGKILL);  // the worker killed it already; nothing may be left stopped
  INFO("stderr: " << launcher.err() << "\nworker: " << worker.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  CHECK(worker.err().find("rank 2 has been stopped (SIGSTOP or a debugger) for ") != std::string::npos);
  const auto events = replans(launcher.lines());
  // The worker itself is well: it stays in the pool, and the job may grow
  // onto it again (when the steps left still pay for the switch).
  REQUIRE(events.size() >= 2u);
  REQUIRE(events.size() <= 3u);
  CHECK(events[1]["from"] == "1x3 [0,4)");
  CHECK(events[1]["lost_ranks"] == nlohmann::json::array({2}));
  CHECK(events[1]["reason"].get<std::string>().find("rank 2 (stage 0, replica 2, blocks 0..3) is down") !=
        std::string::npos);
  CHECK(events[1]["to"] == "1x2 [0,4)");
  if (events.size() == 3u) CHECK(events[2]["to"] == "1x3 [0,4)");
}

TEST_CASE("--elastic: a worker that hangs after joining the pool never starts its rank: the lobby sees it go, the job "
          "fails over at once instead of waiting for the join timeout") {
  temp_dir_guard tmp("mp-train-elastic-join-hang");
  const job j = slow_job(tmp, 80);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  std::string lobby;
  child_process launcher = start_joinable(j, 120, lobby);
  REQUIRE(launcher.wait_line(std::regex(R"("step":3\b)"), std::chrono::seconds(60)));
  child_process worker = start_worker(lobby);
  // Stopped once it is in the pool: it is still there at the next check (the
  // peer timeout is 10 s), so the job grows onto a worker that never acts.
  eventually([&] { return launcher.err().find("worker w1") != std::string::npos; }, std::chrono::seconds(60));
  ::kill(worker.pid(), SIGSTOP);
  const int status = finish(launcher);
  ::kill(worker.pid(), SIGKILL);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["completed"] == false);  // the grown grid never made its first step
  CHECK(events[1]["lost_ranks"] == nlohmann::json::array({2}));
  CHECK(events[1]["reason"].get<std::string>().find("its worker w1 left the pool") != std::string::npos);
  CHECK(events[1]["to"] == "1x2 [0,4)");
  CHECK(events[1]["replayed_steps"] == 0);
}

namespace {

/// Both machines left when released (status 0); `waited` never ran a rank.
void check_released(child_process& ran, child_process& waited) {
  for (child_process* w : {&ran, &waited}) {
    const auto left = w->wait(std::chrono::seconds(30));
    REQUIRE(left.has_value());
    CHECK(*left == 0);
  }
  CHECK(waited.err().find("running rank") == std::string::npos);
}

/// A `--cluster` job (from 1x1) that grew onto worker `name` when a
/// machine joined, with `want`'s losses: one re-plan, its cost model's
/// price better, the rank on `name` run by `machine`.
void check_grew_onto(child_process& launcher, child_process& machine, const std::string& name,
                     const std::vector<float>& want) {
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  INFO("machine: " << machine.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  const auto& e = events[0];
  CHECK(e["reason"] == "workers joined");
  REQUIRE(e["changes"].size() == 1u);
  CHECK(e["changes"][0] == "worker(s) " + name + " joined");
  CHECK(e["from"] == "1x1 [0,4)");
  CHECK(e["to"] != e["from"]);
  CHECK(e["replayed_steps"] == 0);
  CHECK(e["completed"] == true);
  CHECK(e["from_memory"] == true);  // the drained rank held the drain step
  CHECK(e["predicted_step_s"][0].get<double>() > e["predicted_step_s"][1].get<double>());
  nlohmann::json on;
  for (int r = 0; r < 3; ++r)
    if (const nlohmann::json x = rank_entry(launcher.lines(), r); x.is_object() && x.value("worker", "") == name) on = x;
  REQUIRE(on.is_object());
  CHECK(on.value("joined", false));
  CHECK(machine.err().find("running rank " + std::to_string(on["rank"].get<int>())) != std::string::npos);
}

}  // namespace

TEST_CASE("--elastic --cluster --standby: a machine joins as a standby worker of the file, the planner's plan with "
          "it pays off, the job moves onto it at a step boundary, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-cluster-join");
  job j = fresh_gpt2_job(tmp);
  std::string lobby;
  child_process launcher = start_standby_job(tmp, j, 60, {}, lobby);
  // A machine that offers itself as a worker that is there (n0/0) waits;
  // one that is the standby n1/0 joins, at the first check (step 3) or a
  // later one. They start now: the reference run below loads the machine,
  // and a job of 60 fast steps could end before machines started after it
  // reach the pool.
  child_process stranger = child_process::corolla({"train", "--join", lobby, "--join-name", "n0/0"});
  child_process worker = child_process::corolla({"train", "--join", lobby, "--join-name", "n1/0"});
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  // The new plan has a rank on n1/0, and the joined machine ran it.
  check_grew_onto(launcher, worker, "n1/0", want);
  const std::string err = launcher.err();
  CHECK(err.find("worker(s) n1/0 offer(s) to join") != std::string::npos);
  CHECK(err.find("elastic: worker n0/0 (node") != std::string::npos);
  CHECK(err.find("re-planned with the workers that joined: plan:") != std::string::npos);
  check_released(worker, stranger);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}

TEST_CASE("--elastic --cluster: a machine the file does not describe joins with --join-machine, the planner's plan "
          "with it pays off, the job moves onto it, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-cluster-machine");
  job j = fresh_gpt2_job(tmp);
  // n9: a node of the file's site like the others, described by the machine itself.
  std::ofstream(tmp / "n9.toml") << "cluster = \"site\"\nname = \"n9\"\nnic = \"ethernet\"\n[[worker]]\nkind = "
                                    "\"cpu\"\ntflops = 0.00002\nmemory_gib = 4\n";
  std::ofstream(tmp / "far.toml") << "cluster = \"elsewhere\"\nname = \"n8\"\nnic = \"ethernet\"\n[[worker]]\n"
                                     "kind = \"cpu\"\ntflops = 1\nmemory_gib = 4\n";
  // A bad description is refused before the worker joins anything.
  check_one_error(run_corolla({"train", "--join", "tcp://127.0.0.1:1", "--join-machine", (tmp / "n9.toml").string(),
                               "--join-name", "n1/0"}),
                  "--join-name n1/0: the machine " + (tmp / "n9.toml").string() + " describes runs as n9/0");
  std::string lobby;
  child_process launcher = start_standby_job(tmp, j, 60, {}, lobby);
  child_process far = child_process::corolla({"train", "--join", lobby, "--join-machine", (tmp / "far.toml").string()});
  child_process worker = child_process::corolla({"train", "--join", lobby, "--join-machine", (tmp / "n9.toml").string()});
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  check_grew_onto(launcher, worker, "n9/0", want);
  const std::string err = launcher.err();
  CHECK(err.find("elastic: worker n9/0 (node") != std::string::npos);
  CHECK(err.find("describing its machine") != std::string::npos);
  CHECK(err.find("worker n8/0 (node") != std::string::npos);
  CHECK(err.find("cannot join: ") != std::string::npos);
  CHECK(err.find("unknown cluster 'elsewhere'") != std::string::npos);
  check_released(worker, far);
}

TEST_CASE("--elastic --cluster: the rank of a joined machine killed, its worker is absent again, the job continues "
          "without it and takes the machine back at a later check, with the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-cluster-rejoin");
  job j = fresh_gpt2_job(tmp);
  std::string lobby;
  child_process launcher = start_standby_job(tmp, j, 120, {"--link-profile", "lat=2ms"}, lobby);
  // The machine starts at once: the reference run below loads this machine,
  // and the job's first grid (one rank, no links) could end before a
  // machine started after it reaches the pool.
  child_process worker = child_process::corolla({"train", "--join", lobby, "--join-name", "n1/0"});
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  INFO("stderr: " << launcher.err());
  REQUIRE(launcher.wait_line(std::regex(R"("reason":"workers joined")"), std::chrono::seconds(60)));
  // The joined machine's rank (its child), not the machine: it stays pooled.
  std::vector<pid_t> rank;
  for (int i = 0; i < 500 && rank.empty(); ++i) {
    rank = children_with_arg(worker.pid(), {"--rank"});
    if (rank.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(rank.size() == 1u);
  ::kill(rank[0], SIGKILL);
  const int status = finish(launcher);
  INFO("worker: " << worker.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 3u);
  CHECK(events[0]["reason"] == "workers joined");
  CHECK(events[1]["lost_ranks"].size() == 1u);
  CHECK(events[1]["to"] == "1x1 [0,4)");
  CHECK(events[1]["ranks"] == 1);  // n0/0 left to plan on
  CHECK(events[1]["replayed_steps"].get<int>() <= 1);
  CHECK(events[2]["reason"] == "workers joined");
  CHECK(events[2]["changes"][0] == "worker(s) n1/0 joined");
  CHECK(events[2]["from"] == "1x1 [0,4)");
  const auto left = worker.wait(std::chrono::seconds(30));
  REQUIRE(left.has_value());
  CHECK(*left == 0);
}
