// Helpers of the elastic training tests (mp_train_elastic.cpp,
// mp_train_hang.cpp): a job slow enough to hit mid-run, the launcher's
// flags, and what its --json output says.
#pragma once

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/apps/train_test_util.hpp"
#include "tests/support/child_process.hpp"

namespace corolla::testing::elastic_test {

using namespace corolla::testing::train_test;

/// A job whose steps take long enough (links with 4 ms of latency) for a
/// test to hit a rank mid-run on a busy machine.
inline job slow_job(const temp_dir_guard& tmp, int steps) {
  job j = fresh_gpt2_job(tmp);
  j.batch = 12;  // splits over 4, 3, 2 and 1 replicas
  j.steps = steps;
  return j;
}

inline std::vector<std::string> elastic_args(const job& j, std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--pp", "2", "--dp", "2", "--elastic", "--link-profile", "lat=4ms", "--timeout-s", "60"});
  return train_args(j, extra);
}

/// The re-plan events of a --json run.
inline std::vector<nlohmann::json> replans(const std::vector<std::string>& lines) {
  std::vector<nlohmann::json> out;
  for (const std::string& l : lines) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    if (j.is_object() && j.value("event", "") == "replan") out.push_back(j);
  }
  return out;
}

/// Reads the launcher's stdout to its end and waits for it.
inline int finish(child_process& launcher) {
  launcher.wait_line(std::regex("^$a"), std::chrono::seconds(180));  // never matches: reads until stdout closes
  const auto status = launcher.wait(std::chrono::seconds(10));
  REQUIRE(status.has_value());
  return *status;
}

/// Reads the launcher to its end, which must exit with status 0 having
/// printed every step once with the losses `want` (1e-5 relative); its
/// re-plan events.
inline std::vector<nlohmann::json> finished_replans(child_process& launcher, const std::vector<float>& want) {
  const int status = finish(launcher);
  INFO("stderr: " << launcher.err());
  REQUIRE(status == 0);
  check_close(json_steps(launcher.lines()), want, 1e-5);
  return replans(launcher.lines());
}

/// Rank `rank`'s entry in the latest "ranks" event of a --json run (pid,
/// endpoint, ...), or null.
inline nlohmann::json rank_entry(const std::vector<std::string>& lines, int rank) {
  nlohmann::json found;
  for (const std::string& l : lines) {
    auto e = nlohmann::json::parse(l, nullptr, false);
    if (e.is_object() && e.value("event", "") == "ranks")
      for (const auto& r : e["ranks"])
        if (r["rank"] == rank) found = r;
  }
  return found;
}

/// The processes of each grid's ranks, in the order the grids ran (one
/// set per "ranks" event of a --json run; a joined worker's rank is pid 0).
inline std::vector<std::set<pid_t>> grid_pids(const std::vector<std::string>& lines) {
  std::vector<std::set<pid_t>> out;
  for (const std::string& l : lines) {
    auto e = nlohmann::json::parse(l, nullptr, false);
    if (!e.is_object() || e.value("event", "") != "ranks") continue;
    out.emplace_back();
    for (const auto& r : e["ranks"]) out.back().insert(r["pid"].get<pid_t>());
  }
  return out;
}

/// Starts `corolla <args>`; its rank processes obey `token` (read from
/// the environment they inherit).
inline child_process start_with_token(const std::string& token, const std::vector<std::string>& args) {
  ::setenv("COROLLA_CONTROL_TOKEN", token.c_str(), 1);
  child_process launcher = child_process::corolla(args);
  ::unsetenv("COROLLA_CONTROL_TOKEN");
  return launcher;
}

}  // namespace corolla::testing::elastic_test
