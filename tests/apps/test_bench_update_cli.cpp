// `corolla bench update`: a training rank's bucket update on the device vs
// on the host. Argument errors are checked everywhere; the measurement only
// where a GPU is visible (the cpu is refused: both paths would be the same).
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::check_one_error;
using corolla::testing::run_corolla;

TEST_CASE("bench update refuses the cpu and bad sizes or groups with one clear error") {
  check_one_error(run_corolla({"bench", "update", "--device", "cpu"}), "it needs --device cuda[:N]");
  check_one_error(run_corolla({"bench", "update", "--device", "cpu", "--sizes", "10,0"}),
                  "--sizes takes positive parameter counts, got '0'");
  check_one_error(run_corolla({"bench", "update", "--device", "cpu", "--groups", "2,x"}),
                  "--groups takes positive group sizes, got 'x'");
  check_one_error(run_corolla({"bench", "update", "--device", "cpu", "--rounds", "0"}), "need --rounds >= 1");
  check_one_error(run_corolla({"bench", "update", "--compute-copy", "f32"}),
                  "--compute-copy is bf16, f16 or none, not 'f32'");
}

TEST_CASE("bench update on a GPU times the device and host updates per bucket and group") {
  if (corolla::cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  auto r = run_corolla({"bench", "update", "--device", "cuda", "--sizes", "100000", "--groups", "1,2", "--rounds",
                        "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "update");
  REQUIRE(j["results"].size() == 2);
  for (const auto& row : j["results"]) {
    CHECK(row["parameters"] == 100000);
    CHECK(row["device_ms"].get<double>() > 0);
    CHECK(row["host_ms"].get<double>() > 0);
    CHECK(row["host_over_device"].get<double>() > 0);
  }
  REQUIRE(j["compute_copy"].size() == 1);
  CHECK(j["compute_copy"][0]["copy"] == "bf16");
  CHECK(j["compute_copy"][0]["separate_over_fused"].get<double>() > 0);
}
