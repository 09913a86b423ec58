// Code written for device backends, run on every machine: models, the
// trainer and pipeline x data-parallel training ranks on the emulated
// device (emulated_device.hpp: host memory that ops treat as a CUDA
// device's, with the CUDA backend's placement and threading rules). The
// arithmetic is the CPU backend's, so results must equal the CPU run
// exactly; a difference means a path that moves, skips or mis-orders data.
// The real GPU's arithmetic is checked by tests/model/test_cuda_model.cpp
// and tests/kernels/ wherever a GPU is present.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_job.hpp"
#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/params.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"
#include "tests/emulated_device/dist_jobs.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;
using namespace corolla::testing;

namespace {

testing::tiny_model_options options_for(architecture arch) { return testing::tiny_options_for(arch, 96); }

/// Llama, GPT-2, and the Llama-family members with their own tensors:
/// Qwen2 (q/k/v biases, yarn RoPE), Qwen3 (per-head q/k norms, its own
/// head_dim, attention_bias, llama3 RoPE), and the mixtures of experts
/// Mixtral (4 experts, top 2, renormalised), Qwen3-MoE (5 experts, top
/// 3, not renormalised: norm_topk_prob false) and Qwen2-MoE (Qwen2's
/// attention, 4 experts, top 2, and a gated shared expert).
std::vector<testing::tiny_model_options> every_family() {
  std::vector<testing::tiny_model_options> out = {options_for(architecture::llama), options_for(architecture::gpt2)};
  testing::tiny_model_options q2 = options_for(architecture::llama), q3 = q2, mixtral = q2, q3moe = q2, q2moe = q2;
  q2.family = "Qwen2ForCausalLM";
  q2.rope_scaling = R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})";
  q3.family = "Qwen3ForCausalLM";
  q3.head_dim = 16;
  q3.attention_bias = true;
  q3.rope_scaling = R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})";
  mixtral.family = "MixtralForCausalLM";
  q3moe.family = "Qwen3MoeForCausalLM";
  q3moe.head_dim = 16;
  q3moe.experts = 5;
  q3moe.experts_per_token = 3;
  q3moe.norm_topk_prob = false;
  out.push_back(q2);
  out.push_back(q3);
  out.push_back(mixtral);
  q2moe.family = "Qwen2MoeForCausalLM";
  q2moe.norm_topk_prob = false;
  out.push_back(q3moe);
  out.push_back(q2moe);
  return out;
}

}  // namespace

TEST_CASE("emulated device: ops refuse host operands and other devices' markers, as a device backend does") {
  emulated_device_backend dev0(0), dev1(1);
  Tensor a = dev0.empty({4});
  Tensor b = dev0.empty({4});
  a.zero();
  b.zero();
  Tensor host = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(dev0.add(a, host, b), doctest::Contains("add b: tensor is on cpu, expected cuda:0"), tensor_error);
  Tensor other = dev1.empty({4});
  CHECK_THROWS_WITH_AS(dev0.add(a, other, b), doctest::Contains("expected cuda:0"), tensor_error);
  dev0.add(a, a, b);  // both on the device: fine

  // Copies cross between the host and the device, and convert.
  Tensor src = Tensor::from_f32(std::vector<float>{1, 2, 3, 4}, {4});
  dev0.copy(src, a);
  Tensor half = dev0.empty({4}, dtype::bf16);
  dev0.copy(a, half);
  Tensor back = Tensor::zeros({4});
  dev0.copy(half, back);
  CHECK(back.to_vector() == std::vector<float>{1, 2, 3, 4});

  auto m1 = dev1.mark();
  CHECK_THROWS_WITH_AS(dev0.copy_after(m1.get(), a, back), doctest::Contains("not one of emulated cuda:0's"),
                       tensor_error);
  CHECK_THROWS_WITH_AS(dev0.wait(m1.get()), doctest::Contains("not one of emulated cuda:0's"), tensor_error);
  CHECK_THROWS_WITH_AS(dev0.copy_after(nullptr, half, back), doctest::Contains("copy() converts"), tensor_error);
  auto companion = dev0.companion();
  REQUIRE(companion);
  CHECK(companion->dev() == dev0.dev());
  CHECK(cpu_backend().companion() == nullptr);  // the cpu backend takes concurrent callers itself
}

