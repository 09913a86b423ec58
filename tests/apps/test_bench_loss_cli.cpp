// `corolla bench loss`: the head's training loss with the logits in chunks
// of rows against all rows at once, in the same run.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::check_one_error;
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

TEST_CASE("bench loss refuses bad sizes with one clear error") {
  check_one_error(run_corolla({"bench", "loss", "--device", "cpu", "--rows", "0"}), "need --rows >= 1");
  check_one_error(run_corolla({"bench", "loss", "--device", "cpu", "--chunk-rows", "-2"}), "--chunk-rows >= 0");
}
