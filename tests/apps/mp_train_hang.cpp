// A training rank whose stage hangs inside a compute call while its
// process, node and heartbeats stay up (faultlab's hang, control.stall):
// its watchdog reports it (--hang-s), with --elastic the job re-plans
// without it, without --elastic it fails naming the rank. And a job that
// stops with no rank computing (faultlab's lose, control.lose: a message
// lost on the way): the coordinator's stall check names the cycle of
// waits, and with --elastic the grid starts again from the snapshots.
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <utility>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/node_control.hpp"
#include "tests/apps/elastic_test_util.hpp"
#include "tests/apps/train_test_util.hpp"
#include "tests/support/child_process.hpp"

using namespace corolla;
using namespace corolla::testing;
using namespace corolla::testing::train_test;
using namespace corolla::testing::elastic_test;

namespace {

/// Stalls the stage of the rank listening at `endpoint` inside its next
/// forward or backward (control.stall to its "train-watch" actor); its
/// process, node, links and heartbeats stay up (SIGSTOP would stop them all).
void stall_rank(const std::string& endpoint, const std::string& token) {
  auto harness = node::start({});
  if (!harness) FAIL(error_message(harness.error()));
  auto peer = (*harness)->connect(endpoint);
  if (!peer) FAIL(error_message(peer.error()));
  REQUIRE_FALSE(request_stall(**harness, *peer, token, "train-watch", true));
  (*harness)->stop();
}

/// The training mailbox of the rank listening at `endpoint` drops the next
/// message of `type` (control.lose): lost on the way, with every process
/// and link up.
void lose_message(const std::string& endpoint, const std::string& token, const std::string& type) {
  auto harness = node::start({});
  if (!harness) FAIL(error_message(harness.error()));
  auto peer = (*harness)->connect(endpoint);
  if (!peer) FAIL(error_message(peer.error()));
  REQUIRE_FALSE(request_lose(**harness, *peer, token, type, 1));
  (*harness)->stop();
}

/// Once the job of `launcher` has reached `step` (0: its ranks joined):
/// where rank `rank` listens.
std::string endpoint_at_step(child_process& launcher, int rank, int step) {
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json r = rank_entry(launcher.lines(), rank);
  REQUIRE(r.is_object());
  if (step > 0)
    REQUIRE(launcher.wait_line(std::regex("\"step\":" + std::to_string(step) + "\\b"), std::chrono::seconds(60)));
  return r["endpoint"];
}

using fault_at = std::function<void(const std::string& endpoint, const std::string& token)>;

/// A 2x2 --elastic job of 24 steps (`flags` added) whose rank 3 gets
/// `inject` after step 4: it must re-plan once, finish, and keep the
/// single-process losses. The re-plan event, and seconds from the fault to it.
std::pair<nlohmann::json, double> elastic_fault(const temp_dir_guard& tmp, const std::vector<std::string>& flags,
                                                const fault_at& inject) {
  const job j = slow_job(tmp, 24);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const std::string token = "elastic-fault-" + std::to_string(::getpid());
  child_process launcher = start_with_token(token, elastic_args(j, flags));
  const std::string endpoint = endpoint_at_step(launcher, 3, 4);
  const auto t0 = std::chrono::steady_clock::now();
  inject(endpoint, token);
  REQUIRE(launcher.wait_line(std::regex(R"("event":"replan")"), std::chrono::seconds(90)));
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["from_memory"] == true);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
  return {events[0], after};
}

/// A 2x1 job without --elastic (`limits`: by default --hang-s 2,
/// --timeout-s 120) whose rank 1 gets `inject` after `step`: it must fail.
/// Its stderr, and seconds from the fault to its end.
std::pair<std::string, double> failing_fault(const temp_dir_guard& tmp, int step, const fault_at& inject,
                                             const std::vector<std::string>& limits = {"--timeout-s", "120",
                                                                                       "--hang-s", "2"}) {
  const job j = slow_job(tmp, 40);
  const std::string token = "fault-" + std::to_string(::getpid());
  std::vector<std::string> flags{"--pp", "2", "--dp", "1", "--link-profile", "lat=4ms"};
  flags.insert(flags.end(), limits.begin(), limits.end());
  child_process launcher = start_with_token(token, train_args(j, flags));
  const std::string endpoint = endpoint_at_step(launcher, 1, step);
  const auto t0 = std::chrono::steady_clock::now();
  inject(endpoint, token);
  const int status = finish(launcher);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("stderr: " << launcher.err());
  CHECK(status == 1);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
  return {launcher.err(), took};
}

const fault_at stall = [](const std::string& endpoint, const std::string& token) { stall_rank(endpoint, token); };
const fault_at lose_act = [](const std::string& endpoint, const std::string& token) {
  lose_message(endpoint, token, "train.act");
};

}  // namespace

