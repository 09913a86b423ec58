// `corolla train --pp P --dp D --elastic`: rank processes killed (SIGKILL)
// or hung (SIGSTOP) mid-run; the launcher re-plans the grid on the ranks
// left, continues from the survivors' in-memory snapshots (else the last
// checkpoint, or the start) re-sharded, prints every step once, and the
// losses equal the single-process run.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
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

namespace {

using namespace corolla;
using namespace corolla::testing;
using namespace corolla::testing::train_test;
using namespace corolla::testing::elastic_test;

/// The pid of the launcher's rank process `rank` of the current grid, from
/// its last "ranks" event (after a failure the survivors of the grid before
/// run on a while as holders of its snapshots, with their old --rank).
pid_t rank_pid(const child_process& launcher, int rank) {
  pid_t pid = -1;
  for (const std::string& l : launcher.lines()) {
    const auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_object() || j.value("event", "") != "ranks") continue;
    for (const auto& r : j.at("ranks"))
      if (r.at("rank") == rank) pid = r.at("pid").get<pid_t>();
  }
  REQUIRE(pid > 0);
  return pid;
}

/// Runs an elastic job (`args`), sends `sig` to each of `ranks` once step
/// `after` is printed, and checks that the job finished with every step
/// printed once and equal to `want` within 1e-5; returns its re-plan
/// events and its stderr.
struct faulted {
  std::vector<nlohmann::json> events;
  std::string err;
};
faulted faulted_run(const std::vector<std::string>& args, int after, const std::vector<int>& ranks,
                                        int sig, const std::vector<float>& want) {
  child_process launcher = child_process::corolla(args);
  REQUIRE(launcher.wait_line(std::regex("\"step\":" + std::to_string(after) + "\\b"), std::chrono::seconds(60)));
  std::vector<pid_t> pids;
  for (int r : ranks) pids.push_back(rank_pid(launcher, r));
  for (pid_t p : pids) ::kill(p, sig);
  const int status = finish(launcher);
  for (pid_t p : pids) ::kill(p, SIGKILL);  // the launcher killed a stopped one already; nothing may be left stopped
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
  return {replans(launcher.lines()), launcher.err()};
}

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
child_process start_worker(const std::string& lobby, const std::string& listen = "") {
  std::vector<std::string> args = {"train", "--join", lobby, "--join-name", "w1"};
  if (!listen.empty()) args.insert(args.end(), {"--listen", listen});
  return child_process::corolla(args);
}

/// A 1x2 job of `j` (start_joinable) grown to 1x3 onto a worker that
/// joined after step 4: the launcher and the worker.
std::pair<child_process, child_process> grown_onto_worker(const job& j) {
  std::string lobby;
  child_process launcher = start_joinable(j, 60, lobby);
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  child_process worker = start_worker(lobby);
  REQUIRE(launcher.wait_line(std::regex(R"("reason":"workers joined")"), std::chrono::seconds(60)));
  return {std::move(launcher), std::move(worker)};
}

}  // namespace

