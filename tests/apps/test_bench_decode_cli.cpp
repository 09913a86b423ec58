// `corolla bench decode --weights`: the bound counts the bytes decode reads
// (2 per linear weight with bf16), bf16 measures f32 in the same run and
// prints the ratio (and on a GPU that launches early, early launch against
// serialised launches); a bad --weights value is one clear error.
#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using corolla::testing::last_json_line;
using corolla::testing::run_corolla;

TEST_CASE("bench decode --weights bf16 and int8 report half and a quarter of the linear bytes, and the ratio to f32") {
  corolla::testing::temp_dir_guard dir("bench-decode-bf16");
  corolla::testing::write_tiny_model(dir.path(), {});
  const std::string model = dir.path().string();
  auto run = [&](const std::string& weights, const std::string& kv = "f32") {
    auto r = run_corolla({"bench", "decode", "--model", model, "--weights", weights, "--kv-dtype", kv,
                          "--prompt-tokens", "4", "--new-tokens", "8", "--repeats", "1",
                          "--threads", "1", "--json"});
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    return last_json_line(r.out);
  };
  const auto f32 = run("f32");
  CHECK(f32["weights"] == "f32");
  CHECK_FALSE(f32.contains("decode_vs_f32"));
  const auto bf16 = run("bf16");
  CHECK(bf16["weights"] == "bf16");
  CHECK(bf16["decode_tokens_per_s"].get<double>() > 0);
  CHECK(bf16["f32_decode_tokens_per_s"].get<double>() > 0);
  CHECK(bf16["decode_vs_f32"].get<double>() > 0);
  // On a GPU of sm_90 or later (the default device where one is present)
  // early launch is measured against serialised launches in the same run.
  REQUIRE(bf16.contains("early_launch"));
  if (bf16["early_launch"].get<bool>()) {
    CHECK(bf16["decode_vs_serialised"].get<double>() > 0);
    CHECK(bf16["gemv"].size() > 0);
  } else {
    CHECK_FALSE(bf16.contains("decode_vs_serialised"));
  }
  const double b16 = bf16["weight_bytes_per_token"].get<double>();
  const double b32 = f32["weight_bytes_per_token"].get<double>();
  CHECK(bf16["f32_weight_bytes_per_token"].get<double>() == b32);
  // every linear weight at 2 bytes instead of 4; norms (a few hundred
  // floats in the tiny model) stay at 4
  CHECK(b16 < 0.52 * b32);
  CHECK(b16 > 0.5 * b32);
  CHECK(f32["kv_dtype"] == "f32");
  // int8: a quarter of the linear bytes (the scales are left out), f32 in the same run.
  const auto i8 = run("int8");
  CHECK(i8["weights"] == "i8");
  CHECK(i8["decode_vs_f32"].get<double>() > 0);
  const double b8 = i8["weight_bytes_per_token"].get<double>();
  CHECK(b8 < 0.27 * b32);
  CHECK(b8 > 0.25 * b32);
  // A 16-bit KV cache alone is measured against the all-f32 generator too.
  const auto kv16 = run("f32", "f16");
  CHECK(kv16["kv_dtype"] == "f16");
  CHECK(kv16["weight_bytes_per_token"].get<double>() == b32);
  CHECK(kv16["decode_vs_f32"].get<double>() > 0);
}

TEST_CASE("bench decode with a bad --weights value is one clear error") {
  corolla::testing::check_one_error(
      run_corolla({"bench", "decode", "--weights", "int4", "--json"}),
      "--weights must be f32, bf16 or int8, got 'int4'");
  corolla::testing::check_one_error(run_corolla({"bench", "decode", "--kv-dtype", "int4", "--json"}),
                                    "--kv-dtype must be f32, bf16 or f16, got 'int4'");
}
