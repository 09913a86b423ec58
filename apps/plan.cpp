// corolla plan — plans pipeline x data-parallel training of a model on a
// cluster file and prints the plan next to the naive and Holmes-rule
// baselines priced on the same cost model (docs/planner.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/printf.h>
#include <nlohmann/json.hpp>

#include "apps/cluster_file.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/plan_print.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/lora.hpp"
#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

namespace {

using json = nlohmann::json;
namespace sc = corolla::schedule;

struct plan_args {
  std::string cluster;
  std::string model;
  int global_batch = 32;
  int micro_batch = 1;
  int seq = 0;
  int pp = 0;
  int dp = 0;
  std::string precision;  ///< bf16 or fp32; empty: bf16, or fp32 beside --weights other than f32
  bool no_zero1 = false;
  double dp_overlap = 0.5;
  double headroom = 0.1;
  int lora_rank = 0;                      ///< a LoRA job of this rank (0: the whole model trains)
  std::vector<std::string> lora_targets;  ///< its modules (empty: the family's default)
  std::string weights = "f32";            ///< the frozen blocks' format beside the adapter (QLoRA: not f32)
  bool json = false;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gib(double bytes) { return fmt("%.1f", bytes / sc::gib(1)); }

std::string layers_of(const sc::stage_plan& s) {
  std::string l = std::to_string(s.first_layer) + "-" + std::to_string(s.last_layer - 1);
  if (s.embedding) l += " +emb";
  if (s.head) l += " +head";
  return l;
}

std::string cluster_name(const sc::cluster_description& c, int i) {
  return i < 0 ? std::string("(mixed)") : c.clusters[i].name;
}
std::string nic_name(const sc::cluster_description& c, int i) {
  return i < 0 ? std::string("(mixed)") : c.nics[i].name;
}

void print_cluster(const sc::cluster_description& c) {
  std::printf("cluster %s (%s): %zu clusters, %zu nodes, %d workers\n", c.name.c_str(), c.origin.c_str(),
              c.clusters.size(), c.nodes.size(), c.size());
  for (const auto& cl : c.clusters) {
    // Summarise workers by (model, speed, memory, NIC).
    std::vector<std::pair<std::string, int>> kinds;
    for (int n : cl.nodes)
      for (int r : c.nodes[n].workers) {
        const auto& w = c.workers[r];
        std::string k = w.model + " (" + fmt("%.3g", w.flops / 1e12) + " TFLOP/s, " + gib(w.memory) +
                        " GiB) on " + c.nics[w.nic].name + " (" + sc::describe_link(c.nics[w.nic].link) + ")";
        auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& e) { return e.first == k; });
        if (it == kinds.end()) kinds.emplace_back(k, 1);
        else ++it->second;
      }
    std::string list;
    for (const auto& [k, n] : kinds) list += (list.empty() ? "" : "; ") + std::to_string(n) + " x " + k;
    std::printf("  %s: %zu nodes, %s\n", cl.name.c_str(), cl.nodes.size(), list.c_str());
  }
  for (std::size_t a = 0; a < c.clusters.size(); ++a)
    for (std::size_t b = a + 1; b < c.clusters.size(); ++b)
      std::printf("  link %s <-> %s: %s\n", c.clusters[a].name.c_str(), c.clusters[b].name.c_str(),
                  sc::describe_link(c.cluster_link(static_cast<int>(a), static_cast<int>(b))).c_str());
}

void print_baseline(const char* label, const sc::plan& base, const sc::plan& best) {
  if (!base.feasible) {
    std::printf("  %-46s PP %d x DP %d: %s\n", label, base.pp, base.dp,
                base.stages.empty() ? base.reason.c_str() : ("infeasible: " + base.reason).c_str());
    return;
  }
  std::string split;
  for (const auto& s : base.stages) split += (split.empty() ? "" : "/") + std::to_string(s.last_layer - s.first_layer);
  std::printf("  %-46s PP %d x DP %d: step %s (layers %s), planner %.2fx faster\n", label, base.pp, base.dp,
              duration_text(base.estimate.step_s).c_str(), split.c_str(), base.estimate.step_s / best.estimate.step_s);
}

json memory_json(const sc::stage_estimate& s) {
  double g = sc::gib(1);
  return {{"weights", s.memory.weights / g}, {"grads", s.memory.grads / g}, {"optimizer", s.memory.optimizer / g},
          {"activations", s.memory.activations / g}, {"total", s.memory.total() / g}, {"capacity", s.capacity / g}};
}