TEST_CASE("emulated device: a model of every family on a device generates the cpu's tokens and trains to the cpu's losses") {
  for (const testing::tiny_model_options& o : every_family()) {
    CAPTURE(static_cast<int>(o.arch));
    CAPTURE(o.family);
    testing::temp_dir_guard dir("emulated-model");
    testing::write_tiny_model(dir.path(), o);
    emulated_device_backend dev;
    transformer on_cpu = transformer::load(dir.path(), cpu_backend());
    transformer on_dev = transformer::load(dir.path(), dev);
    CHECK(on_dev.blocks()[0].flat().dev() == dev.dev());
    const int vocab = on_cpu.config().vocab_size;

    generation_params p;
    p.max_new_tokens = 24;
    p.ignore_eos = true;
    const auto prompt = some_ids(12, vocab, 5);
    generator g_cpu(on_cpu), g_dev(on_dev);
    const auto want = g_cpu.generate(prompt, p).tokens;
    CHECK(g_dev.generate(prompt, p).tokens == want);
    p.prefill_chunk = 5;  // chunked prefill through the paged cache
    CHECK(g_dev.generate(prompt, p).tokens == want);

    train_options opts;
    opts.batch = 2;
    opts.seq = 16;
    opts.steps = 4;
    opts.optimizer.adamw.lr = 3e-3f;
    opts.optimizer.max_grad_norm = 1.0f;
    const auto tokens = some_ids(300, vocab, 17);
    token_dataset d_cpu = token_dataset::from_tokens(tokens, vocab);
    token_dataset d_dev = token_dataset::from_tokens(tokens, vocab);
    const auto cpu_losses = trainer(on_cpu, d_cpu, opts).run().losses;
    const auto dev_losses = trainer(on_dev, d_dev, opts).run().losses;
    CHECK(dev_losses == cpu_losses);
  }
}

TEST_CASE("emulated device: the head's loss in chunks of rows equals the cpu's, on device slices") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::temp_dir_guard dir("emulated-loss-chunks");
    testing::write_tiny_model(dir.path(), options_for(arch));
    emulated_device_backend dev;
    transformer on_cpu = transformer::load(dir.path(), cpu_backend());
    transformer on_dev = transformer::load(dir.path(), dev);
    const model_config& cfg = on_cpu.config();
    const std::int64_t N = 21, D = cfg.hidden_size;
    const auto xs = some_ids(static_cast<int>(N * D), 1000, 3);
    std::vector<float> xf(xs.begin(), xs.end());
    for (float& v : xf) v = v / 500.0f - 1.0f;
    const Tensor x = Tensor::from_f32(xf, {N, D});
    const Tensor targets = Tensor::from_i32(some_ids(static_cast<int>(N), cfg.vocab_size, 4), {N});
    head h_cpu(cfg, on_cpu.head(), cpu_backend()), h_dev(cfg, on_dev.head(), dev);
    h_cpu.set_loss_chunk_rows(8);  // 8, 8 and 5 rows
    h_dev.set_loss_chunk_rows(8);
    Tensor dx_cpu = Tensor::empty({N, D}), x_dev = dev.empty({N, D}), dx_dev = dev.empty({N, D});
    dev.copy(x, x_dev);
    head_activations a_cpu, a_dev;
    CHECK(h_dev.loss(x_dev, targets, &dx_dev, 2.0f, a_dev) == h_cpu.loss(x, targets, &dx_cpu, 2.0f, a_cpu));
    Tensor back = Tensor::empty({N, D});
    dev.copy(dx_dev, back);
    CHECK(back.to_vector() == dx_cpu.to_vector());
    Tensor g = Tensor::empty({h_dev.grads().size()});
    dev.copy(h_dev.grads().flat(), g);
    CHECK(g.to_vector() == h_cpu.grads().flat().to_vector());
  }
}

TEST_CASE("emulated device: pipeline x data-parallel ranks on devices train exactly as ranks on the cpu") {
  testing::tiny_model_options tiny = options_for(architecture::gpt2);  // tied: the head ring spans both stages
  tiny.layers = 4;
  testing::temp_dir_guard dir("emulated-dist");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 23);

  struct variant {
    int pp, dp;
    float clip;
  };
  for (const variant v : {variant{2, 2, 0.0f}, variant{2, 2, 0.5f}, variant{2, 1, 0.0f}, variant{1, 2, 0.5f}}) {
    CAPTURE(v.pp);
    CAPTURE(v.dp);
    CAPTURE(v.clip);
    dist_train_options o = job(cfg, v.pp, v.dp, 3);
    o.optimizer.max_grad_norm = v.clip;
    o.save_dir = dir / "cpu";
    std::filesystem::remove_all(o.save_dir);
    const job_result cpu = run_job(o, cfg, tokens, false);
    o.save_dir = dir / "dev";
    std::filesystem::remove_all(o.save_dir);
    const job_result dev = run_job(o, cfg, tokens, true);
    check_same_steps(cpu, dev);
    CHECK(read_whole_file(dir / "dev" / "model.safetensors") == read_whole_file(dir / "cpu" / "model.safetensors"));

    for (int r = 0; r < o.layout.world(); ++r) {
      const auto& s = dev.devices[static_cast<std::size_t>(r)]->stats();
      CAPTURE(r);
      CHECK(s.companions == 1);  // the DP group's optimiser thread has its own instance
      // Buckets shared by replicas (all with dp 2; the tied head across the
      // stages) go through page-locked host copies; a group of one waits
      // for its backward on the device instead and never leaves it.
      CHECK(s.host_empties > 0);
      CHECK(s.copy_afters > 0);
      if (v.dp == 1 && v.clip == 0.0f) CHECK(s.waits > 0);
    }
  }
}

