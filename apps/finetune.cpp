// corolla finetune — prompt tuning (deep or shallow) and/or a LoRA adapter
// of a frozen model whose blocks run on a swarm (span.forward /
// span.backward through max-throughput routes), or locally with --local
// (the reference the swarm run must equal). The client loads only the
// head; the prompts, the adapter and their AdamW state live here, and each
// request carries its blocks' part of the adapter (model/prompt_tuning.hpp,
// actors/swarm_finetune.hpp).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/swarm_finetune.hpp"
#include "apps/commands.hpp"
#include "apps/finetune_state.hpp"
#include "apps/flag_checks.hpp"
#include "apps/lora_flags.hpp"
#include "apps/swarm_flags.hpp"
#include "apps/train_args.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/optimizer.hpp"
#include "model/prompt_tuning.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "model/token_data.hpp"

namespace corolla::app {
namespace {

struct finetune_options {
  std::string model;
  std::string data;
  swarm_flags swarm;
  bool local = false;
  int steps = 20;
  int batch = 4;
  int seq = 64;
  int prompt_len = 16;
  std::string tuning;  ///< deep, shallow or none; "" = deep, or none beside an adapter
  lora_flags lora;           ///< an adapter to train (none given: prompts only)
  std::string save_adapter;  ///< write the trained adapter here
  std::string checkpoint_dir;  ///< the client's state (finetune_state.safetensors) goes here
  int checkpoint_every = 0;    ///< also every K steps (0: after the last step only)
  bool resume = false;         ///< go on from checkpoint_dir's state
  float lr = 1e-2f;
  std::uint64_t seed = 0;
  std::string save;
  bool json = false;
  int threads = 0;
  std::string log_level = "warn";
  std::string device = "auto";  ///< --device: where --local's blocks run
};

/// What trains: the prompts (`tuning`, with "" resolved) and/or an adapter;
/// the flags' combinations checked before anything loads.
std::string check_tuning(const finetune_options& o) {
  const bool lora = o.lora.given();
  if (const std::string why = o.lora.problem(); !why.empty()) throw std::invalid_argument(why);
  if (o.lora.rank > max_carried_lora_rank)
    throw std::invalid_argument("--lora-rank " + std::to_string(o.lora.rank) + ": servers take adapters of rank at most " +
                                std::to_string(max_carried_lora_rank));
  if (o.checkpoint_dir.empty() && (o.resume || o.checkpoint_every != 0))
    throw std::invalid_argument(std::string(o.resume ? "--resume" : "--checkpoint-every") +
                                " needs --checkpoint-dir DIR (where the client's state is kept)");
  const std::string tuning = o.tuning.empty() ? (lora ? "none" : "deep") : o.tuning;
  if (tuning != "deep" && tuning != "shallow" && tuning != "none")
    throw std::invalid_argument("--tuning must be deep, shallow or none, got '" + o.tuning + "'");
  if (tuning == "none" && !lora)
    throw std::invalid_argument("--tuning none trains no prompts: add --lora-rank R or --adapter DIR to train an adapter");
  if (!o.save_adapter.empty() && !lora)
    throw std::invalid_argument("--save-adapter writes a trained LoRA adapter: add --lora-rank R or --adapter DIR");
  if (!o.save.empty() && tuning == "none")
    throw std::invalid_argument("--save writes trained prompts and none train (--tuning none): --save-adapter DIR "
                                "writes the adapter");
  return tuning;
}

int run_finetune(const finetune_options& o) {
  apply_common_options(o.threads, o.log_level);
  const std::string tuning = check_tuning(o);
  if (!o.save.empty()) check_output_file(o.save, "--save");
  if (!o.save_adapter.empty()) check_output_dir(o.save_adapter, "--save-adapter");
  if (!o.checkpoint_dir.empty()) check_output_dir(o.checkpoint_dir, "--checkpoint-dir");
  if (o.local == o.swarm.given())
    throw std::invalid_argument("give exactly one of --swarm/--swarm-dht (blocks on the swarm) or --local");
  if (const std::string why = adamw_problem({.lr = o.lr}); !why.empty()) throw std::invalid_argument(why);
  // auto with a swarm: the servers compute, nothing here needs a device
  const device where = o.device == "auto" && !o.local ? device{} : parse_device(o.device);
  if (where.kind != device_kind::cpu && !o.local)
    throw std::invalid_argument("--device " + o.device + " places --local's blocks; with a swarm the servers compute");
  const model_config cfg = load_config(o.model);
  token_dataset data = open_data(o.data, o.model, cfg.vocab_size);
  const checkpoint ck = checkpoint::open(o.model);
  head h = head::load(ck, cfg, cpu_backend());
  // The adapter lives here, on the host: the requests carry its factors.
  std::optional<lora_adapter> adapter;
  if (!o.lora.adapter.empty()) {
    adapter.emplace(lora_adapter::load(o.lora.adapter, cfg, cpu_backend()));
    if (adapter->config().rank > max_carried_lora_rank)
      throw model_error(o.lora.adapter + ": rank " + std::to_string(adapter->config().rank) +
                        ", and servers take adapters of rank at most " + std::to_string(max_carried_lora_rank));
  } else if (o.lora.rank != 0) {
    adapter.emplace(lora_adapter::init(cfg, o.lora.config(), o.seed, cpu_backend()));  // as corolla train draws it
  }

  // The blocks: local (all of them, loaded here) or the swarm's.
  std::unique_ptr<span_engine> blocks;
  std::optional<swarm_connection> conn;
  std::unique_ptr<swarm_client> client;
  std::unique_ptr<span_runner> runner;
  swarm_span_runner* remote = nullptr;
  if (o.local) {
    blocks = std::make_unique<span_engine>(span_engine::load(ck, cfg, 0, cfg.n_layers, backend_for(where), 16));
    runner = std::make_unique<local_span_runner>(*blocks);
  } else {
    conn = connect_swarm(o.swarm, o.model, cfg.n_layers);
    if (o.threads == 0) set_cpu_threads(1);  // the servers compute; the client only embeds and scores
    client = std::make_unique<swarm_client>(*conn->runtime, conn->options);
    auto r = std::make_unique<swarm_span_runner>(*client, o.seed);
    remote = r.get();
    runner = std::move(r);
  }

  prompt_tuning_options to;
  to.prompt_len = tuning == "none" ? 0 : o.prompt_len;
  to.deep = tuning == "deep";
  to.optimizer.lr = o.lr;
  to.seed = o.seed;
  prompt_tuner tuner(h, *runner, to, adapter ? &*adapter : nullptr);
  if (adapter && !o.json)
    std::fprintf(stderr, "training a LoRA adapter through the %s: r %d, alpha %g, %s; %lld parameters\n",
                 o.local ? "local blocks" : "swarm", adapter->config().rank,
                 static_cast<double>(adapter->config().alpha), adapter->config().targets_text().c_str(),
                 static_cast<long long>(adapter->numel()));
  // The client's state: what trains, its optimiser, where the data is.
  std::optional<finetune_checkpoint> checkpoint;
  if (!o.checkpoint_dir.empty())
    checkpoint.emplace(o.checkpoint_dir,
                       finetune_run{o.model, tuning, to.prompt_len, adapter ? &*adapter : nullptr, o.batch, o.seq, o.lr},
                       data);
  int first = 1;
  if (o.resume) {
    first = static_cast<int>(checkpoint->resume(tuner, data, o.steps)) + 1;
    if (!o.json) std::fprintf(stderr, "resuming after step %d from %s\n", first - 1, checkpoint->file().c_str());
  }
  const auto keep = [&](std::int64_t position) {
    if (!checkpoint->write(tuner, position))
      std::fprintf(stderr, "corolla: warning: the state after step %lld is not finite: %s is left as it was\n",
                   static_cast<long long>(tuner.steps()), checkpoint->file().c_str());
  };
  std::vector<std::int32_t> ids, targets;
  nlohmann::json losses = nlohmann::json::array();
  for (int s = first; s <= o.steps; ++s) {
    const std::int64_t position = data.position();
    data.next_batch(o.batch, o.seq, ids, targets);
    float loss = 0;
    try {
      loss = tuner.step(ids, targets, o.batch, o.seq);
    } catch (const std::exception&) {
      // A failed step changed nothing: the steps before it are kept, and
      // --resume takes this batch again.
      if (checkpoint && s > first) keep(position);
      throw;
    }
    losses.push_back(loss);
    if (!o.json) std::printf("step %d/%d loss %.6f\n", s, o.steps, static_cast<double>(loss));
    std::fflush(stdout);
    if (checkpoint && (s == o.steps || (o.checkpoint_every > 0 && s % o.checkpoint_every == 0))) keep(data.position());
  }
  if (!o.save.empty() || !o.save_adapter.empty()) {
    // What diverged is not saved over what the files hold.
    if (!losses.empty() && !std::isfinite(losses.back().get<double>()))
      throw model_error("the loss of step " + std::to_string(o.steps) + " is not finite: training diverged and "
                        "nothing is saved (" + (o.save.empty() ? o.save_adapter : o.save) + " is unchanged)");
    if (!o.save.empty()) tuner.save(o.save);
    if (!o.save_adapter.empty())
      adapter->save(o.save_adapter, std::filesystem::absolute(o.model).lexically_normal().string());
  }
  if (remote) {
    spdlog::info("finetune: last route {}; {} failover(s)", swarm::to_string(swarm::route{remote->route()}),
                 remote->failovers());
  }
  if (o.json) {
    nlohmann::json j{{"steps", o.steps},
                     {"first_step", first},
                     {"tuning", tuning},
                     {"prompt_len", to.prompt_len},
                     {"blocks", o.local ? "local" : "swarm"},
                     {"losses", losses},
                     {"failovers", remote ? remote->failovers() : 0}};
    if (!o.save.empty()) j["saved"] = o.save;
    if (checkpoint && checkpoint->written_step() >= 0)
      j["checkpoint"] = {{"file", checkpoint->file().string()}, {"step", checkpoint->written_step()}};
    if (adapter) {
      j["adapter"] = {{"rank", adapter->config().rank},
                      {"alpha", adapter->config().alpha},
                      {"rslora", adapter->config().rslora},
                      {"targets", adapter->config().targets},
                      {"parameters", adapter->numel()}};
      if (!o.save_adapter.empty()) j["adapter"]["saved"] = o.save_adapter;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (!o.save.empty()) std::printf("prompts saved to %s\n", o.save.c_str());
    if (!o.save_adapter.empty()) std::printf("adapter saved to %s\n", o.save_adapter.c_str());
  }
  return 0;
}

}  // namespace

void register_finetune(CLI::App& app, action_fn& action) {
  auto o = std::make_shared<finetune_options>();
  auto* cmd = app.add_subcommand(
      "finetune",
      "Prompt-tune a frozen model, or train a LoRA adapter of it, with its blocks on a swarm (or locally with --local)");
  cmd->add_option("--model", o->model, "HuggingFace model directory (only the head is loaded with --swarm)")
      ->required();
  cmd->add_option("--data", o->data, "Training tokens: text, llm.c shard or raw uint16 .bin (as corolla train)")
      ->required();
  add_swarm_flags(cmd, o->swarm);
  cmd->add_flag("--local", o->local, "Run the blocks in this process (the reference for a swarm run)");
  cmd->add_option("--steps", o->steps, "Optimiser steps")->check(CLI::Range(1, 1000000))->capture_default_str();
  cmd->add_option("--batch", o->batch, "Sequences per step")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--seq", o->seq, "Tokens per sequence")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Trainable prefix positions per sequence")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--tuning", o->tuning,
                  "deep (a prompt per block), shallow (the input prefix only) or none (no prompts: beside "
                  "--lora-rank/--adapter; the default there)");
  add_lora_flags(cmd, o->lora,
                 "Train a LoRA adapter of rank R of the blocks too (at most 128: the servers get its factors with "
                 "each request and answer their gradients; the model stays frozen)");
  cmd->add_option("--save-adapter", o->save_adapter,
                  "Write the trained adapter here (PEFT's layout: serve --adapter NAME=DIR serves it)")
      ->check(non_empty());
  cmd->add_option("--lr", o->lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the prompts' and the new adapter's initialisation and of route choices")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--save", o->save, "Write the trained prompts here (safetensors, 'deep_prompts' [blocks, P, D])")
      ->check(non_empty());
  cmd->add_option("--checkpoint-dir", o->checkpoint_dir,
                  "Keep the client's state here (finetune_state.safetensors: prompts, adapter, AdamW moments, step, "
                  "data position), after the last step and every --checkpoint-every steps")
      ->check(non_empty());
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "Also write the state every K steps (0: the last step only)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  cmd->add_flag("--resume", o->resume,
                "Go on from --checkpoint-dir's state (written by a run of the same model, tuning, adapter, batch, "
                "seq, lr and data) up to --steps");
  cmd->add_flag("--json", o->json, "Print one JSON line with every step's loss instead of one line per step");
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores; 1 with a swarm)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "Where --local's blocks run: auto (cuda:0 when a GPU is visible), cpu, cuda or cuda:N (the head and the prompts stay on the cpu)")
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([o, cmd, &action] {
    action = [o, cmd] {
      refuse_swarm_only_flags(*cmd, o->swarm);
      return run_finetune(*o);
    };
  });
}

}  // namespace corolla::app