TEST_CASE("--elastic: two ranks killed in one run, the job re-plans twice, continues from the survivors' in-memory "
          "snapshots without losing a step and keeps the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-kill");
  const job j = slow_job(tmp, 40);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const fs::path ck = tmp / "ck";
  child_process launcher = child_process::corolla(elastic_args(j, {"--checkpoint-dir", ck, "--checkpoint-every", "3"}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":5\b)"), std::chrono::seconds(60)));
  ::kill(rank_pid(launcher, 3), SIGKILL);  // 2x2 -> 1x3
  REQUIRE(launcher.wait_line(std::regex(R"("event":"replan")"), std::chrono::seconds(60)));
  REQUIRE(launcher.wait_line(std::regex(R"("step":1[3-9]\b)"), std::chrono::seconds(60)));
  // The 2x2 grid's survivors held their snapshots until the 1x3 grid had
  // read them and completed a step: only the 1x3 grid's processes are left.
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).size() == 3u);
  ::kill(rank_pid(launcher, 1), SIGKILL);  // 1x3 -> 1x2
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  // Every step exactly once, in order, each equal to one process's.
  check_close(json_steps(launcher.lines()), want, 1e-5);
  // Memory to memory: the survivors kept their snapshots in their
  // processes, the new ranks read them over the links, nothing on disk.
  CHECK(launcher.err().find("rank(s) hold them in memory") != std::string::npos);
  CHECK_FALSE(fs::exists(ck / "memory"));
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["from"] == "2x2 [0,2) [2,4)");
  CHECK(events[0]["to"] == "1x3 [0,4)");
  CHECK(events[0]["lost_ranks"] == nlohmann::json::array({3}));
  CHECK(events[0]["completed"] == true);
  // From memory: at most the step in flight is computed again (a copy
  // still on its way to the buddy when the rank died costs one more).
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  CHECK(events[0]["resume_from"].get<int>() >= 4);
  CHECK(events[0]["bytes"].get<double>() > 0);
  CHECK(events[1]["from"] == "1x3 [0,4)");
  CHECK(events[1]["to"] == "1x2 [0,4)");
  CHECK(events[1]["lost_ranks"] == nlohmann::json::array({1}));
  // A checkpoint of the same step as the newest complete snapshot is used as it is.
  if (events[1]["resume_from"].get<int>() % 3 != 0) CHECK(events[1]["from_memory"] == true);
  CHECK(events[1]["replayed_steps"].get<int>() <= 1);
  CHECK(events[1]["resume_from"].get<int>() >= 12);
  CHECK(events[1]["reason"].get<std::string>().find("rank 1 (stage 0, replica 1") != std::string::npos);
  // Each new grid ran in its survivors' processes: no rank process started.
  const auto grids = grid_pids(launcher.lines());
  REQUIRE(grids.size() == 3u);
  CHECK(grids[1].size() == 3u);
  for (pid_t p : grids[1]) CHECK(grids[0].count(p) == 1u);
  CHECK(grids[2].size() == 2u);
  for (pid_t p : grids[2]) CHECK(grids[1].count(p) == 1u);
  // No rank outlives the launcher; the job's last checkpoint is the 1x2 grid's.
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
  CHECK(checkpoint_layout(ck, latest_checkpoint_step(ck)) == "1x2 [0,4)");
}

TEST_CASE("--elastic: a hung rank (SIGSTOP) is a failure too: without snapshots or checkpoints the job starts over on "
          "the ranks left with the same losses") {
  temp_dir_guard tmp("mp-train-elastic-hang");
  const job j = slow_job(tmp, 20);
  const auto [events, err] = faulted_run(elastic_args(j, {"--snapshot-every", "0"}), 3, {2}, SIGSTOP,
                                  reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["lost_ranks"] == nlohmann::json::array({2}));
  CHECK(events[0]["resume_from"] == 0);
  CHECK(events[0]["replayed_steps"].get<int>() >= 3);
  CHECK(events[0]["to"] == "1x3 [0,4)");
  // Found stopped by the launcher after 2 s, not by its peers' 10 s timeout.
  CHECK(events[0]["reason"].get<std::string>().find("rank 2 (stage 1, replica 0, blocks 2..3) is stopped (process "
                                                    "state T") != std::string::npos);
}

TEST_CASE("--elastic: a hung rank's state comes from its buddy's memory too: the launcher kills it, the survivors "
          "flush, and no step is lost") {
  temp_dir_guard tmp("mp-train-elastic-hang-memory");
  const job j = slow_job(tmp, 16);
  const auto [events, err] = faulted_run(elastic_args(j, {}), 3, {1}, SIGSTOP, reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["lost_ranks"] == nlohmann::json::array({1}));
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  CHECK(events[0]["reason"].get<std::string>().find(") is stopped (process state T: SIGSTOP or a debugger) for ") !=
        std::string::npos);
}