json plan_json(const sc::cluster_description& c, const sc::plan& p) {
  json j{{"strategy", p.strategy}, {"feasible", p.feasible}, {"pp", p.pp}, {"dp", p.dp}, {"tp", p.tp}};
  if (!p.reason.empty()) j["reason"] = p.reason;
  if (p.stages.empty()) return j;
  const auto& e = p.estimate;
  j["micro_batches"] = p.micro_batches;
  j["step_s"] = e.step_s;
  j["pipeline_s"] = e.pipeline_s;
  j["steady_s"] = e.steady_s;
  j["fill_drain_s"] = e.fill_drain_s;
  j["dp_tail_s"] = e.dp_tail_s;
  j["embedding_sync_s"] = e.embedding_sync_s;
  j["bubble_fraction"] = e.bubble_fraction;
  j["samples_per_s"] = e.samples_per_s;
  j["tokens_per_s"] = e.tokens_per_s;
  j["model_tflops_per_worker"] = e.flops_per_worker / 1e12;
  json idle = json::array();
  for (int r : p.idle) idle.push_back(c.workers[r].name);
  j["idle"] = idle;
  json stages = json::array();
  for (const auto& s : p.stages) {
    json names = json::array();
    for (int r : s.workers) names.push_back(c.workers[r].name);
    stages.push_back({{"index", s.index},
                      {"first_layer", s.first_layer},
                      {"last_layer", s.last_layer},
                      {"embedding", s.embedding},
                      {"head", s.head},
                      {"workers", names},
                      {"ranks", s.workers},
                      {"cluster", s.cluster < 0 ? json(nullptr) : json(c.clusters[s.cluster].name)},
                      {"nic", s.nic < 0 ? json(nullptr) : json(c.nics[s.nic].name)},
                      {"tflops", s.cost.flops_per_s / 1e12},
                      {"memory_gib", memory_json(s.cost)},
                      {"in_flight", s.cost.in_flight},
                      {"forward_s", s.cost.forward_s},
                      {"backward_s", s.cost.backward_s},
                      {"send_s", s.cost.send_s},
                      {"reduce_s", s.cost.reduce_s},
                      {"exposed_reduce_s", s.cost.exposed_reduce_s},
                      {"grad_buckets", s.cost.grad_buckets}});
  }
  j["stages"] = stages;
  return j;
}

}  // namespace

std::string duration_text(double s) {
  if (!std::isfinite(s)) return "forever";
  if (s >= 365.25 * 86400) return fmt("%.3g years", s / (365.25 * 86400));
  if (s >= 86400) return fmt("%.1f days", s / 86400);
  if (s >= 3600) return fmt("%.1f h", s / 3600);
  if (s >= 1.0) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.1f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}

std::string plan_text(const sc::cluster_description& c, const sc::plan& p) {
  const auto& e = p.estimate;
  std::string text;
  text += fmt::sprintf("plan: PP %d x DP %d x TP %d on %d of %d workers; per replica and step %d micro-batch%s of "
                       "%d x %d tokens\n",
                       p.pp, p.dp, p.tp, p.pp * p.dp, c.size(), p.micro_batches, p.micro_batches == 1 ? "" : "es",
                       p.micro_batch, p.seq);
  text += fmt::sprintf("  %-5s %-16s %-28s %-12s %-10s %7s %15s %11s %9s %22s\n", "stage", "layers", "workers",
                       "cluster", "nic", "TFLOP/s", "memory GiB", "fwd+bwd/mb", "send/mb", "DP reduce (exposed)");
  for (const auto& s : p.stages) {
    std::string workers = sc::describe_workers(c, s.workers);
    std::string nic = nic_name(c, s.nic);
    if (nic.size() > 10) nic = nic.substr(0, 7) + "...";
    if (workers.size() > 28) workers = workers.substr(0, 25) + "...";
    std::string mem = gib(s.cost.memory.total()) + "/" + gib(s.cost.capacity);
    std::string reduce = duration_text(s.cost.reduce_s) + " (" + duration_text(s.cost.exposed_reduce_s) + ")";
    text += fmt::sprintf("  %-5d %-16s %-28s %-12s %-10s %7.3g %15s %11s %9s %22s\n", s.index, layers_of(s).c_str(),
                workers.c_str(), cluster_name(c, s.cluster).c_str(), nic.c_str(),
                s.cost.flops_per_s / 1e12, mem.c_str(), duration_text(s.cost.forward_s + s.cost.backward_s).c_str(),
                s.head ? "-" : duration_text(s.cost.send_s).c_str(), reduce.c_str());
  }
  if (!p.idle.empty()) text += fmt::sprintf("  idle: %s\n", sc::describe_workers(c, p.idle).c_str());
  text += fmt::sprintf("predicted step: %s = pipeline %s (steady %s + fill/drain %s) + DP tail %s; bubble %.1f%%\n",
              duration_text(e.step_s).c_str(), duration_text(e.pipeline_s).c_str(), duration_text(e.steady_s).c_str(),
              duration_text(e.fill_drain_s).c_str(), duration_text(e.dp_tail_s).c_str(), 100 * e.bubble_fraction);
  text += fmt::sprintf("throughput: %.2f samples/s, %.0f tokens/s, %.1f model TFLOP/s per worker\n", e.samples_per_s,
              e.tokens_per_s, e.flops_per_worker / 1e12);
  return text;
}