TEST_CASE("emulated device: QLoRA ranks (nf4 blocks made on each rank's device from the parameters it is handed) "
          "train as QLoRA ranks on the cpu, and otherwise than beside f32 blocks") {
  testing::tiny_model_options tiny = options_for(architecture::llama);
  tiny.layers = 4;
  const model_config cfg = testing::tiny_config(tiny);
  const auto tokens = some_ids(2000, cfg.vocab_size, 29);
  dist_train_options o = job(cfg, 2, 2, 3);
  dist_lora l;
  l.config.rank = 4;
  l.config.alpha = 8.0f;
  l.seed = 5;
  l.base_weights = weight_format::nf4;  // no base_digest: the ranks' models are in memory (weights_of)
  o.lora = l;
  const job_result cpu = run_job(o, cfg, tokens, false);
  const job_result dev = run_job(o, cfg, tokens, true);
  check_same_steps(cpu, dev);
  dist_train_options beside_f32 = o;
  beside_f32.lora->base_weights = weight_format::f32;
  const job_result plain = run_job(beside_f32, cfg, tokens, false);
  REQUIRE(plain.steps.size() == cpu.steps.size());
  CHECK(plain.steps[0].loss != cpu.steps[0].loss);
  // 16-bit compute beside them is refused before the rank joins anything.
  o.compute = dtype::bf16;
  auto n = start_local_node();
  transformer model = transformer::init(cfg, 7, cpu_backend());
  token_dataset data = token_dataset::from_tokens(tokens, cfg.vocab_size);
  emulated_device_backend device(0);
  CHECK_THROWS_WITH(run_train_rank(*n, o, 0, "tcp://127.0.0.1:1", weights_of(model), data, &device),
                    doctest::Contains("beside nf4 frozen weights computes in f32, not bf16"));
  n->stop();
}

TEST_CASE("emulated device: --save asked for in pieces (several to every block and to the head, one at a time) "
          "writes the bytes whole groups write, from device ranks and cpu ranks") {
  testing::tiny_model_options tiny = options_for(architecture::gpt2);  // tied: rank 0 sends the head
  testing::temp_dir_guard dir("emulated-save-pieces");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 31);
  const std::int64_t block_values = param_set::size_of(block_layout(cfg));
  const std::int64_t head_values = param_set::size_of(head_layout(cfg));

  dist_train_options o = job(cfg, 2, 2, 2);
  o.save_dir = dir / "whole";
  run_job(o, cfg, tokens, false);
  // 4100 bytes: 1025 values, which no tensor's 16-value alignment divides.
  o.message_piece_bytes = 4100;
  REQUIRE(block_values > 3 * 1025);
  REQUIRE(head_values > 3 * 1025);
  REQUIRE(block_values % 1025 != 0);
  o.save_dir = dir / "pieces-dev";
  run_job(o, cfg, tokens, true);
  o.save_dir = dir / "pieces-cpu";
  run_job(o, cfg, tokens, false);
  const auto whole = read_whole_file(dir / "whole" / "model.safetensors");
  CHECK(read_whole_file(dir / "pieces-dev" / "model.safetensors") == whole);
  CHECK(read_whole_file(dir / "pieces-cpu" / "model.safetensors") == whole);

  // The coordinator refuses a piece no message takes, or a silly one, before anything starts.
  auto n = start_local_node();
  for (const std::int64_t bytes : {std::int64_t{4095}, (std::int64_t{512} << 20) + 1}) {
    o.message_piece_bytes = bytes;
    CHECK_THROWS_WITH_AS(run_train_coordinator(*n, o, cfg, [](const dist_step_report&) {}),
                         doctest::Contains("from 4 KiB to 512 MiB"), std::invalid_argument);
  }
  n->stop();
}