TEST_CASE("--elastic, one replica per stage: the dead stage's parameters and moments come from the next stage's "
          "memory, no step is lost") {
  temp_dir_guard tmp("mp-train-elastic-pp");
  const job j = slow_job(tmp, 16);
  // Stage 0, the head's first holder: 2x1 -> 1x1.
  const auto [events, err] = faulted_run(
      train_args(j, {"--pp", "2", "--dp", "1", "--elastic", "--link-profile", "lat=4ms", "--timeout-s", "60"}), 4, {0},
      SIGKILL, reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["from"] == "2x1 [0,2) [2,4)");
  CHECK(events[0]["to"] == "1x1 [0,4)");
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  CHECK(events[0]["resume_from"].get<int>() >= 3);
}

TEST_CASE("--elastic on 1x4 and 3x2: a rank killed, recovered from memory, the single-process losses") {
  for (const auto& [pp, dp, victim] : std::vector<std::tuple<int, int, int>>{{1, 4, 2}, {3, 2, 3}}) {
    CAPTURE(pp);
    CAPTURE(dp);
    temp_dir_guard tmp("mp-train-elastic-layouts");
    const job j = slow_job(tmp, 16);
    const auto [events, err] = faulted_run(
        train_args(j, {"--pp", std::to_string(pp), "--dp", std::to_string(dp), "--elastic", "--link-profile", "lat=4ms",
                       "--timeout-s", "60"}),
        5, {victim}, SIGKILL, reference_losses(j, fresh_gpt2(j)));
    REQUIRE(events.size() == 1u);
    CHECK(events[0]["lost_ranks"] == nlohmann::json::array({victim}));
    CHECK(events[0]["from_memory"] == true);
    CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  }
}

TEST_CASE("--elastic with dynamic loss scaling: the scaler's state comes back from the survivors' memory") {
  temp_dir_guard tmp("mp-train-elastic-scale");
  const job j = slow_job(tmp, 12);
  const auto [events, err] = faulted_run(elastic_args(j, {"--loss-scale", "dynamic"}), 4, {2}, SIGKILL,
                                         reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["to"] == "1x3 [0,4)");
}

TEST_CASE("--elastic --snapshot-every auto: copies that take more than a fifth of a step lengthen the interval, and a "
          "rank killed after that is recovered with the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-auto");
  const job j = slow_job(tmp, 30);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  // Links of 4 Mbit/s: a rank's copy of its moments takes about as long as
  // a step. A verdict every 2 steps.
  child_process launcher = child_process::corolla(
      train_args(j, {"--pp", "2", "--dp", "2", "--elastic", "--link-profile", "lat=4ms,bw=4Mbit", "--snapshot-every",
                     "auto", "--join-check-every", "2", "--timeout-s", "60"}));
  const auto m = launcher.wait_line(std::regex(R"re("event":"snapshot_every","every":(\d+),"step":(\d+))re"),
                                    std::chrono::seconds(90));
  REQUIRE_MESSAGE(m, "stderr: " << launcher.err());
  const int every = std::stoi((*m)[1]), at = std::stoi((*m)[2]);
  MESSAGE("in-memory snapshots every " << every << " step(s) after step " << at);
  CHECK(every > 1);
  CHECK(at % 2 == 0);  // chosen at a verdict step
  // A few steps on the longer interval, then rank 3 goes.
  REQUIRE(launcher.wait_line(std::regex("\"step\":" + std::to_string(at + 3) + "\\b"), std::chrono::seconds(90)));
  ::kill(rank_pid(launcher, 3), SIGKILL);
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() >= 1u);
  CHECK(events[0]["lost_ranks"] == nlohmann::json::array({3}));
  CHECK(events[0]["completed"] == true);
  // The newest complete snapshot is at most an interval (and a copy in
  // flight) behind: at most `every` steps computed again.
  CHECK(events[0]["replayed_steps"].get<int>() <= every);
  CHECK(launcher.err().find("elastic: in-memory snapshots every " + std::to_string(every) + " step(s) after step " +
                            std::to_string(at)) != std::string::npos);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
  std::smatch line;
  const std::string err = launcher.err();
  if (std::regex_search(err, line, std::regex("elastic: in-memory snapshots every[^\n]*"))) MESSAGE(line.str());
  MESSAGE("first re-plan: " << events[0].dump());
}

