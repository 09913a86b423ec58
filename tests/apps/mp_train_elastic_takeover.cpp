// `corolla train --elastic` outliving its launcher (apps/launcher_takeover.hpp):
// the launcher killed (twice in a row), a rank process starts a new one that
// carries the job on in the same processes; a launcher stopped on purpose
// stops its job.
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
namespace fs = std::filesystem;

/// Whether process `pid` exists and has not ended (a zombie has).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' && line[close + 2] != 'X';
}

/// The launcher for `args`, with its own temporary directory `tmpdir`
/// (TMPDIR: where its private checkpoint directory goes, and the ranks'
/// and a successor's, who inherit it).
child_process launcher_in(const fs::path& tmpdir, const std::vector<std::string>& args) {
  fs::create_directories(tmpdir);
  std::vector<std::string> a{"TMPDIR=" + tmpdir.string(), COROLLA_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  return child_process("/usr/bin/env", a);
}

/// The entries of `dir` whose names start with `prefix`.
std::vector<std::string> entries_named(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

/// Whether every one of `pids` is gone within 10 s (a killed process
/// closes its files a moment before it is gone).
bool all_gone(const std::vector<pid_t>& pids) {
  return eventually([&] { return std::none_of(pids.begin(), pids.end(), alive); }, std::chrono::seconds(10),
                    std::chrono::milliseconds(20));
}

/// The pid of the launcher that took over, from its "takeover" event.
pid_t taken_over_by(child_process& launcher) {
  const auto took = launcher.wait_line(std::regex(R"re("event":"takeover"[^}]*"pid":(\d+))re"), std::chrono::seconds(60));
  REQUIRE(took);
  return static_cast<pid_t>(std::stoi((*took)[1]));
}

}  // namespace

TEST_CASE("--elastic: the launcher (the coordinator) killed mid-run, then the launcher that took over: each time a "
          "rank process starts a new one, which carries the job on in the same processes from their memory, every "
          "step printed once, with the single-process losses") {
  temp_dir_guard tmp("mp-train-elastic-takeover");
  const job j = slow_job(tmp, 18);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  child_process launcher = child_process::corolla(elastic_args(j, {}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":5\b)"), std::chrono::seconds(60)));
  const std::set<pid_t> first = grid_pids(launcher.lines()).front();
  REQUIRE(first.size() == 4u);
  launcher.signal(SIGKILL);
  // The rank processes and the new launcher write to the same stdout.
  const pid_t second = taken_over_by(launcher);
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
  std::vector<pid_t> job = launchers;
  job.insert(job.end(), first.begin(), first.end());
  CHECK(all_gone(job));
}

TEST_CASE("--elastic: a launcher stopped on purpose (SIGTERM) ends its ranks, which no longer die with it by "
          "themselves, and nobody takes over") {
  temp_dir_guard tmp("mp-train-elastic-sigterm");
  const job j = slow_job(tmp, 40);
  child_process launcher = launcher_in(tmp / "tmp", elastic_args(j, {}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":3\b)"), std::chrono::seconds(60)));
  const std::set<pid_t> ranks = grid_pids(launcher.lines()).front();
  REQUIRE(entries_named(tmp / "tmp", "corolla-elastic-").size() == 1);  // the job's private directory
  launcher.signal(SIGTERM);
  REQUIRE(launcher.wait(std::chrono::seconds(10)) == -SIGTERM);
  // stdout closes: no rank and no new launcher holds it.
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(20));
  CHECK(all_gone({ranks.begin(), ranks.end()}));
  CHECK(launcher.err().find("carries the job on") == std::string::npos);
  for (const std::string& l : launcher.lines()) CHECK(l.find(R"("step":40)") == std::string::npos);
  // Its private checkpoint directory went with it (the signal's handler
  // removed it: no destructor runs).
  CHECK(entries_named(tmp / "tmp", "corolla-elastic-").empty());
}

TEST_CASE("--elastic: a launcher that took over, stopped on purpose (SIGTERM), ends the processes it took over, and "
          "nobody takes over from it") {
  temp_dir_guard tmp("mp-train-elastic-takeover-sigterm");
  const job j = slow_job(tmp, 60);
  child_process launcher = launcher_in(tmp / "tmp", elastic_args(j, {}));
  REQUIRE(launcher.wait_line(std::regex(R"("step":3\b)"), std::chrono::seconds(60)));
  const std::set<pid_t> ranks = grid_pids(launcher.lines()).front();
  launcher.signal(SIGKILL);
  const pid_t second = taken_over_by(launcher);
  REQUIRE(launcher.wait_line(std::regex(R"("step":6\b)"), std::chrono::seconds(60)));
  REQUIRE(entries_named(tmp / "tmp", "corolla-elastic-").size() == 1);  // adopted, not a second one
  ::kill(second, SIGTERM);
  // stdout closes: no rank and no third launcher holds it.
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(30));
  std::vector<pid_t> job{second};
  job.insert(job.end(), ranks.begin(), ranks.end());
  CHECK(all_gone(job));
  const std::string err = launcher.err();
  INFO("stderr: " << err);
  // One takeover only, and the job did not finish.
  CHECK(err.find("carries the job on") == err.rfind("carries the job on"));
  for (const std::string& l : launcher.lines()) CHECK(l.find(R"("step":60)") == std::string::npos);
  // The private checkpoint directory the successor adopted went with it.
  CHECK(entries_named(tmp / "tmp", "corolla-elastic-").empty());
}
