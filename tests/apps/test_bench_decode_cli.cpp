// `corolla bench decode --weights`: the bound counts the bytes decode reads
// (2 per linear weight with bf16; 1 with int8 plus a scale per row; half
// with nf4 plus an absmax per 64 values of a row, and an int8 LM head),
// each format measures f32 in the same run, int8 and nf4 bf16 too, and
// prints the ratios (and on a GPU that launches early, early launch against
// serialised launches); a bad --weights value is one clear error.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/transformer.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using corolla::testing::last_json_line;
using corolla::testing::run_corolla;

namespace {

/// The bytes of the tiny model's linear weights (blocks' 2-D parameters and
/// the LM head) and everything else, counted independently of the bench.
struct byte_counts {
  double f32 = 0, int8 = 0, nf4 = 0;
};

byte_counts expected_bytes(const std::string& dir) {
  corolla::transformer m = corolla::transformer::load(dir, corolla::cpu_backend());
  byte_counts b;
  auto linear = [&](double out, double in, bool head) {
    b.f32 += 4 * out * in;
    b.int8 += out * in + 4 * out;
    b.nf4 += head ? out * in + 4 * out : out * std::ceil(in / 2) + 4 * out * std::ceil(in / 64);
  };
  for (const auto& p : m.blocks())
    for (const auto& e : p.entries()) {
      if (e.shape.size() == 2) {
        linear(static_cast<double>(e.shape[0]), static_cast<double>(e.shape[1]), false);
      } else {
        for (double* x : {&b.f32, &b.int8, &b.nf4}) *x += 4.0 * static_cast<double>(e.numel);
      }
    }
  const auto& c = m.config();
  linear(static_cast<double>(c.vocab_size), static_cast<double>(c.hidden_size), true);
  for (double* x : {&b.f32, &b.int8, &b.nf4}) *x += 2.0 * 4.0 * static_cast<double>(c.hidden_size);
  return b;
}

}  // namespace

TEST_CASE("bench decode --weights bf16, int8 and nf4 report the bytes they read and their ratios to f32 and bf16") {
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
  // int8 and nf4: their bytes with their scales, f32 and bf16 in the same run.
  const byte_counts want = expected_bytes(model);
  CHECK(b32 == doctest::Approx(want.f32).epsilon(1e-12));
  const auto i8 = run("int8");
  CHECK(i8["weights"] == "i8");
  CHECK(i8["decode_vs_f32"].get<double>() > 0);
  CHECK(i8["decode_vs_bf16"].get<double>() > 0);
  CHECK(i8["bf16_weight_bytes_per_token"].get<double>() == b16);
  CHECK(i8["weight_bytes_per_token"].get<double>() == doctest::Approx(want.int8).epsilon(1e-12));
  const auto q4 = run("nf4");
  CHECK(q4["weights"] == "nf4");
  CHECK(q4["decode_tokens_per_s"].get<double>() > 0);
  CHECK(q4["decode_vs_f32"].get<double>() > 0);
  CHECK(q4["decode_vs_bf16"].get<double>() > 0);
  CHECK(q4["weight_bytes_per_token"].get<double>() == doctest::Approx(want.nf4).epsilon(1e-12));
  CHECK(want.nf4 < want.int8);
  // A 16-bit KV cache alone is measured against the all-f32 generator too.
  const auto kv16 = run("f32", "f16");
  CHECK(kv16["kv_dtype"] == "f16");
  CHECK(kv16["weight_bytes_per_token"].get<double>() == b32);
  CHECK(kv16["decode_vs_f32"].get<double>() > 0);
}

TEST_CASE("bench decode with a bad --weights value is one clear error") {
  corolla::testing::check_one_error(
      run_corolla({"bench", "decode", "--weights", "int4", "--json"}),
      "--weights must be f32, bf16, int8 or nf4, got 'int4'");
  corolla::testing::check_one_error(run_corolla({"bench", "decode", "--kv-dtype", "int4", "--json"}),
                                    "--kv-dtype must be f32, bf16 or f16, got 'int4'");
}