TEST_CASE("--elastic: a failure during a re-plan (a rank of the new grid killed before its first step) still loses no "
          "step") {
  temp_dir_guard tmp("mp-train-elastic-during");
  const job j = slow_job(tmp, 16);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  // Slow links (20 ms): the new grid's first step takes long enough to be hit before it ends.
  child_process launcher = child_process::corolla(
      train_args(j, {"--pp", "2", "--dp", "2", "--elastic", "--link-profile", "lat=20ms", "--timeout-s", "60"}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":5\b)"), std::chrono::seconds(60)));
  ::kill(rank_pid(launcher, 3), SIGKILL);  // 2x2 -> 1x3
  // The new grid's ranks joined; before its first step, one of them dies too.
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks","layout":"1x3)"), std::chrono::seconds(60)));
  ::kill(rank_pid(launcher, 0), SIGKILL);  // 1x3 -> 1x2
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["completed"] == false);  // the 1x3 grid failed before its first step
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[1]["from"] == "1x3 [0,4)");
  CHECK(events[1]["to"] == "1x2 [0,4)");
  CHECK(events[1]["completed"] == true);
  // Its own snapshots had nothing yet: the step the first recovery assembled is the checkpoint.
  CHECK(events[1]["resume_from"] == events[0]["resume_from"]);
  CHECK(events[1]["replayed_steps"].get<int>() <= 1);
}

/// Whether process `pid` exists and has not ended (a zombie has).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' && line[close + 2] != 'X';
}

TEST_CASE("--elastic: the launcher (the coordinator) killed mid-run, then the launcher that took over: each time a "
          "rank process starts a new one, which carries the job on in the same processes from their memory; every "
          "step printed once, the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-takeover");
  const job j = slow_job(tmp, 18);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  child_process launcher = child_process::corolla(elastic_args(j, {}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":5\b)"), std::chrono::seconds(60)));
  const std::set<pid_t> first = grid_pids(launcher.lines()).front();
  REQUIRE(first.size() == 4u);
  launcher.signal(SIGKILL);
  // The rank processes and the new launcher write to the same stdout.
  const auto took = launcher.wait_line(std::regex(R"re("event":"takeover"[^}]*"pid":(\d+))re"), std::chrono::seconds(60));
  REQUIRE(took);
  const pid_t second = static_cast<pid_t>(std::stoi((*took)[1]));
  REQUIRE(launcher.wait_line(std::regex(R"("step":11\b)"), std::chrono::seconds(60)));
  ::kill(second, SIGKILL);
  // Read to its end (the killed launchers' statuses say nothing more).
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(180));
  const std::string err = launcher.err();
  INFO("stderr: " << err);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  // A re-plan per launcher lost, no rank lost, the same grid again in the
  // same processes, from what they hold in memory.
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["reason"].get<std::string>().find("the launcher (the coordinator, pid " +
                                                    std::to_string(launcher.pid()) + ") died") != std::string::npos);
  CHECK(events[1]["reason"].get<std::string>().find("the launcher (the coordinator, pid " + std::to_string(second) +
                                                    ") died") != std::string::npos);
  for (const auto& e : events) {
    CHECK(e["lost_ranks"] == nlohmann::json::array());
    CHECK(e["to"] == "2x2 [0,2) [2,4)");
    CHECK(e["from_memory"] == true);
    CHECK(e["completed"] == true);
    CHECK(e["replayed_steps"].get<int>() <= 1);
  }
  const auto grids = grid_pids(launcher.lines());
  REQUIRE(grids.size() == 3u);
  CHECK(grids[1] == first);
  CHECK(grids[2] == first);
  // The last launcher's summary counts the job's steps and both re-plans;
  // then nothing of the job is left running.
  nlohmann::json summary;
  for (const std::string& l : launcher.lines()) {
    const auto e = nlohmann::json::parse(l, nullptr, false);
    if (e.is_object() && e.contains("replans") && e.contains("tokens_per_s")) summary = e;
  }
  REQUIRE(summary.is_object());
  CHECK(summary["replans"].size() == 2u);
  std::smatch m;
  REQUIRE(std::regex_search(err, m, std::regex(R"(this one \(pid (\d+)\) carries the job on with 4)")));
  std::vector<pid_t> launchers;  // those that took over
  const std::regex taking(R"(this one \(pid (\d+)\))");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), taking); it != std::sregex_iterator(); ++it)
    launchers.push_back(static_cast<pid_t>(std::stoi((*it)[1])));
  REQUIRE(launchers.size() == 2u);
  CHECK(launchers[0] == second);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto any_alive = [&] {
    return std::any_of(launchers.begin(), launchers.end(), alive) || std::any_of(first.begin(), first.end(), alive);
  };
  while (any_alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(any_alive());
}

