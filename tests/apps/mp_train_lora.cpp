// `corolla train --lora-rank R --pp P --dp D`: a LoRA adapter trained across
// real rank processes on 127.0.0.1 against the library's single-process
// LoRA training on the same global batch (distributed equals
// single-process): the losses step by step, the adapter --save writes
// (PEFT's layout, gathered from the stages), going on from a saved adapter
// with --adapter, and the frozen model left as it was. (The flags a
// distributed LoRA job refuses: tests/apps/test_lora_cli.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"
#include "tests/apps/train_test_util.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;
using namespace corolla::testing::train_test;
namespace fs = std::filesystem;

// Adapters take a larger rate than whole models; at 3e-2 this one's loss
// jumps about, and the runs' summation orders (micro-batches, the DP sums)
// part after some 17 steps, as one process does with --micro-batch 1.
constexpr float kLr = 1e-2f;
constexpr int kSeed = 4;

/// A tiny model with weights (an adapter of freshly drawn, unsaved weights
/// is refused) and the token pattern.
job lora_job(const temp_dir_guard& tmp, architecture arch) {
  job j;
  j.model = tmp / "model";
  write_tiny_model(j.model, tiny(arch));
  j.data = tmp / "tokens.bin";
  write_raw_u16(j.data, pattern_tokens(3000));
  j.lr = kLr;
  return j;
}

/// The largest difference between two adapters' values, over the largest
/// value (both of one shape).
double relative_difference(const lora_adapter& got, const lora_adapter& want) {
  double diff = 0, scale = 0;
  REQUIRE(got.n_layers() == want.n_layers());
  for (int i = 0; i < got.n_layers(); ++i) {
    const Tensor g = got.block(i).flat(), w = want.block(i).flat();
    REQUIRE(g.numel() == w.numel());
    for (std::int64_t k = 0; k < g.numel(); ++k) {
      diff = std::max(diff, static_cast<double>(std::abs(g.data<float>()[k] - w.data<float>()[k])));
      scale = std::max(scale, static_cast<double>(std::abs(w.data<float>()[k])));
    }
  }
  return scale > 0 ? diff / scale : diff;
}

/// Flags `a` followed by `more`.
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

/// Rank 4, alpha 8 on `targets` (empty: the family's default).
lora_config rank4(std::vector<std::string> targets = {}) {
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  c.targets = std::move(targets);
  return c;
}

nlohmann::json summary_of(const process_result& r) {
  for (const std::string& l : r.out_lines())
    if (auto j = nlohmann::json::parse(l, nullptr, false); j.is_object() && j.contains("tokens")) return j;
  return {};
}

}  // namespace

TEST_CASE("a LoRA adapter trains across pipeline x data-parallel ranks with the single-process losses, and --save "
          "gathers the same adapter") {
  temp_dir_guard tmp("mp-train-lora");
  const job j = lora_job(tmp, architecture::llama);
  const model_config cfg = load_config(j.model);
  const lora_config c = rank4({"all-linear"});
  lora_adapter want = lora_adapter::init(cfg, c, kSeed, cpu_backend());
  const std::vector<float> losses = lora_reference_losses(j, want);
  REQUIRE(losses.back() < losses.front() - 0.05f);  // the adapter learns something worth comparing

  // Pure pipeline (the frozen head on the first and the last stage), pure
  // data parallel, both, and interleaved chunks.
  struct layout {
    int pp, dp;
    std::vector<std::string> extra;
  };
  for (const layout& l : std::vector<layout>{{4, 1, {}}, {1, 2, {}}, {2, 2, {}}, {2, 1, {"--chunks", "2"}}}) {
    INFO("layout " << l.pp << "x" << l.dp << (l.extra.empty() ? "" : " with 2 chunks"));
    const fs::path saved = tmp / ("adapter-" + std::to_string(l.pp) + "x" + std::to_string(l.dp) +
                                  (l.extra.empty() ? "" : "v2"));
    std::vector<std::string> extra{"--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "all-linear",
                                   "--seed",      "4", "--save",       saved.string()};
    extra.insert(extra.end(), l.extra.begin(), l.extra.end());
    const process_result r = run_layout(j, l.pp, l.dp, extra);
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), losses, 1e-5);
    // The adapter, gathered from the stages' replica 0, is the library's.
    REQUIRE(fs::exists(saved / "adapter_config.json"));
    CHECK_FALSE(fs::exists(saved / "model.safetensors"));
    const lora_adapter got = lora_adapter::load(saved, cfg, cpu_backend());
    CHECK(got.config().targets == want.config().targets);
    CHECK(relative_difference(got, want) < 1e-4);
    const nlohmann::json s = summary_of(r);
    CHECK(s["adapter"]["rank"] == 4);
    CHECK(s["adapter"]["parameters"] == want.numel());
    CHECK(s["saved"] == saved.string());
  }

  // --adapter: on from the saved adapter (its own rank, alpha and targets),
  // clipped, as the library goes on from it.
  job on = j;
  on.clip = 0.5f;
  on.steps = 8;
  lora_adapter again = lora_adapter::load(tmp / "adapter-2x2", cfg, cpu_backend());
  const std::vector<float> on_losses = lora_reference_losses(on, again);
  const process_result r =
      run_layout(on, 2, 2, {"--adapter", (tmp / "adapter-2x2").string(), "--save", (tmp / "again").string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), on_losses, 1e-5);
  CHECK(on_losses.front() < losses.front() - 0.05f);  // it starts where the first run left off
  CHECK(relative_difference(lora_adapter::load(tmp / "again", cfg, cpu_backend()), again) < 1e-4);
}

