// `corolla bench train|decode --profile`: after the measurement, one more
// run with every op synchronised and timed; the JSON gets the per-op table
// (for training also with gradient accumulation over micro-batches).
#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using corolla::testing::last_json_line;
using corolla::testing::run_corolla;

namespace {

/// The profile's op names, after checking its rows add up.
std::set<std::string> profiled_ops(const nlohmann::json& j) {
  REQUIRE(j.contains("profile"));
  const auto& p = j["profile"];
  double ms = 0, share = 0;
  std::set<std::string> ops;
  for (const auto& row : p["ops"]) {
    CAPTURE(row.dump());
    CHECK(row["calls"].get<long long>() > 0);
    CHECK(row["ms"].get<double>() >= 0);
    ms += row["ms"].get<double>();
    share += row["share"].get<double>();
    ops.insert(row["op"].get<std::string>());
  }
  CHECK(ms == doctest::Approx(p["total_ms"].get<double>()).epsilon(1e-9));
  CHECK(share == doctest::Approx(1.0).epsilon(1e-9));
  return ops;
}

}  // namespace

TEST_CASE("bench train --profile breaks one step down by op, without it there is no profile") {
  corolla::testing::temp_dir_guard dir("bench-profile-train");
  corolla::testing::write_tiny_model(dir.path(), {});
  std::vector<std::string> args{"bench", "train", "--model", dir.path().string(), "--device", "cpu", "--batch", "2",
                                "--seq", "16", "--steps", "1", "--threads", "1", "--json"};
  auto plain = run_corolla(args);
  CAPTURE(plain.err);
  REQUIRE(plain.exit_code == 0);
  CHECK_FALSE(last_json_line(plain.out).contains("profile"));
  CHECK(last_json_line(plain.out)["compute"] == "f32");
  CHECK_FALSE(last_json_line(plain.out).contains("speedup_vs_f32_compute"));  // no 16-bit run to compare
  CHECK(last_json_line(plain.out)["loss_scale"] == "off");
  CHECK_FALSE(last_json_line(plain.out).contains("speed_vs_unscaled"));
  CHECK_FALSE(last_json_line(plain.out).contains("attention_kernels"));  // CUDA only

  // Dynamic loss scaling in f32 is measured against the run without it.
  std::vector<std::string> scaled_args = args;
  scaled_args.insert(scaled_args.end(), {"--loss-scale", "dynamic"});
  auto scaled = run_corolla(scaled_args);
  CAPTURE(scaled.err);
  REQUIRE(scaled.exit_code == 0);
  const auto sj = last_json_line(scaled.out);
  CHECK(sj["loss_scale"] == "dynamic");
  CHECK(sj["skipped_steps"] == 0);
  CHECK(sj["unscaled_tokens_per_s"].get<double>() > 0.0);
  CHECK(sj["speed_vs_unscaled"].get<double>() > 0.0);

  args.push_back("--profile");
  auto r = run_corolla(args);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = last_json_line(r.out);
  CHECK(j["profile"]["run"] == "one training step");
  const auto ops = profiled_ops(j);
  for (const char* op : {"linear", "linear_backward", "attention", "attention_backward", "rmsnorm_backward",
                         "cross_entropy", "adamw", "embedding_backward"}) {
    CAPTURE(op);
    CHECK(ops.count(op) == 1);
  }
  CHECK(j["micro_batch"] == 2);  // the whole batch at once
  CHECK_FALSE(j.contains("speedup_vs_micro_batch_alone"));

  // Gradient accumulation: the step's forward and backward twice, one
  // sequence each, and one optimiser step.
  args.insert(args.end(), {"--micro-batch", "1"});
  auto micro = run_corolla(args);
  CAPTURE(micro.err);
  REQUIRE(micro.exit_code == 0);
  const auto mj = last_json_line(micro.out);
  CHECK(mj["batch"] == 2);
  CHECK(mj["micro_batch"] == 1);
  // Against the micro-batch alone (batch 1, no accumulation), same run.
  CHECK(mj["micro_batch_alone_tokens_per_s"].get<double>() > 0.0);
  CHECK(mj["speedup_vs_micro_batch_alone"].get<double>() > 0.0);
  const auto calls = [](const nlohmann::json& run, const std::string& op) {
    for (const auto& row : run["profile"]["ops"])
      if (row["op"] == op) return row["calls"].get<long long>();
    return 0LL;
  };
  for (const char* op : {"cross_entropy", "embedding_backward", "attention_backward"}) {
    CAPTURE(op);
    CHECK(calls(mj, op) == 2 * calls(j, op));
  }
  CHECK(calls(mj, "adamw") == calls(j, "adamw"));
  args.back() = "3";
  corolla::testing::check_one_error(run_corolla(args), "a micro-batch of 3 sequences does not divide the batch of 2");
}

TEST_CASE("bench decode --profile breaks a generation down by op") {
  corolla::testing::temp_dir_guard dir("bench-profile-decode");
  corolla::testing::write_tiny_model(dir.path(), {});
  auto r = run_corolla({"bench", "decode", "--model", dir.path().string(), "--device", "cpu", "--weights", "bf16",
                        "--prompt-tokens", "4", "--new-tokens", "6", "--repeats", "1", "--threads", "1", "--profile",
                        "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = last_json_line(r.out);
  CHECK(j["profile"]["run"] == "one generation: a 1-token prompt and 6 new tokens");
  const auto ops = profiled_ops(j);
  for (const char* op : {"linear (inference weight)", "attention_cached", "embedding"}) {
    CAPTURE(op);
    CHECK(ops.count(op) == 1);
  }
}

TEST_CASE("bench train --compute takes f32, or bf16/f16 on a GPU, --cluster refuses it") {
  corolla::testing::temp_dir_guard dir("bench-train-compute");
  corolla::testing::write_tiny_model(dir.path(), {});
  auto args = [&](const char* compute) {
    return std::vector<std::string>{"bench", "train", "--model", dir.path().string(), "--device", "cpu", "--batch",
                                    "1", "--seq", "8", "--steps", "1", "--threads", "1", "--compute", compute};
  };
  corolla::testing::check_one_error(run_corolla(args("bf16")),
                                    "--compute bf16 needs a GPU (--device cuda): the cpu backend computes in f32");
  corolla::testing::check_one_error(run_corolla(args("fp8")), "the compute dtype is f32, bf16 or f16, not 'fp8'");
  corolla::testing::check_one_error(run_corolla(args("f16")), "--compute f16 needs a GPU (--device cuda)");
  corolla::testing::check_one_error(run_corolla({"bench", "train", "--cluster", "none.toml", "--compute", "bf16"}),
                                    "--compute and --loss-scale do not apply");
  corolla::testing::check_one_error(run_corolla({"bench", "train", "--cluster", "none.toml", "--loss-scale", "off"}),
                                    "--compute and --loss-scale do not apply");
  std::vector<std::string> bad_scale = args("f32");
  bad_scale.insert(bad_scale.end(), {"--loss-scale", "2"});
  corolla::testing::check_one_error(run_corolla(bad_scale), "--loss-scale must be auto, dynamic or off, got '2'");
}
