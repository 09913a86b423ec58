// `corolla bench gemm`: Backend::linear vs the vendor GEMM called directly;
// on the CPU the comparison runs, a missing GPU is one clear error.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::run_corolla;

TEST_CASE("bench gemm on the cpu prints a JSON line with backend vs OpenBLAS for every shape") {
  auto r = run_corolla({"bench", "gemm", "--device", "cpu", "--shapes", "tiny", "--threads", "1",
                        "--rounds", "2", "--round-ms", "5", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  std::istringstream lines(r.out);
  std::string line;
  REQUIRE(std::getline(lines, line));
  const auto j = nlohmann::json::parse(line);
  CHECK(j["bench"] == "gemm");
  CHECK(j["device"] == "cpu");
  CHECK(j["dtype"] == "f32");
  CHECK(j["baseline"] == "OpenBLAS cblas_sgemm");
  REQUIRE(j["results"].size() == 8);  // 4 layers x rows {1, 16}
  for (const auto& s : j["results"]) {
    CAPTURE(s.dump());
    CHECK(s["backend_tflops"].get<double>() > 0);
    CHECK(s["baseline_tflops"].get<double>() > 0);
    CHECK(s["backend_vs_baseline"].get<double>() > 0);
  }
  CHECK(j["results"][0]["m"] == 1);
  CHECK(j["results"][7]["m"] == 16);
  CHECK(j["results"][7]["n"] == 256);  // the tiny LM head
  CHECK(j["backend_vs_baseline"].get<double>() > 0);
  CHECK(j["backend_vs_baseline_min"].get<double>() <= j["backend_vs_baseline"].get<double>() + 1e-12);
  CHECK_FALSE(std::getline(lines, line));  // --json: nothing but the one line
}

TEST_CASE("bench gemm --rows overrides the preset's row counts, bf16 on the cpu is refused") {
  auto r = run_corolla({"bench", "gemm", "--shapes", "tiny", "--rows", "3", "--threads", "1",
                        "--rounds", "1", "--round-ms", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  REQUIRE(j["results"].size() == 4);
  for (const auto& s : j["results"]) CHECK(s["m"] == 3);

  corolla::testing::check_one_error(
      run_corolla({"bench", "gemm", "--device", "cpu", "--shapes", "tiny", "--dtype", "bf16"}),
      "the CPU backend computes in f32");
  corolla::testing::check_one_error(run_corolla({"bench", "gemm", "--shapes", "huge"}),
                                    "unknown --shapes 'huge'");
}

TEST_CASE("bench gemm --device cuda without a GPU is one clear error") {
  if (corolla::cuda_device_count() > 0) {
    MESSAGE("a CUDA device is visible: the no-GPU error cannot be checked here");
    return;
  }
  corolla::testing::check_one_error(
      run_corolla({"bench", "gemm", "--device", "cuda", "--shapes", "tiny", "--json"}),
      "device cuda:0 requested but");
}

TEST_CASE("bench decode --device cuda without a GPU is one clear error") {
  if (corolla::cuda_device_count() > 0) {
    MESSAGE("a CUDA device is visible: the no-GPU error cannot be checked here");
    return;
  }
  corolla::testing::check_one_error(run_corolla({"bench", "decode", "--device", "cuda", "--json"}),
                                    "device cuda:0 requested but");
}
