// corolla train — single-process training of a HuggingFace-layout model on a
// token file, printing `step <i> loss <value>` per logged step.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/train_job.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/model_load.hpp"
#include "apps/train_args.hpp"
#include "apps/train_lobby.hpp"
#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/fingerprint.hpp"
#include "model/lora.hpp"
#include "model/optimizer.hpp"
#include "model/stage.hpp"
#include "model/token_data.hpp"
#include "model/tokenizer.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

namespace fs = std::filesystem;

// A directory with weights is loaded; one with only config.json starts from
// the GPT-2 initialisation for --seed.
bool has_weights(const std::filesystem::path& dir) {
  return fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
}

transformer open_model(const std::filesystem::path& dir, std::uint64_t seed, Backend& be, bool& fresh) {
  if (!fs::is_directory(dir))
    throw no_model_directory(dir);
  fresh = !has_weights(dir);
  if (fresh) return transformer::init(load_config(dir), seed, be);
  return transformer::load(dir, be);
}

namespace {

bool is_text_data(const std::filesystem::path& file) {
  if (file.extension() == ".bin") return false;
  std::ifstream in(file, std::ios::binary);
  std::int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return !(in && magic == llmc_shard_magic);
}

}  // namespace

// Token files (llm.c shards, raw uint16 `.bin`) need no tokenizer; anything
// else is text and is tokenised with the model directory's tokenizer (the
// format rule of token_dataset::open). Loading a tokenizer only for text
// keeps config-only directories without one usable on token files.
token_dataset open_data(const std::filesystem::path& file, const std::filesystem::path& model_dir, int vocab) {
  if (!fs::exists(file)) throw model_error("data file " + file.string() + " does not exist");
  if (fs::is_directory(file)) throw model_error("data file " + file.string() + " is a directory");
  // Sniffing the format opens it: a pipe without a writer would hang that.
  if (!fs::is_regular_file(file))
    throw model_error("data file " + file.string() + " is not a regular file (a device, a pipe or a socket)");
  std::unique_ptr<tokenizer> tok;
  if (is_text_data(file)) tok = load_tokenizer(model_dir);
  return token_dataset::open(file, tok.get(), vocab);
}

dtype compute_dtype_of(const train_args& a) { return parse_compute_flag(a.compute, parse_device(a.device)); }

loss_scaling loss_scaling_of(const train_args& a, dtype compute) {
  return parse_loss_scaling(a.loss_scale, compute == dtype::f16);
}

void add_loss_scale(nlohmann::json& line, double scale, bool skipped) {
  line["loss_scale"] = scale;
  line["skipped"] = skipped;
}

std::string skipped_note(bool skipped, double scale) {
  if (!skipped) return {};
  char note[96];
  std::snprintf(note, sizeof note, " (skipped: gradients overflowed at loss scale %g)", scale);
  return note;
}

lr_schedule schedule_of(const train_args& a) {
  if (a.lr_schedule != "constant" && a.lr_schedule != "cosine")
    throw std::invalid_argument("--lr-schedule must be constant or cosine, got '" + a.lr_schedule + "'");
  if (a.warmup_steps < 0) throw std::invalid_argument("--warmup-steps must be >= 0");
  lr_schedule s;
  s.warmup_steps = a.warmup_steps;
  s.cosine = a.lr_schedule == "cosine";
  return s;
}

dist_lora new_dist_lora(const model_config& cfg, lora_config c, std::uint64_t seed) {
  dist_lora l;
  l.seed = seed;
  // By the modules' paths, as a made adapter names them (its summary and
  // saved config); a bad rank, alpha or target throws here.
  c.targets = lora_adapter::zeros(cfg, c).config().targets;
  l.config = std::move(c);
  return l;
}