TEST_CASE("--elastic: a launcher stopped on purpose (SIGTERM) ends its ranks, which no longer die with it by "
          "themselves, and nobody takes over") {
  temp_dir_guard tmp("mp-train-elastic-sigterm");
  const job j = slow_job(tmp, 40);
  child_process launcher = child_process::corolla(elastic_args(j, {}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":3\b)"), std::chrono::seconds(60)));
  const std::set<pid_t> ranks = grid_pids(launcher.lines()).front();
  launcher.signal(SIGTERM);
  REQUIRE(launcher.wait(std::chrono::seconds(10)) == -SIGTERM);
  // stdout closes: no rank and no new launcher holds it.
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(20));
  // (A killed process closes its files a moment before it is gone.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto any_alive = [&] { return std::any_of(ranks.begin(), ranks.end(), alive); };
  while (any_alive() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(any_alive());
  CHECK(launcher.err().find("carries the job on") == std::string::npos);
  for (const std::string& l : launcher.lines()) CHECK(l.find(R"("step":40)") == std::string::npos);
}

TEST_CASE("--elastic: a rank and its buddy killed together take state that exists nowhere else: the job falls back "
          "to the last checkpoint by itself") {
  temp_dir_guard tmp("mp-train-elastic-buddies");
  const job j = slow_job(tmp, 16);
  // Ranks 2 and 3 (stage 1) keep each other's copies.
  const auto [events, err] =
      faulted_run(elastic_args(j, {"--checkpoint-dir", tmp / "ck", "--checkpoint-every", "3"}), 4, {2, 3}, SIGKILL,
                  reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  // Both, or the first the launcher saw (the other's process is fresh on the new grid anyway).
  REQUIRE_FALSE(events[0]["lost_ranks"].empty());
  for (const auto& r : events[0]["lost_ranks"]) CHECK((r == 2 || r == 3));
  CHECK(events[0]["from_memory"] == false);
  CHECK(events[0]["resume_from"].get<int>() % 3 == 0);
  CHECK(events[0]["resume_from"].get<int>() >= 3);
  CHECK(err.find("no complete in-memory snapshot") != std::string::npos);
}

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
  auto [launcher, worker] = grown_onto_worker(j);
  ::kill(worker.pid(), SIGKILL);  // its rank (a child of the worker) dies with it
  const auto events = finished_replans(launcher, want);
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
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (launcher.err().find("worker w1") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

TEST_CASE("--elastic stops with one clear error when fewer than --min-ranks remain, and bad combinations are refused") {
  temp_dir_guard tmp("mp-train-elastic-min");
  const job j = slow_job(tmp, 1000);
  child_process launcher = child_process::corolla(elastic_args(j, {"--min-ranks", "4"}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":2\b)"), std::chrono::seconds(60)));
  ::kill(rank_pid(launcher, 0), SIGKILL);
  const int status = finish(launcher);
  CHECK(status == 1);
  CHECK(launcher.err().find("3 rank(s) left, fewer than --min-ranks 4") != std::string::npos);
  CHECK(launcher.err().find("rank 0 (stage 0, replica 0") != std::string::npos);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());

  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--dp", "2", "--elastic", "--min-ranks", "0"})),
                  "--min-ranks must be at least 1");
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--elastic", "--rank", "0", "--coordinator", "127.0.0.1:1"})),
                  "--elastic is for the local launcher");
  // Workers from other machines: an address they can reach, and a shared checkpoint directory.
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--elastic", "--join-check-every", "3", "--join-listen",
                                             "tcp://0.0.0.0:0"})),
                  "give the address other machines reach this one at");
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--elastic", "--join-check-every", "3", "--join-listen",
                                             "tcp://10.1.2.3:0"})),
                  "takes workers from other machines: give --checkpoint-dir on a file system every machine shares");
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--dp", "2", "--elastic", "--snapshot-every", "often"})),
                  "--snapshot-every must be a number of steps >= 0 or 'auto', got 'often'");
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--dp", "2", "--elastic", "--snapshot-every", "-2"})),
                  "--snapshot-every must be a number of steps >= 0 or 'auto', got '-2'");
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--dp", "2", "--snapshot-every", "auto"})),
                  "--snapshot-every keeps in-memory snapshots for --elastic to recover from: add --elastic");
  // --standby: workers of a --cluster file, for an --elastic job.
  std::ofstream(tmp / "three.toml") << three_nodes_toml;
  const std::string three = (tmp / "three.toml").string();
  check_one_error(run_corolla(train_args(j, {"--pp", "2", "--elastic", "--standby", "n1/0"})),
                  "--standby names workers of a --cluster file: add --cluster");
  check_one_error(run_corolla(train_args(j, {"--cluster", three, "--standby", "n1/0"})),
                  "--standby names workers that join an --elastic job later: add --elastic");
  check_one_error(run_corolla(train_args(j, {"--cluster", three, "--elastic", "--standby", "n7/0"})),
                  "has no worker 'n7/0'");
  check_one_error(run_corolla(train_args(j, {"--cluster", three, "--elastic", "--standby", "n0/0,n1/0,n2/0"})),
                  "--standby names every worker of");
}

