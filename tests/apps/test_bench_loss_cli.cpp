// `corolla bench loss`: the head's training loss with the logits in chunks
// of rows against all rows at once, in the same run.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::run_corolla;

TEST_CASE("bench loss times chunked and whole logits and reports their memory") {
  auto r = run_corolla({"bench", "loss", "--device", "cpu", "--rows", "40", "--vocab", "300", "--hidden", "16",
                        "--chunk-rows", "16", "--rounds", "1", "--threads", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "loss");
  CHECK(j["chunk_rows"] == 16);
  CHECK(j["whole_logits_mb"].get<double>() == doctest::Approx(40 * 300 * 4 / 1e6));
  CHECK(j["chunk_logits_mb"].get<double>() == doctest::Approx(16 * 300 * 4 / 1e6));
  CHECK(j["whole_ms"].get<double>() > 0);
  CHECK(j["chunked_ms"].get<double>() > 0);
  CHECK(j["time_vs_whole"].get<double>() > 0);
  // The budget rule keeps a small vocabulary's rows in one chunk.
  auto rule = run_corolla({"bench", "loss", "--device", "cpu", "--rows", "40", "--vocab", "300", "--hidden", "16",
                           "--rounds", "1", "--threads", "1", "--json"});
  REQUIRE(rule.exit_code == 0);
  CHECK(nlohmann::json::parse(rule.out)["chunk_rows"] == 40);
}

TEST_CASE("bench loss refuses bad sizes as usage errors naming the flag") {
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--rows", "0"}, "--rows: must be a whole number in [1, 1073741824], got '0'"},
           {{"--chunk-rows", "-2"}, "--chunk-rows: must be a whole number in [0, 1073741824], got '-2'"},
           {{"--hidden", "99999999999"}, "--hidden: must be a whole number in [1, 1048576], got '99999999999'"},
           {{"--rounds", "0"}, "--rounds: must be a whole number in [1, 1000], got '0'"}}) {
    std::vector<std::string> argv{"bench", "loss", "--device", "cpu"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_corolla(argv);
    INFO("stderr: " << r.err);
    REQUIRE(r.exited());
    CHECK(r.exit_code == 105);  // CLI11's validation error
    CHECK(r.err.find(expected) != std::string::npos);
  }
}
