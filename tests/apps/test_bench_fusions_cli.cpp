// `corolla bench fusions`: training's fused ops against the two ops each
// replaces. Argument errors everywhere; on the cpu (which has none of the
// product fusions, nor batched q/k/v or gate/up) every op runs and reports
// itself unfused; on a GPU the products must be fused and those batched.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::check_one_error;
using corolla::testing::run_corolla;

TEST_CASE("bench fusions refuses bad sizes, dtypes and 16 bits on the cpu with one clear error") {
  check_one_error(run_corolla({"bench", "fusions", "--device", "cpu", "--rows", "0"}),
                  "--rows, --hidden and --mlp must be positive");
  check_one_error(run_corolla({"bench", "fusions", "--device", "cpu", "--dtype", "f64"}),
                  "--dtype is auto, f32, bf16 or f16, not 'f64'");
  check_one_error(run_corolla({"bench", "fusions", "--device", "cpu", "--dtype", "bf16"}), "use --dtype f32 there");
  check_one_error(run_corolla({"bench", "fusions", "--device", "cpu", "--dtype", "f32", "--rounds", "0"}),
                  "need --rounds >= 1");
}

TEST_CASE("bench fusions times each fused op against its two ops, and says which the backend fused") {
  const bool gpu = corolla::cuda_device_count() > 0;
  // The default dtype, auto: bf16 on a GPU, f32 on the cpu.
  auto r = run_corolla({"bench", "fusions", "--device", gpu ? "cuda" : "cpu", "--rows", "40", "--hidden", "32",
                        "--mlp", "64", "--rounds", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "fusions");
  CHECK(j["dtype"] == (gpu ? "bf16" : "f32"));
  REQUIRE(j["results"].size() == 8);
  const char* ops[] = {"linear + add",      "linear + gelu",     "gemm + gelu_backward", "layernorm_backward + add",
                       "q, k, v products",  "q, k, v backward",  "gate, up products",    "gate, up backward"};
  for (std::size_t i = 0; i < 8; ++i) {
    const auto& row = j["results"][i];
    CHECK(row["op"] == ops[i]);
    CHECK(row["fused"] == gpu);  // the cpu has none of them (and runs one product each)
    CHECK(row["fused_ms"].get<double>() > 0);
    CHECK(row["separate_ms"].get<double>() > 0);
    CHECK(row["separate_over_fused"].get<double>() > 0);
  }
}