TEST_CASE("a GPT-2 adapter (tied embeddings frozen on both ends, c_attn's stacked q, k, v) trains in 2x2 like one "
          "process") {
  temp_dir_guard tmp("mp-train-lora-gpt2");
  const job j = lora_job(tmp, architecture::gpt2);
  lora_config c;
  c.rank = 2;
  c.alpha = 4.0f;  // the default targets: c_attn
  lora_adapter want = lora_adapter::init(load_config(j.model), c, kSeed, cpu_backend());
  const std::vector<float> losses = lora_reference_losses(j, want);
  const process_result r = run_layout(j, 2, 2, {"--lora-rank", "2", "--lora-alpha", "4", "--seed", "4"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), losses, 1e-5);
  CHECK(summary_of(r)["adapter"]["targets"] == nlohmann::json::array({"attn.c_attn"}));
}

TEST_CASE("a LoRA job's checkpoints hold the adapter and resume on another layout with the uninterrupted losses, and "
          "a job training anything else refuses them") {
  temp_dir_guard tmp("mp-train-lora-resume");
  job j = lora_job(tmp, architecture::llama);
  j.steps = 8;
  const model_config cfg = load_config(j.model);
  const lora_config c = rank4();
  lora_adapter want = lora_adapter::init(cfg, c, kSeed, cpu_backend());
  const std::vector<float> losses = lora_reference_losses(j, want);
  const fs::path ck = tmp / "ck";
  const std::vector<std::string> adapter{"--lora-rank", "4", "--lora-alpha", "8", "--seed", "4"};

  // 2x2 for 4 of the 8 steps, a checkpoint every 2.
  job first = j;
  first.steps = 4;
  const process_result a =
      run_layout(first, 2, 2, with(adapter, {"--checkpoint-dir", ck.string(), "--checkpoint-every", "2"}));
  INFO("stderr: " << a.err);
  REQUIRE(a.exit_code == 0);
  check_close(json_steps(a.out_lines()), std::vector<float>(losses.begin(), losses.begin() + 4), 1e-5);
  // The shards hold the adapter's blocks (and their moments), not the model.
  const std::string manifest = read_whole_file(ck / "step-4" / "manifest.json");
  CHECK(manifest.find("lora: r=4") != std::string::npos);

  // Resumed on 4x1: steps 5..8 as the uninterrupted run's, and the saved
  // adapter is the library's after 8 steps.
  const process_result b = run_layout(
      j, 4, 1, with(adapter, {"--checkpoint-dir", ck.string(), "--resume", "--save", (tmp / "saved").string()}));
  INFO("stderr: " << b.err);
  REQUIRE(b.exit_code == 0);
  check_close(json_steps(b.out_lines()), losses, 1e-5, 5);
  CHECK(relative_difference(lora_adapter::load(tmp / "saved", cfg, cpu_backend()), want) < 1e-4);

  // The whole model, an adapter of another rank, or the adapter beside
  // other frozen weights of the same shape (another seed's) does not
  // resume it.
  job other_model = j;
  other_model.model = tmp / "other";
  tiny_model_options t = tiny(architecture::llama);
  t.seed = 2;
  write_tiny_model(other_model.model, t);
  struct refusal {
    const job* on;
    std::vector<std::string> flags;
  };
  for (const refusal& x : {refusal{&j, {}}, refusal{&j, {"--lora-rank", "8", "--lora-alpha", "8"}},
                           refusal{&other_model, adapter}}) {
    const process_result r = run_layout(*x.on, 2, 2, with(x.flags, {"--checkpoint-dir", ck.string(), "--resume"}));
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("is of another job") != std::string::npos);
  }
}

