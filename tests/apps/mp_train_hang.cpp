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

}  // namespace

TEST_CASE("--elastic --hang-s: a rank whose stage stops inside a compute call while its node stays up reports itself "
          "hung within seconds, and the job continues without it from the survivors' snapshots with the same losses") {
  temp_dir_guard tmp("mp-train-elastic-stall");
  const job j = slow_job(tmp, 24);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const std::string token = "elastic-stall-" + std::to_string(::getpid());
  child_process launcher = start_with_token(token, elastic_args(j, {"--hang-s", "4"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json three = rank_entry(launcher.lines(), 3);
  REQUIRE(three.is_object());
  const std::string endpoint = three["endpoint"];
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  const auto stalled_at = std::chrono::steady_clock::now();
  stall_rank(endpoint, token);
  REQUIRE(launcher.wait_line(std::regex(R"("event":"replan")"), std::chrono::seconds(60)));
  const double replanned_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - stalled_at).count();
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  CHECK(events[0]["lost_ranks"] == nlohmann::json::array({3}));
  CHECK(events[0]["reason"].get<std::string>().find("rank 3 (stage 1, replica 1, blocks 2..3) is hung: its stage has "
                                                    "been inside one ") != std::string::npos);
  CHECK(events[0]["from_memory"] == true);
  CHECK(events[0]["to"] == "1x3 [0,4)");
  // Found by the watchdog (4 s), not by --timeout-s (60 s).
  MESSAGE("stalled to re-planned: " << replanned_after << " s");
  CHECK(replanned_after < 30);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}

TEST_CASE("--hang-s without --elastic: a hung rank fails the job at once with one error naming it, not after "
          "--timeout-s") {
  temp_dir_guard tmp("mp-train-stall");
  const job j = slow_job(tmp, 40);
  const std::string token = "stall-" + std::to_string(::getpid());
  child_process launcher = start_with_token(
      token, train_args(j, {"--pp", "2", "--dp", "1", "--link-profile", "lat=4ms", "--timeout-s", "120", "--hang-s", "2"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json one = rank_entry(launcher.lines(), 1);
  REQUIRE(one.is_object());
  REQUIRE(launcher.wait_line(std::regex(R"("step":2\b)"), std::chrono::seconds(60)));
  const auto t0 = std::chrono::steady_clock::now();
  stall_rank(one["endpoint"].get<std::string>(), token);
  const int status = finish(launcher);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("stderr: " << launcher.err());
  CHECK(status == 1);
  CHECK(launcher.err().find("rank 1 (stage 1, replica 0, blocks 2..3) is hung") != std::string::npos);
  CHECK(took < 30);
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}

TEST_CASE("--hang-s without --elastic: a lost activation leaves two stages waiting on each other; the coordinator "
          "names that cycle within seconds instead of blaming a victim after --timeout-s") {
  temp_dir_guard tmp("mp-train-lost");
  const job j = slow_job(tmp, 40);
  const std::string token = "lost-" + std::to_string(::getpid());
  child_process launcher = start_with_token(
      token, train_args(j, {"--pp", "2", "--dp", "1", "--link-profile", "lat=4ms", "--timeout-s", "120", "--hang-s", "2"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json one = rank_entry(launcher.lines(), 1);
  REQUIRE(one.is_object());
  REQUIRE(launcher.wait_line(std::regex(R"("step":3\b)"), std::chrono::seconds(60)));
  const auto t0 = std::chrono::steady_clock::now();
  lose_message(one["endpoint"].get<std::string>(), token, "train.act");
  const int status = finish(launcher);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = launcher.err();
  INFO("stderr: " << err);
  CHECK(status == 1);
  CHECK(err.find("the job is deadlocked") != std::string::npos);
  CHECK(err.find("rank 1 (stage 1, replica 0, blocks 2..3) waits for activations of micro-batch") != std::string::npos);
  CHECK(err.find("rank 0 (stage 0, replica 0, blocks 0..1) waits for gradient of micro-batch") != std::string::npos);
  CHECK(err.find("a message on that cycle was lost or never sent") != std::string::npos);
  MESSAGE("lost to failed: " << took << " s");
  CHECK(took < 40);  // --timeout-s is 120
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}

TEST_CASE("--elastic --hang-s: after a lost activation the deadlocked grid starts again from every rank's snapshot, "
          "no rank is dropped, and the losses stay those of one process") {
  temp_dir_guard tmp("mp-train-elastic-lost");
  const job j = slow_job(tmp, 24);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const std::string token = "elastic-lost-" + std::to_string(::getpid());
  child_process launcher = start_with_token(token, elastic_args(j, {"--hang-s", "3"}));
  REQUIRE(launcher.wait_line(std::regex(R"("event":"ranks")"), std::chrono::seconds(60)));
  const nlohmann::json three = rank_entry(launcher.lines(), 3);
  REQUIRE(three.is_object());
  REQUIRE(launcher.wait_line(std::regex(R"("step":4\b)"), std::chrono::seconds(60)));
  const auto t0 = std::chrono::steady_clock::now();
  lose_message(three["endpoint"].get<std::string>(), token, "train.act");
  REQUIRE(launcher.wait_line(std::regex(R"("event":"replan")"), std::chrono::seconds(90)));
  const double replanned_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  const auto events = replans(launcher.lines());
  REQUIRE(events.size() == 1u);
  const auto& e = events[0];
  CHECK(e["lost_ranks"].empty());
  const std::string reason = e["reason"];
  CHECK(reason.find("the job is deadlocked") != std::string::npos);
  CHECK(reason.find("rank 3 (stage 1, replica 1, blocks 2..3) waits for activations") != std::string::npos);
  CHECK(e["from_memory"] == true);
  CHECK(e["from"] == "2x2 [0,2) [2,4)");
  CHECK(e["ranks"] == 4);
  MESSAGE("lost to re-planned: " << replanned_after << " s");
  CHECK(replanned_after < 40);  // --timeout-s is 60
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());
}
