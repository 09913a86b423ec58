// `corolla bench lora`: a LoRA adapter's training step against the whole
// model's, on a tiny model directory, in the same run; `corolla bench
// lora-serve`: a server's decode with adapters per session against the base.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::run_corolla;

TEST_CASE("bench lora times an adapter's step and the whole model's and reports what each trains and holds") {
  testing::temp_dir_guard dir("bench-lora");
  const testing::tiny_model_options o;  // 2-layer GQA Llama
  testing::write_tiny_model(dir / "m", o);
  const auto r = run_corolla({"bench", "lora", "--model", (dir / "m").string(), "--device", "cpu", "--batch", "2",
                              "--seq", "16", "--steps", "1", "--rank", "4", "--targets", "q_proj,down_proj",
                              "--threads", "1", "--weights", "nf4", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "lora");
  // --weights nf4: the adapter's step beside nf4 weights too, and their bytes.
  CHECK(j["base_weights"] == "nf4");
  CHECK(j["quantised_ms"].get<double>() > 0);
  CHECK(j["quantised_vs_lora"].get<double>() == doctest::Approx(j["quantised_ms"].get<double>() / j["lora_ms"].get<double>()));
  CHECK(j["weight_bytes"].get<double>() >= 4.0 * j["parameters"].get<double>());
  CHECK(j["quantised_weight_bytes"].get<double>() < 0.6 * j["weight_bytes"].get<double>());
  CHECK(j["rank"] == 4);
  CHECK(j["targets"] == nlohmann::json::array({"self_attn.q_proj", "mlp.down_proj"}));
  lora_config c;
  c.rank = 4;
  c.targets = {"q_proj", "down_proj"};
  const model_config cfg = testing::tiny_config(o);
  CHECK(j["adapter_values"] == lora_adapter::init(cfg, c, 0, cpu_backend()).numel());
  CHECK(j["parameters"] == cfg.parameter_count());
  CHECK(j["full_ms"].get<double>() > 0);
  CHECK(j["lora_ms"].get<double>() > 0);
  CHECK(j["time_vs_full"].get<double>() == doctest::Approx(j["lora_ms"].get<double>() / j["full_ms"].get<double>()));
  // The adapter's run makes no gradient buffer of the model: its state is
  // the adapter's values, gradients and two moments, 4 bytes each.
  CHECK(j["lora_model_grad_bytes"].get<double>() == 0.0);
  CHECK(j["lora_state_bytes"].get<double>() == 16.0 * j["adapter_values"].get<double>());
  // The whole model's: a gradient and two moments per parameter.
  CHECK(j["full_state_bytes"].get<double>() == 12.0 * j["parameters"].get<double>());
  const auto bad = run_corolla({"bench", "lora", "--model", (dir / "m").string(), "--device", "cpu", "--seq", "16",
                                "--targets", "c_attn"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("names no module") != std::string::npos);
}

TEST_CASE("bench lora-serve decodes base sessions, one adapter's and each its own, times a fine-tuning request, and reports the ratios") {
  testing::temp_dir_guard dir("bench-lora-serve");
  const testing::tiny_model_options o;  // 2-layer GQA Llama
  testing::write_tiny_model(dir / "m", o);
  const auto r = run_corolla({"bench", "lora-serve", "--model", (dir / "m").string(), "--device", "cpu",
                              "--sessions", "3", "--prompt-tokens", "4", "--new-tokens", "3", "--rounds", "1",
                              "--rank", "2", "--targets", "all-linear", "--weights", "int8", "--threads", "1", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "lora-serve");
  CHECK(j["weights"] == "i8");
  CHECK(j["rank"] == 2);
  CHECK(j["targets"].size() == 7u);
  const auto& levels = j["levels"];
  REQUIRE(levels.size() == 2u);  // one session, and three
  CHECK(levels[0]["sessions"] == 1);
  CHECK(levels[1]["sessions"] == 3);
  for (const auto& l : levels) {
    CHECK(l["base_tokens_per_s"].get<double>() > 0);
    CHECK(l["own_adapters_tokens_per_s"].get<double>() > 0);
    CHECK(l["one_adapter_vs_base"].get<double>() ==
          doctest::Approx(l["one_adapter_tokens_per_s"].get<double>() / l["base_tokens_per_s"].get<double>()));
  }
  // A fine-tuning request (forward and backward of 4 rows) with the adapter and without.
  CHECK(j["finetune_rows"] == 4);
  CHECK(j["finetune_base_ms"].get<double>() > 0);
  CHECK(j["finetune_adapter_vs_base"].get<double>() ==
        doctest::Approx(j["finetune_base_ms"].get<double>() / j["finetune_adapter_ms"].get<double>()));
  const auto bad = run_corolla({"bench", "lora-serve", "--model", (dir / "m").string(), "--device", "cpu",
                                "--weights", "int3"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("int3") != std::string::npos);
}

TEST_CASE("bench lora-ranks runs the adapter across rank processes beside f32 and beside nf4 blocks and reports each "
          "rank's memory and the steps' speed") {
  testing::temp_dir_guard dir("bench-lora-ranks");
  const testing::tiny_model_options o;
  testing::write_tiny_model(dir / "m", o);
  const std::vector<std::string> base{"bench", "lora-ranks", "--model", (dir / "m").string(), "--pp", "2",
                                      "--steps", "3", "--batch", "2", "--seq", "8", "--rank", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_corolla(a);
  };
  const auto r = with({"--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["bench"] == "lora-ranks");
  CHECK(j["layout"] == "2x1");
  CHECK(j["weights"] == "nf4");
  CHECK(j["parameters"] == testing::tiny_config(o).parameter_count());
  for (const char* run : {"f32", "quantised"}) {
    CAPTURE(run);
    REQUIRE(j[run]["rank_peak_mib"].size() == 2u);  // both ranks were sampled
    for (const auto& m : j[run]["rank_peak_mib"]) CHECK(m.get<double>() > 1);
    CHECK(j[run]["tokens_per_s"].get<double>() > 0);
  }
  auto largest = [&](const char* run) {
    double m = 0;
    for (const auto& x : j[run]["rank_peak_mib"]) m = std::max(m, x.get<double>());
    return m;
  };
  CHECK(j["memory_ratio"].get<double>() == doctest::Approx(largest("quantised") / largest("f32")));
  CHECK(j["speed_ratio"].get<double>() ==
        doctest::Approx(j["quantised"]["tokens_per_s"].get<double>() / j["f32"]["tokens_per_s"].get<double>()));

  const auto same = with({"--weights", "f32"});
  CHECK(same.exit_code != 0);
  CHECK(same.err.find("--weights f32 is the baseline") != std::string::npos);
}
