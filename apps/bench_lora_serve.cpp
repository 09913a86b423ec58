// corolla bench lora-serve — what serving LoRA adapters per session costs a
// swarm server (docs/swarm_serving.md, "Adapters"): its engine over every
// block of the model decodes S sessions of the base model (the baseline,
// measured in the same run), S sessions of one adapter, and S sessions each
// with an adapter of its own (the sessions of one decode batch then take
// different factors), with one session and with S. The adapters' terms are
// added beside the unmerged weights, so the ratios are the price of
// sharing one copy of the weights among adapters. Then a fine-tuning
// client's request (span.forward and span.backward of one sequence of
// --prompt-tokens rows, as prompt tuning on top of an adapter sends them)
// with the adapter and without: the terms beside the frozen weights
// against the base's products alone. Prints a table and one JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_common.hpp"
#include "apps/bench_engine.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

namespace {

struct lora_serve_options {
  bench_common common;
  int sessions = 4;
  int prompt_tokens = 32, new_tokens = 16;
  int rank = 8;
  int rounds = 2;
  std::vector<std::string> targets;
  std::string weights = "f32";
};

/// Seconds of one fine-tuning request through every block: the stateless
/// forward and backward of `h` (one sequence) with `adapter` ("" = none).
double finetune_request_s(span_engine& e, const Tensor& h, const Tensor& g, const std::string& adapter) {
  const auto start = std::chrono::steady_clock::now();
  const int seq = static_cast<int>(h.dim(0));
  auto f = e.forward(h, 1, seq, {}, -1, -1, nullptr, adapter);
  if (!f) throw std::runtime_error("bench lora-serve: forward: " + f.error().message);
  auto b = e.backward(h, g, 1, seq, {}, -1, -1, adapter);
  if (!b) throw std::runtime_error("bench lora-serve: backward: " + b.error().message);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Decode tokens/s of each way, at one level of sessions.
struct level {
  int sessions = 0;
  double base = 0, one_adapter = 0, own_adapters = 0;
};

int run_lora_serve(const lora_serve_options& o) {
  apply_common_options(o.common.threads, "warn");
  Backend& be = backend_for(parse_device(o.common.device));
  const weight_format weights = parse_weights_flag(o.weights);
  std::optional<transformer> model(open_model(o.common, be));
  const model_config cfg = model->config();
  if (o.prompt_tokens + o.new_tokens + 2 > cfg.max_positions)
    throw std::invalid_argument("bench lora-serve: --prompt-tokens + --new-tokens + 2 exceed the model's context of " +
                                std::to_string(cfg.max_positions));
  lora_config lc;
  lc.rank = o.rank;
  lc.alpha = static_cast<float>(o.rank);
  lc.targets = o.targets;
  // One adapter per session (fresh: B = 0, the same products as any other).
  std::vector<lora_adapter> adapters;
  for (int s = 0; s < o.sessions; ++s) adapters.push_back(lora_adapter::init(cfg, lc, o.common.seed + 10 + s, cpu_backend()));
  const std::int64_t per_adapter_values = adapters.front().numel();
  if (!o.common.json)
    std::fprintf(stderr, "bench lora-serve: %s, %.1fM parameters, all %d blocks on %s, %s weights, %d session(s), "
                 "r=%d (%s); measuring...\n", cfg.hf_architecture.c_str(),
                 static_cast<double>(cfg.parameter_count()) / 1e6, cfg.n_layers, be.name().c_str(),
                 weight_format_name(weights), o.sessions, o.rank, adapters.front().config().targets_text().c_str());

  stage blocks = served_blocks(model, weights, be);
  span_engine_options eo;
  eo.weights = weights;
  // Each session holds whole pages of its tokens.
  const std::int64_t pt = eo.page_tokens, per_session = (o.prompt_tokens + o.new_tokens + 2 + pt - 1) / pt * pt;
  span_engine engine(std::move(blocks), per_session * o.sessions, eo);
  for (int s = 0; s < o.sessions; ++s)
    if (auto ok = engine.add_adapter("a" + std::to_string(s), adapters[static_cast<std::size_t>(s)]); !ok)
      throw std::runtime_error("bench lora-serve: " + ok.error().message);

  const std::int64_t D = cfg.hidden_size;
  const Tensor prompt = random_rows(o.prompt_tokens, D, o.common.seed + 11);
  const Tensor row = random_rows(1, D, o.common.seed + 12);
  std::vector<level> levels;
  for (const int s : {1, o.sessions}) {
    if (!levels.empty() && levels.back().sessions == s) continue;
    level l;
    l.sessions = s;
    const std::vector<std::string> one(static_cast<std::size_t>(s), "a0");
    std::vector<std::string> own;
    for (int i = 0; i < s; ++i) own.push_back("a" + std::to_string(i));
    // Interleaved rounds, the best of each: the machine's noise hits all three.
    for (int r = 0; r < o.rounds; ++r) {
      const std::string tag = std::to_string(s) + "-" + std::to_string(r);
      l.base = std::max(l.base, engine_decode_tokens_per_s(engine, s, prompt, row, o.new_tokens, "base-" + tag));
      l.one_adapter =
          std::max(l.one_adapter, engine_decode_tokens_per_s(engine, s, prompt, row, o.new_tokens, "one-" + tag, one));
      l.own_adapters =
          std::max(l.own_adapters, engine_decode_tokens_per_s(engine, s, prompt, row, o.new_tokens, "own-" + tag, own));
    }
    levels.push_back(l);
  }
  // A fine-tuning request of --prompt-tokens rows, with the adapter and
  // without (interleaved, the best of each; a first call of each warms).
  const Tensor grad = random_rows(o.prompt_tokens, D, o.common.seed + 13);
  double tune_base = finetune_request_s(engine, prompt, grad, ""), tune_adapter =
                                                                      finetune_request_s(engine, prompt, grad, "a0");
  for (int r = 0; r < o.rounds; ++r) {
    tune_base = std::min(tune_base, finetune_request_s(engine, prompt, grad, ""));
    tune_adapter = std::min(tune_adapter, finetune_request_s(engine, prompt, grad, "a0"));
  }

  nlohmann::json jl = nlohmann::json::array();
  if (!o.common.json) {
    std::printf("LoRA adapters per session on a server: %s, %.1fM parameters, %s weights on %s, r=%d (%s)\n",
                cfg.hf_architecture.c_str(), static_cast<double>(cfg.parameter_count()) / 1e6,
                weight_format_name(weights), be.name().c_str(), o.rank, adapters.front().config().targets_text().c_str());
    std::printf("sessions   base tok/s   one adapter (ratio)   own adapters (ratio)\n");
  }
  for (const level& l : levels) {
    if (!o.common.json)
      std::printf("%8d %12.1f %12.1f (%.3fx) %13.1f (%.3fx)\n", l.sessions, l.base, l.one_adapter,
                  l.one_adapter / l.base, l.own_adapters, l.own_adapters / l.base);
    jl.push_back({{"sessions", l.sessions},
                  {"base_tokens_per_s", l.base},
                  {"one_adapter_tokens_per_s", l.one_adapter},
                  {"own_adapters_tokens_per_s", l.own_adapters},
                  {"one_adapter_vs_base", l.one_adapter / l.base},
                  {"own_adapters_vs_base", l.own_adapters / l.base}});
  }
  const nlohmann::json j = {{"bench", "lora-serve"},
                            {"device", be.name()},
                            {"threads", cpu_threads()},
                            {"model", cfg.hf_architecture},
                            {"parameters", cfg.parameter_count()},
                            {"weights", weight_format_name(weights)},
                            {"rank", o.rank},
                            {"targets", adapters.front().config().targets},
                            {"adapter_values", per_adapter_values},
                            {"new_tokens", o.new_tokens},
                            {"levels", jl},
                            {"finetune_rows", o.prompt_tokens},
                            {"finetune_base_ms", tune_base * 1e3},
                            {"finetune_adapter_ms", tune_adapter * 1e3},
                            {"finetune_adapter_vs_base", tune_base / tune_adapter}};
  if (!o.common.json)
    std::printf("fine-tuning request (forward + backward, %d rows): base %.1f ms, adapter %.1f ms (%.3fx)\n",
                o.prompt_tokens, tune_base * 1e3, tune_adapter * 1e3, tune_base / tune_adapter);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_lora_serve(CLI::App* bench, action_fn& action) {
  static lora_serve_options o;
  auto* cmd = bench->add_subcommand(
      "lora-serve", "A server's decode with LoRA adapters per session (one shared, or one each) vs the base model's");
  add_common(cmd, o.common, false);
  cmd->add_option("--sessions", o.sessions, "Concurrent sessions (also measured: one)")
      ->check(integer_between(1, 256))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "Tokens each session's prefill holds")
      ->check(integer_between(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--new-tokens", o.new_tokens, "Timed decode steps per session (after two warm-up steps)")
      ->check(integer_between(2, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Interleaved rounds of the three ways; the best of each counts")
      ->check(integer_between(1, 100))
      ->capture_default_str();
  cmd->add_option("--rank", o.rank, "The adapters' rank r")->check(integer_between(1, 65536))->capture_default_str();
  cmd->add_option("--targets", o.targets,
                  "Modules to adapt, comma-separated (default: q_proj,v_proj; GPT-2: c_attn; or all-linear)")
      ->delimiter(',');
  cmd->add_option("--weights", o.weights, "The served linear weights: f32, bf16, int8 or nf4")->capture_default_str();
  cmd->callback([&action] { action = [] { return run_lora_serve(o); }; });
}

}  // namespace corolla::app