std::string frozen_model_digest(const fs::path& dir) {
  // FNV-1a 64 over each weight file's name and size, its safetensors
  // header (names, shapes, offsets) and 16 spans of 4 KiB spread over its
  // values: models of one shape differ there (a fine-tune, another seed).
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec)) files.push_back(it->path());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw model_error(dir.string() + " holds no weights (no .safetensors file)");
  fingerprint h;
  std::vector<char> buf(4096);
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    const std::uint64_t size = fs::file_size(f);
    h.mix(name.c_str(), name.size() + 1);
    h.mix(&size, sizeof size);
    std::ifstream in(f, std::ios::binary);
    std::uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), sizeof header);
    if (!in || header > size - sizeof header) throw model_error(f.string() + " is not a safetensors file");
    std::vector<char> text(static_cast<std::size_t>(std::min<std::uint64_t>(header, 1 << 24)));
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    h.mix(text.data(), static_cast<std::size_t>(in.gcount()));
    const std::uint64_t values = sizeof header + header, span = size - values;
    for (int k = 0; k < 16 && span > 0; ++k) {
      in.clear();
      in.seekg(static_cast<std::streamoff>(values + span * static_cast<std::uint64_t>(k) / 16));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      h.mix(buf.data(), static_cast<std::size_t>(in.gcount()));
    }
  }
  return h.hex();
}

void check_frozen_model(const fs::path& dir, const dist_lora& l) {
  if (!has_weights(dir))
    throw model_error("this LoRA job trains beside the frozen model's weights, which are not in " + dir.string() +
                      " on this machine");
  if (const std::string here = frozen_model_digest(dir); here != l.base_digest)
    throw model_error("the model in " + dir.string() + " (fingerprint " + here +
                      ") is not the frozen model this LoRA job trains beside (" + l.base_digest + ")");
}

void price_lora(schedule::training_setup& setup, const model_config& cfg, const std::optional<dist_lora>& lora) {
  if (!lora) return;
  setup.lora_block_params = static_cast<double>(lora_adapter::zeros(cfg, lora->config).numel()) / cfg.n_layers;
  if (lora->base_weights != weight_format::f32)  // what load_inference keeps of a block: no f32 parameters
    setup.frozen_block_bytes = static_cast<double>(served_block_bytes(cfg, lora->base_weights, false));
}

std::optional<dist_lora> dist_lora_of(const train_args& a, const model_config& cfg) {
  if (a.lora.rank == 0 && a.lora.adapter.empty()) return std::nullopt;
  if (!has_weights(a.model))
    throw model_error(a.model + " holds no weights: an adapter of freshly drawn weights that are never saved "
                      "would be of no use (train the whole model, or give a model with weights)");
  dist_lora l;
  if (!a.lora.adapter.empty()) {
    // Read once here: a bad directory is one error, not one per rank; and
    // the coordinator learns the adapter's own shape.
    l.from = fs::absolute(a.lora.adapter).lexically_normal();
    const lora_adapter saved = lora_adapter::load(l.from, cfg, cpu_backend());
    l.config = saved.config();
    l.from_digest = saved.digest();
    l.seed = a.seed;
  } else {
    l = new_dist_lora(cfg, a.lora.config(), a.seed);
  }
  l.base_model = fs::absolute(a.model).lexically_normal().string();
  l.base_digest = frozen_model_digest(a.model);
  l.base_weights = parse_weights_flag(a.weights);  // QLoRA beside bf16/int8/nf4
  return l;
}