TEST_CASE("--elastic --hang-s: a rank whose stage stops inside a compute call while its node stays up reports itself "
          "hung within seconds, and the job continues without it from the survivors' snapshots with the same losses") {
  temp_dir_guard tmp("mp-train-elastic-stall");
  const auto [e, replanned_after] = elastic_fault(tmp, {"--hang-s", "4"}, stall);
  CHECK(e["lost_ranks"] == nlohmann::json::array({3}));
  CHECK(e["reason"].get<std::string>().find("rank 3 (stage 1, replica 1, blocks 2..3) is hung: its stage has been "
                                            "inside one ") != std::string::npos);
  CHECK(e["to"] == "1x3 [0,4)");
  // Found by the watchdog (4 s), not by --timeout-s (60 s).
  MESSAGE("stalled to re-planned: " << replanned_after << " s");
  CHECK(replanned_after < 30);
}

TEST_CASE("--hang-s without --elastic: a hung rank fails the job at once with one error naming it, not after "
          "--timeout-s") {
  temp_dir_guard tmp("mp-train-stall");
  const auto [err, took] = failing_fault(tmp, 2, stall);
  INFO("stderr: " << err);
  CHECK(err.find("rank 1 (stage 1, replica 0, blocks 2..3) is hung") != std::string::npos);
  CHECK(took < 30);
}

TEST_CASE("--hang-s without --elastic: a lost activation leaves two stages waiting on each other, and the coordinator "
          "names that cycle within seconds instead of blaming a victim after --timeout-s") {
  temp_dir_guard tmp("mp-train-lost");
  const auto [err, took] = failing_fault(tmp, 3, lose_act);
  INFO("stderr: " << err);
  CHECK(err.find("the job is deadlocked") != std::string::npos);
  CHECK(err.find("rank 1 (stage 1, replica 0, blocks 2..3) waits for activations of micro-batch") != std::string::npos);
  CHECK(err.find("rank 0 (stage 0, replica 0, blocks 0..1) waits for gradient of micro-batch") != std::string::npos);
  CHECK(err.find("a message on that cycle was lost or never sent") != std::string::npos);
  MESSAGE("lost to failed: " << took << " s");
  CHECK(took < 40);  // --timeout-s is 120
}

TEST_CASE("without --hang-s: a lost activation ends the job after --timeout-s, a waiting stage naming what it "
          "waited for") {
  // The stage actors' own deadline (an open await, answered by nothing):
  // no stall check runs without --hang-s.
  temp_dir_guard tmp("mp-train-lost-timeout");
  const auto [err, took] = failing_fault(tmp, 3, lose_act, {"--timeout-s", "8"});
  INFO("stderr: " << err);
  CHECK(err.find("within 8000 ms") != std::string::npos);
  CHECK((err.find("no activations of micro-batch") != std::string::npos ||
         err.find("no gradient of micro-batch") != std::string::npos));
  CHECK(err.find("deadlocked") == std::string::npos);
  MESSAGE("lost to failed: " << took << " s");
  CHECK(took >= 7.5);  // not before the deadline
  CHECK(took < 60);
}

TEST_CASE("--hang-s without --elastic: an activation lost as the job starts (its ranks setting up, the first step) "
          "is named as soon as one lost later") {
  temp_dir_guard tmp("mp-train-lost-first");
  const auto [err, took] = failing_fault(tmp, 0, lose_act);
  INFO("stderr: " << err);
  CHECK(err.find("the job is deadlocked") != std::string::npos);
  CHECK(err.find("waits for activations of micro-batch") != std::string::npos);
  MESSAGE("lost to failed: " << took << " s");
  CHECK(took < 40);  // --timeout-s is 120
}

TEST_CASE("--elastic --hang-s: after a lost activation the deadlocked grid starts again from every rank's snapshot, "
          "no rank is dropped, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-lost");
  const auto [e, replanned_after] = elastic_fault(tmp, {"--hang-s", "3"}, lose_act);
  CHECK(e["lost_ranks"].empty());
  const std::string reason = e["reason"];
  CHECK(reason.find("the job is deadlocked") != std::string::npos);
  CHECK(reason.find("rank 3 (stage 1, replica 1, blocks 2..3) waits for activations") != std::string::npos);
  CHECK(e["from"] == "2x2 [0,2) [2,4)");
  CHECK(e["ranks"] == 4);
  MESSAGE("lost to re-planned: " << replanned_after << " s");
  CHECK(replanned_after < 40);  // --timeout-s is 60
}

TEST_CASE("--save --hang-s: the coordinator asks a rank for one group at a time, so a lost ask leaves the two "
          "waiting on each other, named as a cycle, and no model file is left") {
  // Were the groups pushed unasked, losing an ask would change nothing.
  temp_dir_guard tmp("mp-train-lost-ask");
  const fs::path out = tmp.path() / "saved";
  const auto [err, took] = failing_fault(tmp, 0, [](const std::string& endpoint, const std::string& token) {
    lose_message(endpoint, token, "train.paramsask");
  }, {"--timeout-s", "120", "--hang-s", "2", "--save", out.string()});
  INFO("stderr: " << err);
  CHECK(err.find("the job is deadlocked") != std::string::npos);
  CHECK(err.find("rank 1 (stage 1, replica 0, blocks 2..3) waits for the coordinator's ask for parameters") !=
        std::string::npos);
  CHECK(err.find("parameters of block.2") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "model.safetensors"));
  CHECK_FALSE(fs::exists(out / "config.json"));
  MESSAGE("lost to failed: " << took << " s");
  CHECK(took < 90);  // 40 steps, then the save; --timeout-s is 120
}
