// corolla bench lora — a training step of a LoRA adapter (model/lora.hpp)
// against a step of the whole model (the baseline, measured in the same run
// on the same model and batches): the time of each, what each trains, and
// the bytes of training state each holds beside the model's weights
// (gradients, AdamW moments, the adapter's own); with --weights, also the
// adapter's step beside the weights in that format (QLoRA) against its
// step beside the f32 weights, and the bytes of each model's weights.
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_common.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/lora.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

namespace {

struct lora_bench_options {
  bench_common common;
  int batch = 4, seq = 64, steps = 3;
  int rank = 8;
  std::vector<std::string> targets;
  std::string weights = "f32";  ///< --weights: also train beside the weights in this format
};

/// Seconds of `steps` steps of `t` after one warm-up step.
double timed(trainer& t, int steps) {
  t.step();
  double total = 0;
  for (int i = 0; i < steps; ++i) total += t.step().seconds;
  return total / steps;
}

double gb(double bytes) { return bytes / 1e9; }

int run_lora(const lora_bench_options& o) {
  apply_common_options(o.common.threads, "warn");
  const weight_format quantised = parse_weights_flag(o.weights);  // before a large model is drawn
  Backend& be = backend_for(parse_device(o.common.device));
  transformer model = open_model(o.common, be);
  const model_config& c = model.config();
  if (o.seq > c.max_positions)
    throw std::invalid_argument("bench lora: --seq " + std::to_string(o.seq) + " exceeds the model's context of " +
                                std::to_string(c.max_positions) + " tokens");
  lora_config lc;
  lc.rank = o.rank;
  lc.alpha = static_cast<float>(o.rank);
  lc.targets = o.targets;
  lora_adapter adapter = lora_adapter::init(c, lc, o.common.seed + 3, be);
  if (!o.common.json)
    std::fprintf(stderr, "bench lora: %s, %.1fM parameters, B=%d, T=%d, r=%d (%s), %d threads; measuring...\n",
                 c.hf_architecture.c_str(), static_cast<double>(c.parameter_count()) / 1e6, o.batch, o.seq, o.rank,
                 nlohmann::json(adapter.config().targets).dump().c_str(), cpu_threads());

  std::mt19937_64 rng(o.common.seed + 2);
  std::uniform_int_distribution<int> pick(0, c.vocab_size - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(o.batch) * o.seq * (o.steps + 2) + 1);
  for (auto& t : tokens) t = pick(rng);
  token_dataset data = token_dataset::from_tokens(tokens, c.vocab_size, "bench tokens");
  token_dataset lora_data = token_dataset::from_tokens(tokens, c.vocab_size, "bench tokens");
  train_options opts;
  opts.batch = o.batch;
  opts.seq = o.seq;
  opts.steps = o.steps + 1;
  opts.optimizer.adamw.lr = 1e-4f;

  // The adapters first: the whole model's run changes the weights they start from.
  double quantised_s = 0, weight_bytes = 4.0 * static_cast<double>(model.head().size()), quantised_bytes = 0;
  for (const param_set& b : model.blocks()) weight_bytes += 4.0 * static_cast<double>(b.size());
  if (quantised != weight_format::f32) {
    transformer q = transformer::inference_of(model, quantised);
    quantised_bytes = 4.0 * static_cast<double>(q.head().size()) +
                      static_cast<double>(served_block_bytes(c, quantised, false)) * c.n_layers;
    lora_adapter same = lora_adapter::init(c, lc, o.common.seed + 3, be);
    token_dataset q_data = token_dataset::from_tokens(tokens, c.vocab_size, "bench tokens");
    train_options qo = opts;
    qo.adapter = &same;
    trainer t(q, q_data, qo);
    quantised_s = timed(t, o.steps);
  }
  std::int64_t adapter_moments = 0, lora_grads = 0;
  double lora_s = 0;
  {
    train_options lo = opts;
    lo.adapter = &adapter;
    trainer t(model, lora_data, lo);
    adapter_moments = 2 * t.optimizer().size();
    lora_s = timed(t, o.steps);
    lora_grads = model.gradient_values();  // the model's own, made by the adapter's run (none)
  }
  double full_s = 0;
  std::int64_t full_moments = 0;
  {
    trainer t(model, data, opts);
    full_moments = 2 * t.optimizer().size();
    full_s = timed(t, o.steps);
  }
  const double tokens_per_step = static_cast<double>(o.batch) * o.seq;
  const std::int64_t full_grads = model.gradient_values();
  // Beside the weights: the gradient buffers each run made (the whole
  // model's; none of the model's for the adapter, which forms no weight
  // gradient), the moments, and for the adapter its own values and
  // gradients (its terms run beside the frozen weights: no W0 copy, no
  // merged one).
  const double full_state = 4.0 * static_cast<double>(full_grads + full_moments);
  const double lora_state = 4.0 * static_cast<double>(lora_grads + adapter_moments + 2 * adapter.numel());
  if (!o.common.json) {
    std::printf("LoRA r=%d on %s, %.1fM parameters, B x T = %d x %d on %s\n", o.rank, c.hf_architecture.c_str(),
                static_cast<double>(c.parameter_count()) / 1e6, o.batch, o.seq, be.name().c_str());
    std::printf("whole model   %9.1f ms/step  %9.0f tokens/s  trains %12lld values  state %7.3f GB\n", full_s * 1e3,
                tokens_per_step / full_s, static_cast<long long>(full_moments / 2), gb(full_state));
    std::printf("adapter       %9.1f ms/step  %9.0f tokens/s  trains %12lld values  state %7.3f GB"
                "  (time %.3fx, state %.3fx)\n",
                lora_s * 1e3, tokens_per_step / lora_s, static_cast<long long>(adapter.numel()), gb(lora_state),
                lora_s / full_s, lora_state / full_state);
    if (quantised != weight_format::f32)
      std::printf("adapter beside %s weights %7.1f ms/step  %9.0f tokens/s  weights %7.3f GB vs %7.3f GB f32"
                  "  (time %.3fx the adapter's beside f32)\n",
                  o.weights.c_str(), quantised_s * 1e3, tokens_per_step / quantised_s, gb(quantised_bytes),
                  gb(weight_bytes), quantised_s / lora_s);
  }
  nlohmann::json j = {{"bench", "lora"},
                            {"device", be.name()},
                            {"threads", cpu_threads()},
                            {"model", c.hf_architecture},
                            {"parameters", c.parameter_count()},
                            {"batch", o.batch},
                            {"seq", o.seq},
                            {"rank", o.rank},
                            {"targets", adapter.config().targets},
                            {"adapter_values", adapter.numel()},
                            {"full_ms", full_s * 1e3},
                            {"lora_ms", lora_s * 1e3},
                            {"time_vs_full", lora_s / full_s},
                            {"full_state_bytes", full_state},
                            {"lora_model_grad_bytes", 4.0 * static_cast<double>(lora_grads)},
                            {"lora_state_bytes", lora_state},
                            {"state_vs_full", lora_state / full_state},
                            {"weight_bytes", weight_bytes}};
  if (quantised != weight_format::f32) {
    j["base_weights"] = o.weights;  // as the flag names it (int8, not the wire's i8)
    j["quantised_ms"] = quantised_s * 1e3;
    j["quantised_vs_lora"] = quantised_s / lora_s;
    j["quantised_weight_bytes"] = quantised_bytes;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_lora(CLI::App* bench, action_fn& action) {
  static lora_bench_options o;
  auto* cmd = bench->add_subcommand(
      "lora", "A LoRA adapter's training step vs the whole model's (time, and training state beside the weights)");
  add_common(cmd, o.common, false);
  cmd->add_option("--batch", o.batch, "Sequences per step")->check(integer_between(1, 1 << 20))->capture_default_str();
  cmd->add_option("--seq", o.seq, "Tokens per sequence")->check(integer_between(2, 1 << 24))->capture_default_str();
  cmd->add_option("--steps", o.steps, "Timed steps of each (after one warm-up step)")
      ->check(integer_between(1, 1000000))
      ->capture_default_str();
  cmd->add_option("--rank", o.rank, "The adapter's rank r")->check(integer_between(1, 65536))->capture_default_str();
  cmd->add_option("--targets", o.targets,
                  "Modules to adapt, comma-separated (default: q_proj,v_proj; GPT-2: c_attn; or all-linear)")
      ->delimiter(',');
  cmd->add_option("--weights", o.weights,
                  "Also train the adapter beside the model's linear weights as bf16, int8 or nf4 (QLoRA) and time "
                  "it against the adapter beside f32")
      ->capture_default_str();
  cmd->callback([&action] { action = [] { return run_lora(o); }; });
}

}  // namespace corolla::app