TEST_CASE("--elastic with --cluster: the planner re-plans on the machines left; the launcher killed after that, the "
          "one that takes over plans on those machines too, not on the file; the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-cluster");
  job j = fresh_gpt2_job(tmp);
  j.batch = 4;
  j.steps = 40;
  std::ofstream(tmp / "two.toml") << two_clusters_toml;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const fs::path ck = tmp / "ck";
  child_process launcher = child_process::corolla(train_args(
      j, {"--cluster", tmp / "two.toml", "--pp", "2", "--dp", "2", "--elastic", "--checkpoint-dir", ck,
          "--checkpoint-every", "3", "--timeout-s", "60"}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  ::kill(rank_pid(launcher, 3), SIGKILL);  // a worker of the slow cluster: 3 workers left
  REQUIRE(launcher.wait_line(std::regex(R"("event":"replan")"), std::chrono::seconds(60)));
  REQUIRE(launcher.wait_line(std::regex(R"("step":12\b)"), std::chrono::seconds(60)));
  launcher.signal(SIGKILL);
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(180));  // to the end of the job
  const std::string err = launcher.err();
  INFO("stderr: " << err);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 2u);
  CHECK(events[0]["from"].get<std::string>().rfind("2x2", 0) == 0);
  CHECK(events[0]["ranks"] == 3);  // machines left for the planner
  CHECK(events[0]["completed"] == true);
  // The planner's new plan is printed, on the three workers left.
  const auto replanned = err.find("elastic: re-planned on 3 worker(s) of two-clusters: plan: PP");
  REQUIRE(replanned != std::string::npos);
  const std::string plan = err.substr(replanned, err.find("throughput:", replanned) - replanned);
  CHECK(plan.find("eth1/0") == std::string::npos);  // the lost worker (rank 3) is not in it
  // The launcher that took over: the same three.
  CHECK(events[1]["reason"].get<std::string>().find("the launcher (the coordinator, pid") != std::string::npos);
  CHECK(events[1]["ranks"] == 3);
  // (From memory, or from a checkpoint as new: the one-rank plan here
  // checkpoints every 3 steps and runs them in milliseconds.)
  const auto again = err.rfind("elastic: re-planned on 3 worker(s) of two-clusters: plan: PP");
  REQUIRE(again != std::string::npos);
  REQUIRE(again > err.find("carries the job on"));
  const std::string plan2 = err.substr(again, err.find("throughput:", again) - again);
  CHECK(plan2.find("eth1/0") == std::string::npos);
}

