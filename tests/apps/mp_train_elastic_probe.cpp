// `corolla train --elastic --cluster --probe-every K`: a rank's links
// throttled mid-run and a straggler, measured; the job re-plans at a step
// boundary without losing a step, and the losses stay those of one process.
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

}  // namespace

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
    // (Starved as it is, the rank takes its first steps slowly; on a busy
    // CI machine 60 s were not always enough: only a hang takes 180.)
    REQUIRE(launcher.wait_line(std::regex(R"("step":2\b)"), std::chrono::seconds(180)));
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