TEST_CASE("QLoRA across ranks: an adapter beside nf4 and int8 frozen blocks trains across pipeline x data-parallel "
          "ranks with single-process QLoRA's losses") {
  temp_dir_guard tmp("mp-train-qlora");
  job j = lora_job(tmp, architecture::llama);
  j.steps = 8;
  const model_config cfg = load_config(j.model);
  const lora_config c = rank4({"all-linear"});
  const std::vector<std::string> adapter{"--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "all-linear",
                                         "--seed", "4"};
  lora_adapter on_f32 = lora_adapter::init(cfg, c, kSeed, cpu_backend());
  const std::vector<float> f32_losses = lora_reference_losses(j, on_f32);

  struct layout {
    int pp, dp;
    weight_format f;
    std::string flag;
  };
  for (const layout& l : {layout{2, 2, weight_format::nf4, "nf4"}, layout{4, 1, weight_format::int8, "int8"}}) {
    INFO("layout " << l.pp << "x" << l.dp << " beside " << l.flag << " weights");
    lora_adapter want = lora_adapter::init(cfg, c, kSeed, cpu_backend());
    const std::vector<float> losses = lora_reference_losses(j, want, l.f);
    // The frozen format is what both trained beside: not the f32 base's run.
    CHECK(std::abs(losses.front() - f32_losses.front()) > 1e-5 * std::abs(f32_losses.front()));
    const fs::path saved = tmp / (std::string("adapter-") + l.flag);
    const process_result r =
        run_layout(j, l.pp, l.dp, with(adapter, {"--weights", l.flag, "--save", saved.string()}));
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), losses, 1e-5);
    // The adapters agree less closely than beside f32 (1e-4): a few of
    // block 0's values drift to ~1e-4 of the largest over the 8 steps, as
    // much with one rank (1x1) as with four, while the losses agree to
    // 1e-5. One rank beside f32 differs by 1e-5 and beside bf16 by 1e-6,
    // so rounding (the rank's AdamW over flat buckets, not the library's)
    // grows more beside the coarser weights. The adapter trained beside f32
    // weights is more than 1e-2 away: the tolerance tells the formats apart.
    const lora_adapter got = lora_adapter::load(saved, cfg, cpu_backend());
    CHECK(relative_difference(got, want) < 1e-3);
    CHECK(relative_difference(got, on_f32) > 1e-2);
    CHECK(summary_of(r)["adapter"]["base_weights"] == l.flag);
  }

  // A QLoRA job's checkpoint resumes on another layout beside the same
  // format, with the uninterrupted losses.
  lora_adapter want = lora_adapter::init(cfg, c, kSeed, cpu_backend());
  const std::vector<float> losses = lora_reference_losses(j, want, weight_format::nf4);
  const fs::path ck = tmp / "ck";
  job first = j;
  first.steps = 4;
  const process_result a = run_layout(
      first, 2, 1, with(adapter, {"--weights", "nf4", "--checkpoint-dir", ck.string(), "--checkpoint-every", "2"}));
  INFO("stderr: " << a.err);
  REQUIRE(a.exit_code == 0);
  const process_result b =
      run_layout(j, 1, 2, with(adapter, {"--weights", "nf4", "--checkpoint-dir", ck.string(), "--resume"}));
  INFO("stderr: " << b.err);
  REQUIRE(b.exit_code == 0);
  check_close(json_steps(b.out_lines()), losses, 1e-5, 5);
}

TEST_CASE("LoRA ranks on the GPU give the single-process losses in f32, and track them with --compute bf16") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  temp_dir_guard tmp("mp-train-lora-cuda");
  const job j = lora_job(tmp, architecture::llama);
  lora_adapter want = lora_adapter::init(load_config(j.model), rank4(), kSeed, cpu_backend());
  const std::vector<float> losses = lora_reference_losses(j, want);
  const std::vector<std::string> adapter{"--lora-rank", "4", "--lora-alpha", "8", "--seed", "4", "--device", "cuda"};
  for (auto [pp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}}) {
    INFO("layout " << pp << "x" << dp);
    const process_result f32 = run_layout(j, pp, dp, adapter);
    INFO("stderr: " << f32.err);
    REQUIRE(f32.exit_code == 0);
    check_close(json_steps(f32.out_lines()), losses, 1e-4);
  }
  // 16-bit compute: the factors' bf16 copies follow each update.
  std::vector<std::string> bf16 = adapter;
  bf16.insert(bf16.end(), {"--compute", "bf16"});
  const process_result r = run_layout(j, 2, 2, bf16);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), losses, 2e-2);
}