namespace {

/// The median of the step lines' "seconds" for steps in [first, last].
double median_seconds(const std::vector<std::string>& lines, int first, int last) {
  std::vector<double> s;
  for (const std::string& l : lines) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j.contains("seconds")) continue;
    if (const int step = j["step"]; step >= first && step <= last) s.push_back(j["seconds"]);
  }
  REQUIRE_FALSE(s.empty());
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

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

TEST_CASE("--elastic --probe-every: a rank's links throttled mid-run, the job re-plans around it at a step boundary "
          "without losing a step, steps get faster again, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-throttle");
  job j = fresh_gpt2_job(tmp);
  j.batch = 4;
  j.steps = 60;
  std::ofstream(tmp / "three.toml") << three_nodes_toml;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const std::string token = "elastic-test-" + std::to_string(::getpid());
  child_process launcher = start_with_token(
      token, train_args(j, {"--cluster", tmp / "three.toml", "--elastic", "--probe-every", "2", "--snapshot-every", "0",
                            "--timeout-s", "60"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  // Where rank 1 (n1/0) listens.
  const nlohmann::json one = rank_entry(launcher.lines(), 1);
  REQUIRE(one.is_object());
  CHECK(one["worker"] == "n1/0");
  const std::string endpoint = one["endpoint"];
  REQUIRE_FALSE(endpoint.empty());
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  // Throttle everything rank 1 sends to 1 Mbit/s, through its node's control actor.
  auto harness = node::start({});
  if (!harness) FAIL(error_message(harness.error()));
  auto peer = (*harness)->connect(endpoint);
  if (!peer) FAIL(error_message(peer.error()));
  REQUIRE_FALSE(request_reshape(**harness, *peer, token, "bw=1Mbit,lat=200us"));
  int throttled_from = 0;
  for (const std::string& l : launcher.lines())
    if (auto s = nlohmann::json::parse(l, nullptr, false); s.is_object() && s.contains("step")) throttled_from = s["step"];
  throttled_from += 2;  // a step or so for the reshape to land
  (*harness)->stop();

  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  // Every step once, equal to one process's: nothing lost or replayed.
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  const auto& e = events[0];
  CHECK(e["reason"] == "links changed");
  REQUIRE(e["changes"].size() >= 1u);
  CHECK(e["changes"][0].get<std::string>().find("n1/0") != std::string::npos);
  CHECK(e["from"] == "1x2 [0,4)");
  CHECK(e["replayed_steps"] == 0);
  CHECK(e["completed"] == true);
  const int drained = e["resume_from"];
  CHECK(drained > throttled_from);
  CHECK(e["predicted_step_s"][0].get<double>() > e["predicted_step_s"][1].get<double>());
  // The new plan no longer reduces gradients over the slow link. (Only
  // n0/0 <-> n1/0 was probed, so the planner may still pipeline through
  // n1/0 over its other links, priced at the rule.)
  const std::string err = launcher.err();
  const auto replanned = err.find("re-planned on what was measured: plan:");
  REQUIRE(replanned != std::string::npos);
  const std::string plan = err.substr(replanned, err.find("throughput:", replanned) - replanned);
  CHECK(plan.find("n0/0, n1/0") == std::string::npos);
  CHECK(e["to"] != e["from"]);
  // Steps after the move are faster than the throttled ones before it.
  const double slow = median_seconds(launcher.lines(), throttled_from, drained);
  const double fast = median_seconds(launcher.lines(), drained + 2, j.steps);
  MESSAGE("median step: " << slow << " s throttled, " << fast << " s after the re-plan (drained after step " << drained
                          << ")");
  CHECK(fast < slow);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}

namespace {

/// A noisy neighbour: `count` processes spinning on CPU `cpu`, killed with
/// this object.
struct cpu_hogs {
  std::vector<pid_t> pids;
  cpu_hogs(int count, int cpu) {
    for (int i = 0; i < count; ++i) {
      const pid_t p = ::fork();
      if (p == 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        ::sched_setaffinity(0, sizeof set, &set);
        for (volatile unsigned long n = 0;; n = n + 1) {
        }
      }
      if (p > 0) pids.push_back(p);
    }
  }
  ~cpu_hogs() {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  }
};

/// Pins every thread of process `pid` to CPU `cpu` at nice 10 (its later
/// threads inherit both). Sharing the CPU alone is not enough: a rank that
/// mostly waits for its links wakes with the scheduler's credit for
/// sleepers and runs its few milliseconds of compute at once; at nice 10
/// beside busy processes at 0 its share is a few percent, compute included.
void pin_process(pid_t pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    const int tid = std::stoi(t.path().filename().string());
    ::sched_setaffinity(tid, sizeof set, &set);
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 10);
  }
}

}  // namespace

