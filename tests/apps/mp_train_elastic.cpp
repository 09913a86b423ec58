// `corolla train --pp P --dp D --elastic`: rank processes killed (SIGKILL)
// or hung (SIGSTOP) mid-run; the launcher re-plans the grid on the ranks
// left, continues from the survivors' in-memory snapshots (else the last
// checkpoint, or the start) re-sharded, prints every step once, and the
// losses equal the single-process run. Workers joining:
// mp_train_elastic_join.cpp; measured links and stragglers:
// mp_train_elastic_probe.cpp; the launcher's death:
// mp_train_elastic_takeover.cpp.
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

TEST_CASE("--elastic --message-piece-bytes: a stage's snapshot reaches its buddy in parts and the next grid fetches "
          "it in ranges, so a stage larger than one message is recovered from memory with the single-process losses") {
  // 4 KiB pieces: every block's parameters and moments (about 13,000
  // values each here) travel in several messages, as a real model's
  // stage does in 256 MiB pieces.
  temp_dir_guard tmp("mp-train-elastic-pieces");
  const job j = slow_job(tmp, 16);
  const auto [events, err] = faulted_run(
      train_args(j, {"--pp", "2", "--dp", "1", "--elastic", "--link-profile", "lat=4ms", "--timeout-s", "60",
                     "--message-piece-bytes", "4096"}),
      4, {0}, SIGKILL, reference_losses(j, fresh_gpt2(j)));
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["to"] == "1x1 [0,4)");
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  CHECK(events[0]["bytes"].get<double>() > 10 * 4096);
  // No part refused or disagreeing on the way (the killed rank's own
  // messages are dropped, as ever).
  CHECK(err.find("dropping a snapshot") == std::string::npos);
  CHECK(err.find("dropping rank") == std::string::npos);
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

TEST_CASE("--elastic with --cluster: the planner re-plans on the machines left, and when the launcher is killed after "
          "that, the one that takes over plans on those machines too (not on the file), with the losses of one process") {
  temp_dir_guard tmp("mp-train-elastic-cluster");
  job j = fresh_gpt2_job(tmp);
  j.batch = 4;
  j.steps = 120;  // the one-rank plan after the first re-plan runs a step in milliseconds: the launcher
                  // must still be running when it is killed after step 12
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

TEST_CASE("--elastic with a LoRA adapter, beside f32 and beside nf4 blocks (QLoRA): a rank killed, the adapter's "
          "blocks and moments come back from the survivors' memory, the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-lora");
  job j = slow_job(tmp, 16);
  j.model = tmp / "model";  // with weights: an adapter of drawn, unsaved weights is refused
  write_tiny_model(j.model, tiny(architecture::gpt2));
  j.lr = 1e-2f;
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  c.targets = {"all-linear"};
  for (const weight_format f : {weight_format::f32, weight_format::nf4}) {
    CAPTURE(weight_format_flag(f));
    // Beside nf4 the next grid's ranks load their blocks as nf4 again from --model.
    lora_adapter adapter = lora_adapter::init(load_config(j.model), c, 4, cpu_backend());
    const auto [events, err] =
        faulted_run(elastic_args(j, {"--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "all-linear", "--seed",
                                     "4", "--weights", weight_format_flag(f)}),
                    5, {2}, SIGKILL, lora_reference_losses(j, adapter, f));
    REQUIRE(events.size() == 1u);
    CHECK(events[0]["lost_ranks"] == nlohmann::json::array({2}));
    CHECK(events[0]["from_memory"] == true);
    CHECK(events[0]["replayed_steps"].get<int>() <= 1);
  }
}