namespace {

int run_train(const train_args& a) {
  // Before anything trains: a NaN learning rate would train to NaN and, saved, overwrite a good model.
  if (const std::string why = adamw_problem({.lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps,
                                             .weight_decay = a.weight_decay},
                                            a.grad_clip);
      !why.empty())
    throw std::invalid_argument(why);
  const bool lora = a.lora.given();
  if (const std::string why = a.lora.problem(); !why.empty()) throw std::invalid_argument(why);
  if (lora && !a.join.empty())
    throw model_error("--lora-rank and --adapter: a worker that joins takes the adapter its job trains (the "
                      "launcher's flags say which); drop them beside --join");
  const weight_format base_weights = parse_weights_flag(a.weights);
  if (!a.join.empty() && base_weights != weight_format::f32)
    throw std::invalid_argument("--weights " + a.weights +
                                ": a worker that joins holds the frozen weights as its job says (the launcher's "
                                "--weights); drop it beside --join");
  if (!lora && base_weights != weight_format::f32)
    throw std::invalid_argument("--weights " + a.weights +
                                ": the model trains its f32 parameters; frozen weights in another format carry an "
                                "adapter (add --lora-rank R or --adapter DIR)");
  if (base_weights != weight_format::f32 && parse_compute_dtype(a.compute) != dtype::f32)
    throw std::invalid_argument("--weights " + a.weights + " --compute " + a.compute +
                                ": an adapter beside " + a.weights +
                                " weights computes in f32 (each block's weights widened for its turn)");
  if (!a.join.empty()) return run_train_join(a);
  if (wants_distributed(a)) return run_distributed_train(a);
  // Name the flags given, not every flag that needs ranks.
  std::string distributed_only;
  for (const auto& [given, flag] : {std::pair{!a.checkpoint_dir.empty(), "--checkpoint-dir"},
                                    std::pair{a.checkpoint_every > 0, "--checkpoint-every"},
                                    std::pair{a.resume, "--resume"}, std::pair{a.chunks != 1, "--chunks"},
                                    std::pair{!a.link_profile.empty(), "--link-profile"},
                                    std::pair{a.collectives != "host", "--collectives"},
                                    std::pair{a.rings_at_once != dist_train_options{}.rings_at_once, "--rings-at-once"},
                                    std::pair{a.message_piece_bytes != dist_train_options{}.message_piece_bytes,
                                              "--message-piece-bytes"},
                                    std::pair{!a.coordinator.empty(), "--coordinator"},
                                    std::pair{a.external_coordinator, "--external-coordinator"},
                                    std::pair{a.elastic, "--elastic"}, std::pair{a.min_ranks != 1, "--min-ranks"},
                                    std::pair{!a.snapshot_every.empty(), "--snapshot-every"},
                                    std::pair{!a.standby.empty(), "--standby"},
                                    std::pair{a.probe_every != 0, "--probe-every"},
                                    std::pair{!a.take_over.empty(), "--take-over"}})
    if (given) distributed_only += (distributed_only.empty() ? "" : ", ") + std::string(flag);
  if (!distributed_only.empty())
    throw model_error(distributed_only + ": for pipeline x data-parallel training only; add --pp, --dp or --cluster");
  apply_common_options(a.threads, "warn");
  if (!a.save.empty()) check_output_dir(a.save, "--save");
  set_matmul_precision(parse_matmul_precision(a.matmul));
  const dtype compute = compute_dtype_of(a);
  Backend& be = backend_for(parse_device(a.device));
  bool fresh = false;
  transformer model = [&] {
    if (base_weights == weight_format::f32) return open_model(a.model, a.seed, be, fresh);
    if (!has_weights(a.model)) return open_model(a.model, a.seed, be, fresh);  // fresh: refused below
    return load_for_decoding(a.model, be, base_weights, "train", "", !a.json);  // the frozen base (QLoRA)
  }();
  if (lora && fresh)
    throw model_error(a.model + " holds no weights: an adapter of freshly drawn weights that are never saved "
                      "would be of no use (train the whole model, or give a model with weights)");
  model.set_compute_dtype(compute);
  token_dataset data = open_data(a.data, a.model, model.config().vocab_size);
  std::unique_ptr<lora_adapter> adapter;
  if (!a.lora.adapter.empty()) {
    adapter = std::make_unique<lora_adapter>(lora_adapter::load(a.lora.adapter, model.config(), be));
  } else if (lora) {
    adapter = std::make_unique<lora_adapter>(lora_adapter::init(model.config(), a.lora.config(), a.seed, be));
  }

  train_options o;
  o.batch = a.batch;
  o.micro_batch = a.micro_batch;  // gradient accumulation (0: the whole batch at once)
  o.seq = a.seq;
  o.steps = a.steps;
  o.optimizer.adamw = {.lr = a.lr, .beta1 = a.beta1, .beta2 = a.beta2, .eps = a.eps,
                       .weight_decay = a.weight_decay};
  o.optimizer.max_grad_norm = a.grad_clip;
  o.optimizer.schedule = schedule_of(a);
  o.optimizer.loss_scale = loss_scaling_of(a, compute);
  o.log_every = a.log_every;
  o.progress = !a.json;
  o.save_dir = a.save;
  o.adapter = adapter.get();
  o.adapter_base = fs::absolute(a.model).lexically_normal().string();
  trainer train(model, data, o);
  if (adapter && !a.json)
    std::fprintf(stderr, "training a LoRA adapter: r %d, alpha %g, %s; %lld parameters (%.3f%% of the model's)%s\n",
                 adapter->config().rank, static_cast<double>(adapter->config().alpha),
                 adapter->config().targets_text().c_str(), static_cast<long long>(adapter->numel()),
                 100.0 * static_cast<double>(adapter->numel()) / static_cast<double>(model.config().parameter_count()),
                 base_weights == weight_format::f32 ? "" : (std::string(" beside ") + a.weights + " weights").c_str());

  const train_summary s = train.run([&](const step_report& r) {
    if (a.json) {
      nlohmann::json line = {{"step", r.step}, {"loss", r.loss},
                             {"tokens_per_s", r.tokens_per_second}};
      if (r.grad_norm >= 0.0 || r.skipped) line["grad_norm"] = r.grad_norm;
      if (train.scaler().dynamic()) add_loss_scale(line, r.loss_scale, r.skipped);
      std::printf("%s\n", line.dump().c_str());
    } else {
      std::printf("step %d loss %.6f%s\n", r.step, static_cast<double>(r.loss),
                  skipped_note(r.skipped, r.loss_scale).c_str());
    }
    std::fflush(stdout);
  });

  if (a.json) {
    nlohmann::json summary = {{"steps", a.steps},
                              {"tokens", s.tokens},
                              {"seconds", s.seconds},
                              {"tokens_per_s", s.tokens_per_second},
                              {"parameters", model.config().parameter_count()},
                              {"fresh_init", fresh},
                              {"device", be.name()}};
    if (!s.losses.empty()) summary["final_loss"] = s.losses.back();
    if (train.scaler().dynamic()) {
      summary["skipped_steps"] = s.skipped_steps;
      summary["loss_scale"] = train.scaler().scale();
    }
    if (!a.save.empty()) summary["saved"] = a.save;
    if (adapter)
      summary["adapter"] = {{"rank", adapter->config().rank},
                            {"alpha", adapter->config().alpha},
                            {"rslora", adapter->config().rslora},
                            {"targets", adapter->config().targets},
                            {"parameters", adapter->numel()},
                            {"base_weights", a.weights}};  // as the flag names it
    std::printf("%s\n", summary.dump().c_str());
  } else {
    // Only `step` lines go to stdout; the summary is for people.
    std::fprintf(stderr, "trained %d steps (%lld tokens) in %.2f s: %.0f tokens/s on %s\n",
                 a.steps, static_cast<long long>(s.tokens), s.seconds, s.tokens_per_second,
                 be.name().c_str());
    if (!a.save.empty())
      std::fprintf(stderr, "saved %s to %s\n", adapter ? "the adapter (PEFT layout)" : "the model", a.save.c_str());
  }
  return 0;
}

}  // namespace

