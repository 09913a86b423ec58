// `corolla bench attention`: training attention per matmul precision next to
// the GEMM rate at that precision. The cpu run is checked everywhere; with a
// GPU visible, f32 and bf16 both run and their outputs agree to bf16
// rounding, and the two tensor-core kernel families (--kernels fa,wmma)
// agree.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"

using corolla::testing::run_corolla;

namespace {

nlohmann::json only_line(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  REQUIRE(std::getline(lines, line));
  const auto j = nlohmann::json::parse(line);
  CHECK_FALSE(std::getline(lines, line));  // --json: nothing but the one line
  return j;
}

}  // namespace

TEST_CASE("bench attention on the cpu prints forward and backward rates against the GEMM rate") {
  auto r = run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--threads", "1", "--rounds",
                        "1", "--calls", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = only_line(r.out);
  CHECK(j["bench"] == "attention");
  CHECK(j["device"] == "cpu");
  CHECK(j["shape"] == "tiny");
  CHECK(j["head_dim"] == 32);
  REQUIRE(j["results"].size() == 1);
  const auto& f32 = j["results"][0];
  CHECK(f32["precision"] == "f32");
  CHECK(f32["storage"] == "f32");
  for (const char* key : {"forward_ms", "backward_ms", "forward_tflops", "backward_tflops", "gemm_tflops",
                          "attention_vs_gemm"}) {
    CAPTURE(key);
    CHECK(f32[key].get<double>() > 0);
  }
  CHECK(f32["max_out_diff_vs_first"].get<double>() == 0.0);
  CHECK(f32["kernels"] == "-");  // no tensor cores on the cpu
  CHECK_FALSE(j.contains("speedup_last_vs_first"));
  CHECK_FALSE(j.contains("fa_vs_wmma"));
}

TEST_CASE("bench attention refuses unknown shapes, precisions and storage, and bf16 on the cpu") {
  corolla::testing::check_one_error(run_corolla({"bench", "attention", "--device", "cpu", "--shape", "huge"}),
                                    "unknown --shape 'huge'");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--precisions", "fp8"}),
      "unknown matmul precision 'fp8'");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--precisions", "f32,bf16"}),
      "the CPU backend computes in f32");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--rounds", "0"}),
      "need --rounds >= 1");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--storage", "fp8"}),
      "unknown --storage 'fp8'");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--storage", "f32,bf16"}),
      "no bf16 storage on cpu");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--kernels", "flash"}),
      "unknown --kernels 'flash' (expected fa or wmma)");
  corolla::testing::check_one_error(
      run_corolla({"bench", "attention", "--device", "cpu", "--shape", "tiny", "--kernels", "fa,wmma"}),
      "--kernels chooses CUDA tensor-core kernels; the cpu has none");
}

TEST_CASE("bench attention on a GPU runs f32 and bf16 (tensor cores) and their outputs agree") {
  if (corolla::cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  auto r = run_corolla({"bench", "attention", "--device", "cuda", "--shape", "tiny", "--rounds", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = only_line(r.out);
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][0]["precision"] == "f32");
  CHECK(j["results"][1]["precision"] == "bf16");
  const double diff = j["results"][1]["max_out_diff_vs_first"].get<double>();
  CHECK(diff > 0.0);   // the bf16 kernels ran
  CHECK(diff < 3e-2);  // and agree to bf16 rounding (outputs are below 1 in magnitude)
  CHECK(j["speedup_last_vs_first"].get<double>() > 0);
}

TEST_CASE("bench attention on a GPU runs 16-bit storage beside f32 and their outputs agree") {
  if (corolla::cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  auto r = run_corolla({"bench", "attention", "--device", "cuda", "--shape", "tiny", "--precisions", "f32", "--storage",
                        "f32,bf16,f16", "--rounds", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = only_line(r.out);
  REQUIRE(j["results"].size() == 3);
  CHECK(j["results"][1]["storage"] == "bf16");
  CHECK(j["results"][2]["storage"] == "f16");
  CHECK(j["results"][1]["max_out_diff_vs_first"].get<double>() < 3e-2);  // bf16 rounding of inputs and output
  CHECK(j["results"][2]["max_out_diff_vs_first"].get<double>() < 4e-3);
}

TEST_CASE("bench attention on a GPU times both tensor-core kernel families and their outputs agree") {
  if (corolla::cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  auto r = run_corolla({"bench", "attention", "--device", "cuda", "--shape", "tiny", "--precisions", "bf16",
                        "--storage", "bf16", "--kernels", "fa,wmma", "--rounds", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = only_line(r.out);
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][0]["kernels"] == "fa");
  CHECK(j["results"][1]["kernels"] == "wmma");
  // The same roundings: the two families differ only in f32 summation order.
  CHECK(j["results"][1]["max_out_diff_vs_first"].get<double>() < 1e-2);
  REQUIRE(j["fa_vs_wmma"].size() == 1);
  CHECK(j["fa_vs_wmma"][0]["fa_vs_wmma"].get<double>() > 0);
}
