// The demo end to end with a short time budget: it trains, saves a model
// that `corolla generate` loads, and generates text; then it serves the
// model from local `corolla serve` processes, kills the last hop's server
// mid-generation, replays, and gets the local greedy output unchanged.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla::testing;
namespace fs = std::filesystem;

namespace {

/// Processes whose command line contains both `a` and `b` (their pids).
std::vector<std::string> processes_with(const std::string& a, const std::string& b) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(a) != std::string::npos && cmd.find(b) != std::string::npos) found.push_back(pid + ": " + cmd);
  }
  return found;
}

}  // namespace

TEST_CASE("demo trains, saves a loadable model, generates, and survives a killed swarm server") {
  temp_dir_guard dir("demo");
  fs::path out = dir / "run";
  auto r = run_corolla({"demo", "--out", out.string(), "--seconds", "3", "--max-new-tokens", "12",
                        "--threads", "2"},
                       std::chrono::seconds(120));
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[4/4]") != std::string::npos);
  CHECK(r.out.find("Once upon a time") != std::string::npos);
  // Training ran on the planner's layout of the emulated two-cluster file,
  // printed before it started.
  CHECK(r.out.find("on an emulated two-cluster layout") != std::string::npos);
  CHECK(std::regex_search(r.out, std::regex(R"(plan: PP \d+ x DP \d+ x TP 1 on \d+ of 4 workers)")));
  CHECK(std::regex_search(r.out, std::regex(R"(\d+ steps in \d+ s on \d+ rank processes: loss)")));
  CHECK(fs::exists(out / "cluster.toml"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model"})
    CHECK(fs::exists(out / "model" / f));

  // The swarm stage: three servers, the second half of the blocks twice.
  CHECK(r.out.find("== swarm: 3 servers on 127.0.0.1") != std::string::npos);
  CHECK(std::regex_search(r.out, std::regex(R"(corolla serve s-a blocks \[0, 2\) of model listening on tcp://127\.0\.0\.1:\d+)")));
  CHECK(std::regex_search(r.out, std::regex(R"(corolla serve s-b blocks \[2, 4\) of model listening on tcp://127\.0\.0\.1:\d+)")));
  CHECK(std::regex_search(r.out, std::regex(R"(corolla serve s-c blocks \[2, 4\) of model listening on tcp://127\.0\.0\.1:\d+)")));
  // The route, the kill of its last hop's server, the failure and the replay
  // on the other server of [2, 4).
  std::smatch route, kill, failed, replaced;
  REQUIRE(std::regex_search(r.out, route, std::regex(R"(route \[0, 2\) via s-a -> \[2, 4\) via (s-[bc]))")));
  REQUIRE(std::regex_search(r.out, kill, std::regex(R"(token 16 of 48: kill -9 (s-[bc]) \(pid \d+\))")));
  REQUIRE(std::regex_search(r.out, failed, std::regex(R"(server (s-[bc]) failed on blocks \[2, 4\): )")));
  REQUIRE(std::regex_search(
      r.out, replaced,
      std::regex(R"(replacing (s-[bc]) on \[2, 4\) with \[2, 4\) via (s-[bc]); replaying (\d+) stored rows)")));
  const std::string victim = route[1].str();
  CHECK(kill[1].str() == victim);
  CHECK(failed[1].str() == victim);
  CHECK(replaced[1].str() == victim);
  CHECK(replaced[2].str() != victim);
  CHECK(std::stoi(replaced[3].str()) >= 16);  // the prompt and the tokens before the kill
  CHECK(r.out.find("1 failover(s)") != std::string::npos);
  CHECK(r.out.find("the swarm output equals the local greedy output, token for token (48 tokens)") !=
        std::string::npos);
  for (const char* id : {"s-a", "s-b", "s-c"}) CHECK(fs::exists(out / ("serve-" + std::string(id) + ".log")));
  // Every server was stopped and reaped before the demo exited.
  std::string left;
  for (const auto& p : processes_with(" serve ", (out / "model").string())) left += "\n  " + p;
  CHECK_MESSAGE(left.empty(), "servers outlived the demo:" << left);

  auto g = run_corolla({"generate", "--model", (out / "model").string(), "--prompt",
                        "The little fox", "--max-new-tokens", "8", "--print-ids"});
  INFO("generate stderr: " << g.err);
  CHECK(g.exit_code == 0);
  CHECK_FALSE(g.out_lines().empty());
}

TEST_CASE("demo --no-swarm stops after the local generation") {
  temp_dir_guard dir("demo-no-swarm");
  fs::path out = dir / "run";
  auto r = run_corolla({"demo", "--out", out.string(), "--seconds", "1", "--max-new-tokens", "4",
                        "--threads", "2", "--no-swarm"},
                       std::chrono::seconds(120));
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("[4/4]") != std::string::npos);
  CHECK(r.out.find("== swarm") == std::string::npos);
  CHECK_FALSE(fs::exists(out / "serve-s-a.log"));
}
