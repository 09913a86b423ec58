// corolla finetune — prompt tuning (deep or shallow) of a frozen model whose
// blocks run on a swarm (span.forward / span.backward through
// max-throughput routes), or locally with --local (the reference the swarm
// run must equal). The client loads only the head; the prompts and their
// AdamW state live here (model/prompt_tuning.hpp, actors/swarm_finetune.hpp).
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/swarm_finetune.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/swarm_flags.hpp"
#include "apps/train_args.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
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
  std::string tuning = "deep";
  float lr = 1e-2f;
  std::uint64_t seed = 0;
  std::string save;
  bool json = false;
  int threads = 0;
  std::string log_level = "warn";
  std::string device = "auto";  ///< --device: where --local's blocks run
};

int run_finetune(const finetune_options& o) {
  apply_common_options(o.threads, o.log_level);
  if (!o.save.empty()) check_output_file(o.save, "--save");
  if (o.local == o.swarm.given())
    throw std::invalid_argument("give exactly one of --swarm/--swarm-dht (blocks on the swarm) or --local");
  if (const std::string why = adamw_problem({.lr = o.lr}); !why.empty()) throw std::invalid_argument(why);
  if (o.tuning != "deep" && o.tuning != "shallow")
    throw std::invalid_argument("--tuning must be deep or shallow, got '" + o.tuning + "'");
  // auto with a swarm: the servers compute, nothing here needs a device
  const device where = o.device == "auto" && !o.local ? device{} : parse_device(o.device);
  if (where.kind != device_kind::cpu && !o.local)
    throw std::invalid_argument("--device " + o.device + " places --local's blocks; with a swarm the servers compute");
  const model_config cfg = load_config(o.model);
  token_dataset data = open_data(o.data, o.model, cfg.vocab_size);
  const checkpoint ck = checkpoint::open(o.model);
  head h = head::load(ck, cfg, cpu_backend());

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
  to.prompt_len = o.prompt_len;
  to.deep = o.tuning == "deep";
  to.optimizer.lr = o.lr;
  to.seed = o.seed;
  prompt_tuner tuner(h, *runner, to);
  std::vector<std::int32_t> ids, targets;
  nlohmann::json losses = nlohmann::json::array();
  for (int s = 1; s <= o.steps; ++s) {
    data.next_batch(o.batch, o.seq, ids, targets);
    const float loss = tuner.step(ids, targets, o.batch, o.seq);
    losses.push_back(loss);
    if (!o.json) std::printf("step %d/%d loss %.6f\n", s, o.steps, static_cast<double>(loss));
    std::fflush(stdout);
  }
  if (!o.save.empty()) {
    // Diverged prompts are not saved over what the file holds.
    if (!losses.empty() && !std::isfinite(losses.back().get<double>()))
      throw model_error("the loss of step " + std::to_string(o.steps) + " is not finite: the prompts diverged and "
                        "are not saved (" + o.save + " is unchanged)");
    tuner.save(o.save);
  }
  if (remote) {
    spdlog::info("finetune: last route {}; {} failover(s)", swarm::to_string(swarm::route{remote->route()}),
                 remote->failovers());
  }
  if (o.json) {
    nlohmann::json j{{"steps", o.steps},
                     {"tuning", o.tuning},
                     {"prompt_len", o.prompt_len},
                     {"blocks", o.local ? "local" : "swarm"},
                     {"losses", losses},
                     {"failovers", remote ? remote->failovers() : 0}};
    if (!o.save.empty()) j["saved"] = o.save;
    std::printf("%s\n", j.dump().c_str());
  } else if (!o.save.empty()) {
    std::printf("prompts saved to %s\n", o.save.c_str());
  }
  return 0;
}

}  // namespace

void register_finetune(CLI::App& app, action_fn& action) {
  auto o = std::make_shared<finetune_options>();
  auto* cmd = app.add_subcommand(
      "finetune", "Prompt-tune a frozen model whose blocks run on a swarm (or locally with --local)");
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
  cmd->add_option("--tuning", o->tuning, "deep (a prompt per block) or shallow (the input prefix only)")
      ->capture_default_str();
  cmd->add_option("--lr", o->lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the prompts' initialisation and of route choices")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--save", o->save, "Write the trained prompts here (safetensors, 'deep_prompts' [blocks, P, D])")
      ->check(non_empty());
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