void register_train(CLI::App& app, action_fn& action) {
  auto args = std::make_shared<train_args>();
  auto* cmd = app.add_subcommand(
      "train",
      "Train a model on a token file with AdamW. Prints `step <i> loss <value>` for each "
      "logged step, steps numbered 1..N (step 1 = loss of the initial weights on the first "
      "batch). Batches are read sequentially, wrapping at the end of the data.");
  // Required, except for a worker that joins (--join): it learns the job.
  std::vector<CLI::Option*> needed;
  needed.push_back(cmd->add_option("--model", args->model,
                                   "HuggingFace model directory: weights to continue from, or only a config.json "
                                   "to start from a fresh GPT-2-style initialisation (see --seed) (required)"));
  needed.push_back(cmd->add_option("--data", args->data,
                                   "Token data: an llm.c shard, a raw uint16 .bin file, or text (tokenised with "
                                   "the model directory's tokenizer) (required)"));
  needed.push_back(cmd->add_option("--batch", args->batch, "Sequences per step (B) (required)"));
  needed.push_back(
      cmd->add_option("--seq", args->seq, "Tokens per sequence (T), at most the model's context (required)"));
  needed.push_back(cmd->add_option("--steps", args->steps, "Optimiser steps to run (N) (required)"));
  needed.push_back(cmd->add_option("--lr", args->lr, "AdamW learning rate (required)"));
  cmd->add_option("--weight-decay", args->weight_decay,
                  "Decoupled weight decay, applied to every parameter")
      ->capture_default_str();
  cmd->add_option("--beta1", args->beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", args->beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--eps", args->eps, "AdamW epsilon")->capture_default_str();
  cmd->add_option("--grad-clip", args->grad_clip,
                  "Clip gradients to this global L2 norm (0 = no clipping)")
      ->capture_default_str();
  cmd->add_option("--lr-schedule", args->lr_schedule,
                  "constant, or cosine: a half cosine from --lr down to 10% of it at the last step (after "
                  "the warm-up)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", args->warmup_steps,
                  "Linear learning-rate warm-up over the first K steps (0 = none)")
      ->capture_default_str();
  cmd->add_option("--log-every", args->log_every,
                  "Print every K-th step (the first and last step are always printed)")
      ->capture_default_str();
  cmd->add_option("--save", args->save,
                  "Write the trained model here (HuggingFace layout, loadable by generate)")
      ->check(non_empty());
  add_lora_flags(cmd, args->lora,
                 "Train a LoRA adapter of rank R instead of the whole model (the model's weights stay as they are, "
                 "--save writes the adapter in PEFT's layout)");
  cmd->add_option("--weights", args->weights,
                  "With --lora-rank or --adapter: hold the frozen model's linear weights as f32, bf16, int8 or nf4 "
                  "(QLoRA: an eighth of the bytes; each block is widened to f32 for its turn in the forward and "
                  "backward, and the adapter trains in f32). With --pp/--dp/--cluster each rank holds its own "
                  "stage's blocks in that format")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the fresh initialisation (config-only --model), or of a new LoRA adapter (--lora-rank)")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--matmul", args->matmul,
                  "Products of f32 tensors on a GPU: f32 (exact), tf32 or bf16 (tensor cores, f32 accumulation)")
      ->capture_default_str();
  cmd->add_option("--compute", args->compute,
                  "dtype the blocks' forward and backward run in: f32, or bf16 on a GPU (mixed precision: "
                  "bf16 activations and per-step weight copies; f32 master weights, gradients and optimiser). "
                  "f16 as well, with dynamic loss scaling by default (--loss-scale)")
      ->capture_default_str();
  cmd->add_option("--loss-scale", args->loss_scale,
                  "auto (dynamic with --compute f16, else off), dynamic (scale the loss gradient by 2^16, halve "
                  "it and skip the step when gradients overflow, double it after 2000 finite steps) or off")
      ->capture_default_str();
  cmd->add_option("--device", args->device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_flag("--json", args->json,
                "One JSON object per logged step, then a summary object (no progress bar)");
  const char* dist = "Pipeline x data-parallel";
  cmd->add_option("--pp", args->pp,
                  "Pipeline stages: with --dp, trains on P x D processes on this machine (one per rank, "
                  "launched here) unless --rank says this process is one rank of a larger job")
      ->check(CLI::Range(0, 4096))  // 0: not given
      ->group(dist);
  cmd->add_option("--dp", args->dp, "Data-parallel replicas of each stage (--batch splits over them)")
      ->check(CLI::Range(0, 4096))  // 0: not given
      ->group(dist);
  cmd->add_option("--cluster", args->cluster,
                  "Cluster TOML (docs/planner.md): train on the planner's layout for it, one local process per "
                  "worker the plan uses, each link shaped as the file says those workers are linked; prints the "
                  "plan first (--pp/--dp force a depth/width)")
      ->group(dist);
  cmd->add_option("--link-profile", args->link_profile,
                  "Shape every link between ranks with this profile (ib, roce, ethernet, wan, consumer, or "
                  "bw=...,lat=...); overrides the cluster file's links")
      ->group(dist);
  cmd->add_option("--chunks", args->chunks,
                  "Model chunks per pipeline stage: > 1 runs Megatron's interleaved 1F1B (stage s holds virtual "
                  "stages c*P+s; the micro-batches per replica must be a multiple of --pp)")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--collectives", args->collectives,
                  "How data-parallel groups reduce gradients: host (rings over the links, in host memory; any "
                  "device) or device (the GPUs' own collectives, NCCL, one GPU per rank: gradients and "
                  "parameters never leave the GPU)")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--micro-batch", args->micro_batch,
                  "Sequences per micro-batch, dividing the batch: a pipeline's unit (default: 1 with --pp > 1, else "
                  "the replica's whole batch), or in one process the unit of gradient accumulation (default: the "
                  "whole batch)");
  cmd->add_option("--rank", args->rank,
                  "Run only this rank of a multi-host job (also from SLURM_PROCID or RANK); rank 0 hosts the "
                  "coordinator at --coordinator")
      ->group(dist);
  cmd->add_option("--coordinator", args->coordinator,
                  "HOST:PORT of the job's coordinator (also from MASTER_ADDR and MASTER_PORT)")
      ->group(dist);
  cmd->add_flag("--external-coordinator", args->external_coordinator,
                "The coordinator runs in another process (the local launcher): rank 0 only joins it")
      ->group(dist);
  cmd->add_option("--listen", args->listen,
                  "ZeroMQ endpoint of this rank's node; with --join, the address this worker and the ranks it runs "
                  "listen on (the host others reach this machine at)")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--checkpoint-dir", args->checkpoint_dir,
                  "Write sharded checkpoints here (one file per rank per checkpoint; see --resume)")
      ->check(non_empty())
      ->group(dist);
  cmd->add_option("--checkpoint-every", args->checkpoint_every, "Checkpoint every K steps (0 = never)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str()
      ->group(dist);
  cmd->add_flag("--resume", args->resume,
                "Continue from the latest complete checkpoint in --checkpoint-dir (same model, batch and seq; any "
                "layout)")
      ->group(dist);
  cmd->add_flag("--elastic", args->elastic,
                "Local launcher: when ranks die or hang, re-plan the grid on the ranks left and continue from the "
                "survivors' in-memory snapshots (else the last checkpoint, or the start), re-sharded, printing each "
                "step once")
      ->group(dist);
  cmd->add_option("--min-ranks", args->min_ranks, "With --elastic: stop when fewer ranks than this remain")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--snapshot-every", args->snapshot_every,
                  "With --elastic: every K steps each rank keeps its state in memory and a copy at a buddy rank, so "
                  "that a single failure loses no step (0 = off: fall back to --checkpoint-dir; default 1); 'auto': "
                  "every step at first, then at the job's verdict steps as long an interval as the measured copies "
                  "need to take at most a fifth of the time between them")
      ->group(dist);
  cmd->add_option("--join", args->join,
                  "Offer this process as a worker to the elastic launcher whose lobby is at HOST:PORT (it prints it); "
                  "it runs the ranks it is given until the job ends")
      ->envname("COROLLA_JOIN")
      ->group(dist);
  cmd->add_option("--join-name", args->join_name,
                  "With --join: how the launcher names this worker; joining a --cluster job, the absent worker of its "
                  "cluster file this machine is (one of --standby, or a worker the job lost)")
      ->group(dist);
  cmd->add_option("--standby", args->standby,
                  "With --elastic --cluster: workers of the file (e.g. n2/0) that are not there at start; they join "
                  "with --join ENDPOINT --join-name WORKER and are used from the next re-plan that pays off")
      ->delimiter(',')
      ->group(dist);
  cmd->add_option("--join-machine", args->join_machine,
                  "With --join, joining an --elastic --cluster job as a machine its file does not describe: a TOML "
                  "file with cluster, name, nic and one [[worker]] (kind, model, tflops, memory_gib), as a node of "
                  "the cluster file; it runs as NAME/0")
      ->group(dist);
  cmd->add_option("--join-listen", args->join_listen,
                  "With --elastic (--pp/--dp, or --cluster with --standby): where workers join (default "
                  "tcp://127.0.0.1:0, printed at start)")
      ->group(dist);
  cmd->add_option("--join-check-every", args->join_check_every,
                  "With --elastic (--pp/--dp, or --cluster with --standby): every K steps the job stops at a step "
                  "boundary to grow onto joined workers when a larger grid fits (--cluster: when the planner's plan "
                  "with them pays off) (0 = never)")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--probe-every", args->probe_every,
                  "Measure every rank's links to its neighbours every K steps (0 = never); with --elastic "
                  "--cluster the job re-plans at a step boundary when a measured link makes another plan pay")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--job-file", args->job_file,
                  "Internal: the job description the local launcher writes for the ranks it starts")
      ->group(dist);
  cmd->add_option("--take-over", args->take_over,
                  "Internal: carry on an elastic job whose launcher died, from the state a rank process kept")
      ->group(dist);
  cmd->add_option("--timeout-s", args->timeout_s,
                  "Longest wait for any one message between ranks (a dead rank is reported sooner); at most a week")
      ->check(finite_between(0.001, 604800))
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--rings-at-once", args->rings_at_once,
                  "How many parameter buckets' data-parallel ring collectives a rank runs at once (host "
                  "collectives; 1: one bucket after another)")
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--message-piece-bytes", args->message_piece_bytes,
                  "The most bytes of tensor values one message carries of --save's parameters, of an in-memory "
                  "snapshot sent to a buddy, or of a snapshot fetched by the next grid; larger ones go in pieces "
                  "(4096 to 536870912)")
      ->check(CLI::Range(min_message_piece_bytes, max_message_piece_bytes))
      ->capture_default_str()
      ->group(dist);
  cmd->add_option("--hang-s", args->hang_s,
                  "A rank whose stage has been inside one forward or backward for longer than this (and ten times "
                  "its longest so far) is hung: it reports itself and ends (0 = never); with --elastic the job "
                  "re-plans without it. A local rank process stopped (SIGSTOP) for min(this, 2 s) is hung too; at "
                  "most a week")
      ->check(finite_between(0, 604800))
      ->capture_default_str()
      ->group(dist);
  cmd->callback([&action, args, needed] {
    if (args->join.empty())
      for (const CLI::Option* o : needed)
        if (o->count() == 0) throw CLI::RequiredError(o->get_name());
    action = [args] { return run_train(*args); };
  });
}

}  // namespace corolla::app