TEST_CASE("emulated device: pipeline x data-parallel ranks of a mixture-of-experts model train exactly as ranks on the cpu") {
  testing::tiny_model_options tiny = options_for(architecture::llama);
  tiny.family = "MixtralForCausalLM";
  tiny.layers = 4;
  testing::temp_dir_guard dir("emulated-moe-dist");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  REQUIRE(cfg.is_moe());
  const auto tokens = some_ids(2000, cfg.vocab_size, 37);
  dist_train_options o = job(cfg, 2, 2, 3);
  o.optimizer.max_grad_norm = 0.5f;
  o.save_dir = dir / "cpu";
  const job_result cpu = run_job(o, cfg, tokens, false);
  o.save_dir = dir / "dev";
  const job_result dev = run_job(o, cfg, tokens, true);
  REQUIRE(cpu.steps.size() == 3u);
  check_same_steps(cpu, dev);
  CHECK(read_whole_file(dir / "dev" / "model.safetensors") == read_whole_file(dir / "cpu" / "model.safetensors"));
  // The router and the experts were trained and saved under Mixtral's names:
  // each moved away from the ranks' initial model (seed 7).
  transformer::init(cfg, 7, cpu_backend()).save(dir / "init");
  const auto before = read_all_f32(dir / "init"), after = read_all_f32(dir / "dev");
  for (const char* name : {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.3.block_sparse_moe.gate.weight",
                           "model.layers.1.block_sparse_moe.experts.0.w1.weight",
                           "model.layers.2.block_sparse_moe.experts.3.w2.weight"}) {
    CAPTURE(name);
    REQUIRE(after.count(name) == 1);
    REQUIRE(before.count(name) == 1);
    CHECK(after.at(name) != before.at(name));
  }

  // Ranks computing in bf16 (router, experts and shared gate on 16-bit
  // copies) train like the f32 ranks within bf16's tolerance (the dense
  // models' in test_emulated_mixed.cpp: 5 % over a short run).
  o.compute = dtype::bf16;
  o.save_dir.clear();
  const job_result mixed = run_job(o, cfg, tokens, true);
  REQUIRE(mixed.steps.size() == cpu.steps.size());
  for (std::size_t i = 0; i < cpu.steps.size(); ++i) {
    CAPTURE(i);
    CHECK(mixed.steps[i].loss != cpu.steps[i].loss);  // computed in 16 bits
    CHECK(std::abs(mixed.steps[i].loss - cpu.steps[i].loss) <= 5e-2 * std::abs(cpu.steps[i].loss));
  }
}

TEST_CASE("emulated device: pipeline x data-parallel ranks computing in bf16 train like f32 ranks on the cpu") {
  testing::tiny_model_options tiny = options_for(architecture::llama);
  tiny.layers = 4;
  testing::temp_dir_guard dir("emulated-mixed-dist");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 31);
  dist_train_options o = job(cfg, 2, 2, 4);
  o.optimizer.max_grad_norm = 1.0f;
  const job_result cpu = run_job(o, cfg, tokens, false);
  o.compute = dtype::bf16;
  const job_result dev = run_job(o, cfg, tokens, true);
  REQUIRE(dev.steps.size() == cpu.steps.size());
  for (std::size_t s = 0; s < cpu.steps.size(); ++s) {
    INFO("step " << cpu.steps[s].step << ": f32 loss " << cpu.steps[s].loss << ", bf16 loss " << dev.steps[s].loss);
    // The tolerance of test_emulated_mixed.cpp's single-process runs.
    CHECK(std::abs(dev.steps[s].loss - cpu.steps[s].loss) <= 5e-2 * cpu.steps[s].loss);
    CHECK(dev.steps[s].loss != cpu.steps[s].loss);  // the ranks did compute in bf16
    CHECK(std::abs(dev.steps[s].grad_norm - cpu.steps[s].grad_norm) <= 0.1 * cpu.steps[s].grad_norm);
  }
}

TEST_CASE("emulated device: device ranks resumed from a checkpoint end where an uninterrupted run does") {
  testing::tiny_model_options tiny = options_for(architecture::llama);
  testing::temp_dir_guard dir("emulated-resume");
  testing::write_tiny_model(dir / "model", tiny);
  const model_config cfg = load_config(dir / "model");
  const auto tokens = some_ids(2000, cfg.vocab_size, 29);

  check_resume_matches(job(cfg, 2, 2, 4), cfg, tokens, dir.path());
}