TEST_CASE("--elastic --probe-every: a straggler (a rank at nice 10 sharing its core with five busy processes) is measured, "
          "the job re-plans without it at a step boundary, and the losses stay those of one process") {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  REQUIRE(cpus >= 2);
  temp_dir_guard tmp("mp-train-elastic-straggler");
  job j = fresh_gpt2_job(tmp);
  // Wider than the other tests' model: tens of milliseconds of compute per
  // step, which a crowded core stretches (a millisecond slips in between).
  std::ofstream(j.model / "config.json")
      << R"({"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","vocab_size":64,"n_embd":96,"n_layer":4,)"
      << R"("n_head":4,"n_inner":384,"n_positions":64,"layer_norm_epsilon":1e-5,"bos_token_id":0,"eos_token_id":0,)"
      << R"("tie_word_embeddings":true})";
  j.batch = 4;
  j.seq = 32;
  j.steps = 40;
  std::ofstream(tmp / "three.toml") << three_nodes_toml;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  child_process launcher = child_process::corolla(train_args(
      j, {"--cluster", tmp / "three.toml", "--elastic", "--probe-every", "8", "--snapshot-every", "0",
          "--timeout-s", "60"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json one = rank_entry(launcher.lines(), 1);
  REQUIRE(one.is_object());
  const pid_t slow = one["pid"].get<pid_t>();
  REQUIRE(slow > 0);
  int status = 0;
  {
    // Rank 1 (n1/0) shares the last CPU with five spinning processes until
    // the job ends; the grid after the drain runs in new processes.
    cpu_hogs hogs(5, cpus - 1);
    pin_process(slow, cpus - 1);
    // A thread the rank starts while it is being pinned may have been
    // created by one not pinned yet (and inherited that): pin again once
    // it steps, when its threads are all there.
    REQUIRE(launcher.wait_line(std::regex(R"("step":2\b)"), std::chrono::seconds(60)));
    pin_process(slow, cpus - 1);
    status = finish(launcher);
  }
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  // Probe steps carry every rank's compute seconds.
  for (const std::string& l : launcher.lines()) {
    auto s = nlohmann::json::parse(l, nullptr, false);
    if (s.is_object() && s.contains("links")) {
      REQUIRE(s["compute_s"].size() >= 2u);
      for (const auto& c : s["compute_s"]) CHECK(c.get<double>() > 0);
    }
  }
  const auto events = replans(launcher.lines());
  std::string probes;  // what was measured, should no re-plan come
  for (const std::string& l : launcher.lines())
    if (l.find("\"compute_s\"") != std::string::npos) probes += l + "\n";
  INFO("probe steps: " << probes);
  REQUIRE(events.size() == 1u);
  const auto& e = events[0];
  CHECK(e["replayed_steps"] == 0);
  CHECK(e["completed"] == true);
  bool speed = false;
  for (const auto& c : e["changes"]) speed = speed || c.get<std::string>().find("n1/0 computes") == 0;
  CHECK(speed);
  const std::string err = launcher.err();
  const auto replanned = err.find("re-planned on what was measured: plan:");
  REQUIRE(replanned != std::string::npos);
  const std::string plan = err.substr(replanned, err.find("throughput:", replanned) - replanned);
  CHECK(plan.find("idle: n1/0") != std::string::npos);  // the straggler does no work any more
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}