void print_plan(std::FILE* out, const sc::cluster_description& c, const sc::plan& p) {
  std::fputs(plan_text(c, p).c_str(), out);  // one write: no other thread's line inside it
}

namespace {

int run_plan(const plan_args& a) {
  sc::cluster_description cluster = load_cluster_file(a.cluster);
  model_config cfg = load_config(a.model);
  sc::training_setup setup;
  const weight_format frozen = parse_weights_flag(a.weights);
  // train computes an adapter beside quantised weights in f32 (each block widened for its turn).
  const bool qlora = frozen != weight_format::f32;
  const std::string precision = a.precision.empty() ? (qlora ? "fp32" : "bf16") : a.precision;
  if (precision == "bf16") setup.set_precision(sc::precision::bf16_mixed);
  else if (precision == "fp32") setup.set_precision(sc::precision::fp32);
  else throw model_error("--precision must be bf16 or fp32, got '" + precision + "'");
  if (qlora && precision != "fp32")
    throw std::invalid_argument("--weights " + a.weights + " --precision " + precision + ": train computes an adapter "
                                "beside " + a.weights + " weights in f32; drop --precision or give fp32");
  setup.global_batch = a.global_batch;
  setup.micro_batch = a.micro_batch;
  setup.seq = a.seq;
  setup.pp = a.pp;
  setup.dp = a.dp;
  setup.zero1 = !a.no_zero1;
  setup.dp_overlap = a.dp_overlap;
  setup.memory_headroom = a.headroom;
  std::int64_t adapter_values = 0;
  std::vector<std::string> targets;
  if (a.lora_rank > 0) {
    lora_config c;
    c.rank = a.lora_rank;
    c.targets = a.lora_targets;
    const lora_adapter shape = lora_adapter::zeros(cfg, c);  // a bad target is one error here
    adapter_values = shape.numel();
    targets = shape.config().targets;
    setup.lora_block_params = static_cast<double>(adapter_values) / cfg.n_layers;
  } else if (!a.lora_targets.empty()) {
    throw std::invalid_argument("--lora-targets names the modules of a LoRA job: add --lora-rank R");
  }
  if (qlora) {
    if (a.lora_rank == 0)
      throw std::invalid_argument("--weights " + a.weights + ": frozen weights in another format carry an adapter "
                                  "(add --lora-rank R)");
    // As an inference-only stage holds a block (train --weights): no f32 parameters.
    setup.frozen_block_bytes = static_cast<double>(served_block_bytes(cfg, frozen, false));
  }

  sc::plan_report r = sc::make_plan(cluster, cfg, setup);
  if (!r.best.feasible) throw model_error("no feasible plan: " + r.best.reason);
  const sc::plan& best = r.best;

  if (a.json) {
    auto ratio = [&](const sc::plan& p) {
      return p.feasible ? json(p.estimate.step_s / best.estimate.step_s) : json(nullptr);
    };
    json j{{"cluster",
            {{"name", cluster.name}, {"file", cluster.origin}, {"clusters", cluster.clusters.size()},
             {"nodes", cluster.nodes.size()}, {"workers", cluster.size()}}},
           {"model",
            {{"architecture", cfg.hf_architecture}, {"layers", cfg.n_layers}, {"hidden", cfg.hidden_size},
             {"parameters", cfg.parameter_count()}}},
           {"setup",
            {{"global_batch", setup.global_batch}, {"micro_batch", setup.micro_batch},
             {"seq", setup.sequence_length(cfg)}, {"precision", precision}, {"zero1", setup.zero1},
             {"dp_overlap", setup.dp_overlap}, {"memory_headroom", setup.memory_headroom},
             {"lora", a.lora_rank > 0 ? json{{"rank", a.lora_rank},
                                             {"targets", targets},
                                             {"values", adapter_values},
                                             {"base_weights", weight_format_flag(frozen)},
                                             {"frozen_block_bytes", setup.frozen_block_bytes}}
                                      : json(nullptr)}}},
           {"plan", plan_json(cluster, best)},
           {"baselines",
            {{"naive", plan_json(cluster, r.naive)},
             {"holmes", plan_json(cluster, r.holmes)},
             {"holmes_2_stages", plan_json(cluster, r.holmes_two_stages)}}},
           {"speedup",
            {{"vs_naive", ratio(r.naive)},
             {"vs_holmes", ratio(r.holmes)},
             {"vs_holmes_2_stages", ratio(r.holmes_two_stages)}}},
           {"layouts_priced", r.layouts_priced}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  print_cluster(cluster);
  std::printf("model: %s, %d layers, hidden %d, %.2fB parameters\n", cfg.hf_architecture.c_str(), cfg.n_layers,
              cfg.hidden_size, cfg.parameter_count() / 1e9);
  std::printf("job: global batch %d sequences of %d tokens, micro-batch %d, %s, AdamW%s\n", setup.global_batch,
              setup.sequence_length(cfg), setup.micro_batch,
              precision == "bf16" ? "bf16 mixed precision" : "fp32", setup.zero1 ? " (ZeRO-1)" : "");
  if (a.lora_rank > 0) {
    std::string t;
    for (const std::string& x : targets) t += (t.empty() ? "" : ", ") + x;
    std::printf("LoRA: an adapter of rank %d on %s (%lld values) trains beside the frozen model: its gradients, "
                "moments and DP traffic only\n",
                a.lora_rank, t.c_str(), static_cast<long long>(adapter_values));
    if (frozen != weight_format::f32)
      std::printf("QLoRA: the frozen blocks held as %s, %.1f MiB each (%.1f MiB in f32), one widened to f32 at a "
                  "time\n",
                  weight_format_flag(frozen), setup.frozen_block_bytes / (1 << 20),
                  static_cast<double>(served_block_bytes(cfg, weight_format::f32, true)) / (1 << 20));
  }
  std::printf("\n");
  print_plan(stdout, cluster, best);
  std::printf("\nbaselines on the same cost model (%d layouts priced):\n", r.layouts_priced);
  print_baseline("Holmes rule (NIC-sorted, layers by TFLOP/s)", r.holmes, best);
  print_baseline("naive (file order, even split)", r.naive, best);
  print_baseline("Holmes rule, 2 stages (original code)", r.holmes_two_stages, best);
  return 0;
}

}  // namespace

void register_plan(CLI::App& app, action_fn& action) {
  auto args = std::make_shared<plan_args>();
  auto* cmd = app.add_subcommand(
      "plan",
      "Plan pipeline x data-parallel training on a cluster file: every data-parallel group stays "
      "in one cluster and NIC class, layers are split by dynamic programming over a cost model; "
      "prints the plan, its predicted step time and the naive and Holmes-rule baselines");
  cmd->add_option("--cluster", args->cluster, "Cluster description (TOML, see docs/planner.md)")->required();
  cmd->add_option("--model", args->model, "Model directory with config.json, or the config.json itself")
      ->required();
  cmd->add_option("--global-batch", args->global_batch, "Sequences per optimizer step")
      ->check(integer_between(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--micro-batch", args->micro_batch, "Sequences per micro-batch")
      ->check(integer_between(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--seq", args->seq, "Tokens per sequence (0, the default: the model's context)")
      ->check(integer_between(0, 1 << 30));
  cmd->add_option("--pp", args->pp, "Force this pipeline depth (0, the default: search)")
      ->check(integer_between(0, 65536));
  cmd->add_option("--dp", args->dp, "Force this data-parallel width (0, the default: search)")
      ->check(integer_between(0, 65536));
  cmd->add_option("--precision", args->precision,
                  "bf16 (mixed, fp32 AdamW states) or fp32; default bf16, or fp32 beside --weights other than f32 "
                  "(QLoRA computes in f32)");
  cmd->add_flag("--no-zero1", args->no_zero1, "Replicate optimizer states instead of sharding them over DP");
  cmd->add_option("--dp-overlap", args->dp_overlap,
                  "Share of the DP reduction that may overlap the last backward (0..1)")
      ->check(finite_between(0, 1))
      ->capture_default_str();
  cmd->add_option("--memory-headroom", args->headroom, "Fraction of each worker's memory left free (0..1)")
      ->check(finite_between(0, 0.99))
      ->capture_default_str();
  cmd->add_option("--lora-rank", args->lora_rank,
                  "Plan a LoRA job: an adapter of this rank trains beside the frozen model (its gradients, "
                  "moments and DP traffic only; no weight gradients in the backward). 0, the default: the whole "
                  "model trains")
      ->check(integer_between(0, 65536));
  cmd->add_option("--lora-targets", args->lora_targets,
                  "The adapted modules, as train --lora-targets names them (default: q_proj,v_proj; GPT-2: c_attn)")
      ->delimiter(',');
  cmd->add_option("--weights", args->weights,
                  "The frozen blocks' linear weights as f32, bf16, int8 or nf4 (QLoRA, as train --weights holds "
                  "them; another format than f32 needs --lora-rank; the head and embeddings stay f32)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON object instead of the tables");
  cmd->callback([&action, args] { action = [args] { return run_plan(*args); }; });
}

}  // namespace corolla::app
