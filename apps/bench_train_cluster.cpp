// corolla bench train --cluster FILE — an emulated heterogeneous cluster on
// this machine: one rank process per planned worker, every link shaped as
// the cluster file says, compute replaced by calibrated sleeps (each stage
// sleeps the cost model's forward and backward time per micro-batch) while
// activations, gradients and the DP reductions of the real parameter
// buffers cross the shaped links with their real bytes. Four layouts run
// in the same invocation: the planner's, the Holmes rule's, and the
// planner's on the same cluster with every NIC made Ethernet, and made IB;
// with --lora-rank each also trains a LoRA adapter (its blocks the DP
// buckets) on the same links and modelled compute.
#include <cmath>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/train_job.hpp"
#include "apps/cluster_file.hpp"
#include "apps/commands.hpp"
#include "apps/plan_print.hpp"
#include "apps/scratch_dir.hpp"
#include "apps/train_args.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/lora.hpp"
#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;
namespace sc = corolla::schedule;

/// The model of the cluster bench when --model is not given: Llama-shaped,
/// dim 128, 8 layers (2.6M parameters), small enough that the bytes eight
/// ranks move per step stay well inside what two cores can copy, so the
/// shaped links, not the host, set the pace.
model_config cluster_bench_config() {
  model_config c = bench_llama_config();
  c.hidden_size = 128;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 344;
  c.max_positions = 512;
  return c;
}

/// `c` with every node on NIC class `nic` (a built-in class; the file's own
/// numbers for it when it defines them).
sc::cluster_description all_on(const sc::cluster_description& c, const std::string& nic) {
  sc::cluster_description r = c;
  int idx = r.find_nic(nic);
  if (idx < 0) {
    r.nics.push_back({nic, sc::default_nic_link(nic), true});
    idx = static_cast<int>(r.nics.size()) - 1;
  }
  for (auto& n : r.nodes) n.nic = idx;
  for (auto& w : r.workers) w.nic = idx;
  r.name = c.name + " (all " + nic + ")";
  return r;
}

/// The longest run the bench starts, by the cost model's prediction.
constexpr double max_cluster_bench_s = 3600;

struct variant {
  std::string name;
  sc::cluster_description cluster;
  sc::plan plan;
  double measured_step_s = 0;
  double samples_per_s = 0;
  /// The DP groups' rings at once (dist_train_options::rings_at_once).
  int rings_at_once = dist_train_options{}.rings_at_once;
  /// With --lora-rank: the same layout training an adapter (0: not run).
  double lora_step_s = 0, lora_samples_per_s = 0;
};

std::string split_of(const sc::plan& p) {
  std::string s;
  for (const auto& st : p.stages) {
    if (!s.empty()) s += '/';
    s += std::to_string(st.last_layer - st.first_layer);
  }
  return s;
}

/// `x` as printf's %g writes it ("1", "0.5").
std::string format_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

/// Runs `v`'s layout for `steps` steps (the first a warm-up); with `lora`,
/// training that adapter. Returns the mean of the timed steps' seconds.
double run_layout(const variant& v, const train_args& base, const model_config& cfg, int steps, double grad_clip,
                  const std::optional<dist_lora>& lora) {
  dist_train_options o;
  o.lora = lora;
  o.optimizer.max_grad_norm = static_cast<float>(grad_clip);
  use_plan(v.cluster, v.plan, o);
  o.batch = base.batch;
  o.seq = base.seq;
  o.steps = steps;
  o.optimizer.adamw.lr = 1e-3f;
  o.rings_at_once = v.rings_at_once;
  for (const auto& st : v.plan.estimate.stages) {
    o.synthetic.forward_s.push_back(st.forward_s);
    o.synthetic.backward_s.push_back(st.backward_s);
  }
  std::vector<double> seconds;
  run_local_job(base, o, cfg, [&](const dist_step_report& r) { seconds.push_back(r.seconds); });
  // Step 1 also pays for the ranks' first connections: it is the warm-up.
  double sum = 0;
  for (std::size_t i = 1; i < seconds.size(); ++i) sum += seconds[i];
  return sum / static_cast<double>(seconds.size() - 1);
}

void run_variant(variant& v, const train_args& base, const model_config& cfg, int steps, double grad_clip) {
  v.measured_step_s = run_layout(v, base, cfg, steps, grad_clip, std::nullopt);
  v.samples_per_s = base.batch / v.measured_step_s;
}

}  // namespace

int run_bench_train_cluster(const cluster_bench_options& a) {
  apply_common_options(1, "warn");
  if (a.timed_steps < 1)
    throw std::invalid_argument("bench train --cluster: need --steps >= 1 (timed steps after a warm-up)");
  const int steps = a.timed_steps + 1;
  const sc::cluster_description cluster = load_cluster_file(a.cluster);

  // The model: a directory, or the bench config written to a scratch one
  // (ranks start from a fresh initialisation; values do not matter here).
  const scratch_dir scratch_holder("corolla-bench-train");
  const fs::path& scratch = scratch_holder.path();
  fs::create_directories(scratch / "model");
  fs::path model_dir = a.model;
  if (model_dir.empty()) {
    model_dir = scratch / "model";
    std::ofstream(model_dir / "config.json") << to_hf_json(cluster_bench_config()).dump(2);
  }
  const model_config cfg = load_config(model_dir);
  {
    // Token data the ranks read (synthetic compute ignores the values).
    std::vector<std::uint16_t> zeros(static_cast<std::size_t>(a.batch) * a.seq * 2 + 1, 0);
    std::ofstream out(scratch / "tokens.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(zeros.data()), static_cast<std::streamsize>(zeros.size() * 2));
  }

  sc::training_setup setup;
  setup.set_precision(sc::precision::fp32);  // the bytes the ranks really send
  setup.global_batch = a.batch;
  setup.micro_batch = a.micro_batch;
  setup.seq = a.seq;
  setup.validate(cfg);
  const sc::plan_report report = sc::make_plan(cluster, cfg, setup);
  if (!report.best.feasible) throw model_error("no feasible plan: " + report.best.reason);

  std::vector<variant> variants;
  variants.push_back({"planner", cluster, report.best});
  if (report.holmes.feasible) variants.push_back({"holmes rule", cluster, report.holmes});
  for (const char* nic : {"ethernet", "ib"}) {
    sc::cluster_description c = all_on(cluster, nic);
    sc::plan_report r = sc::make_plan(c, cfg, setup);
    if (r.best.feasible) variants.push_back({std::string("all ").append(nic), c, r.best});
  }

  // The baseline of the DP actor's overlapping rings, measured in the same
  // run: the planner's layout and all-IB's with one bucket's ring at a time.
  std::vector<variant> one_ring;
  for (const variant& v : variants)
    if ((v.name == "planner" || v.name == "all ib") && v.plan.dp > 1) {
      one_ring.push_back(v);
      one_ring.back().rings_at_once = 1;
    }

  // --lora-rank: an adapter of q and v (the default targets), alpha = r.
  std::optional<dist_lora> lora;
  std::int64_t adapter_values = 0;
  if (a.lora_rank > 0) {
    lora_config c;
    c.rank = a.lora_rank;
    c.alpha = static_cast<float>(a.lora_rank);
    lora = new_dist_lora(cfg, c, 0);
    adapter_values = lora_adapter::zeros(cfg, lora->config).numel();
  }

  // And the planner's own plan for the adapter (the cost model prices its
  // frozen weights, input-gradient-only backward and small DP traffic),
  // its ranks sleeping that plan's compute.
  std::optional<variant> lora_plan;
  if (lora) {
    sc::training_setup s = setup;
    price_lora(s, cfg, lora);
    const sc::plan_report r = sc::make_plan(cluster, cfg, s);
    if (r.best.feasible) lora_plan = variant{"planner (LoRA)", cluster, r.best};
  }

  // The ranks sleep each stage's predicted compute: a cluster of slow
  // workers (tflops = 1e-12) would start a run of centuries.
  double predicted_s = 0;
  for (const variant& v : variants) predicted_s += steps * v.plan.estimate.step_s;
  for (const variant& v : one_ring) predicted_s += steps * v.plan.estimate.step_s;
  const std::size_t lora_runs = a.lora_rank > 0 ? variants.size() : 0;
  for (std::size_t i = 0; i < lora_runs; ++i) predicted_s += steps * variants[i].plan.estimate.step_s;
  if (lora_plan) predicted_s += steps * lora_plan->plan.estimate.step_s;
  if (!(predicted_s <= max_cluster_bench_s))
    throw std::invalid_argument("bench train --cluster: the cost model predicts " + duration_text(predicted_s) + " for " +
                                std::to_string(steps) + " steps of " + std::to_string(variants.size() + one_ring.size() + lora_runs + (lora_plan ? 1 : 0)) +
                                " layouts (the ranks sleep each stage's predicted compute); this bench runs at most " +
                                duration_text(max_cluster_bench_s) + ": give faster workers (tflops), a smaller "
                                "--model or fewer --steps");

  train_args base;
  base.model = model_dir.string();
  base.data = (scratch / "tokens.bin").string();
  base.batch = a.batch;
  base.seq = a.seq;
  base.threads = 1;
  if (!a.json) {
    std::fprintf(stderr, "bench train --cluster %s: %s, %.1fM parameters, global batch %d x %d tokens; %d steps each "
                         "(first is warm-up), synthetic compute, real bytes on shaped links%s\n",
                 a.cluster.c_str(), cfg.hf_architecture.c_str(), cfg.parameter_count() / 1e6, a.batch, a.seq, steps,
                 a.grad_clip > 0 ? ("; gradients clipped to norm " + format_g(a.grad_clip)).c_str() : "");
    print_plan(stderr, cluster, report.best);
  }
  for (variant& v : variants) {
    if (!a.json)
      std::fprintf(stderr, "  running %-12s PP %d x DP %d (layers %s)...\n", v.name.c_str(), v.plan.pp, v.plan.dp,
                   split_of(v.plan).c_str());
    run_variant(v, base, cfg, steps, a.grad_clip);
    // Its baseline right after it: a drift of the machine's load hits both.
    for (variant& one : one_ring) {
      if (one.name != v.name) continue;
      if (!a.json)
        std::fprintf(stderr, "  running %-12s PP %d x DP %d with one bucket's ring at a time...\n", one.name.c_str(),
                     one.plan.pp, one.plan.dp);
      run_variant(one, base, cfg, steps, a.grad_clip);
    }
    if (lora) {
      if (!a.json)
        std::fprintf(stderr, "  running %-12s PP %d x DP %d training a LoRA adapter (r %d)...\n", v.name.c_str(),
                     v.plan.pp, v.plan.dp, a.lora_rank);
      v.lora_step_s = run_layout(v, base, cfg, steps, a.grad_clip, lora);
      v.lora_samples_per_s = base.batch / v.lora_step_s;
    }
  }
  if (lora_plan) {
    if (!a.json)
      std::fprintf(stderr, "  running the planner's plan for the adapter, PP %d x DP %d (layers %s)...\n",
                   lora_plan->plan.pp, lora_plan->plan.dp, split_of(lora_plan->plan).c_str());
    lora_plan->measured_step_s = run_layout(*lora_plan, base, cfg, steps, a.grad_clip, lora);
    lora_plan->samples_per_s = base.batch / lora_plan->measured_step_s;
  }
  // The same layout with its rings side by side, against one at a time.
  auto overlapped = [&](const variant& one) -> const variant& {
    for (const auto& v : variants)
      if (v.name == one.name) return v;
    return one;
  };

  const variant* ib = nullptr;
  const variant* holmes = nullptr;
  for (const auto& v : variants) {
    if (v.name == "all ib") ib = &v;
    if (v.name == "holmes rule") holmes = &v;
  }
  const variant& planner = variants.front();
  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& v : variants)
      rows.push_back({{"layout", v.name}, {"pp", v.plan.pp}, {"dp", v.plan.dp}, {"layers", split_of(v.plan)},
                      {"predicted_step_s", v.plan.estimate.step_s}, {"measured_step_s", v.measured_step_s},
                      {"samples_per_s", v.samples_per_s},
                      {"vs_all_ib", ib ? nlohmann::json(v.samples_per_s / ib->samples_per_s) : nlohmann::json(nullptr)}});
    nlohmann::json j = {{"bench", "train-cluster"}, {"cluster", cluster.name}, {"parameters", cfg.parameter_count()},
                        {"batch", a.batch}, {"seq", a.seq}, {"steps", steps}, {"grad_clip", a.grad_clip},
                        {"layouts", rows}};
    if (holmes) j["planner_vs_holmes"] = planner.samples_per_s / holmes->samples_per_s;
    if (lora) {
      j["lora_rank"] = a.lora_rank;
      j["lora_targets"] = lora->config.targets;
      j["lora_adapter_values"] = adapter_values;
      for (std::size_t i = 0; i < variants.size(); ++i) {
        j["layouts"][i]["lora_measured_step_s"] = variants[i].lora_step_s;
        j["layouts"][i]["lora_vs_full"] = variants[i].lora_samples_per_s / variants[i].samples_per_s;
      }
      if (lora_plan)
        j["lora_plan"] = {{"pp", lora_plan->plan.pp},
                          {"dp", lora_plan->plan.dp},
                          {"layers", split_of(lora_plan->plan)},
                          {"predicted_step_s", lora_plan->plan.estimate.step_s},
                          {"measured_step_s", lora_plan->measured_step_s},
                          {"vs_planner_full", lora_plan->samples_per_s / planner.samples_per_s}};
    }
    j["rings_at_once"] = planner.rings_at_once;
    nlohmann::json singles = nlohmann::json::array();
    for (const auto& v : one_ring)
      singles.push_back({{"layout", v.name}, {"measured_step_s", v.measured_step_s}, {"samples_per_s", v.samples_per_s},
                         {"rings_at_once_vs_one", overlapped(v).samples_per_s / v.samples_per_s}});
    j["one_ring_at_a_time"] = singles;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%-12s %-9s %-8s %14s %14s %10s %11s %10s\n", "layout", "PP x DP", "layers", "predicted step",
              "measured step", "meas/pred", "samples/s", "vs all-IB");
  for (const auto& v : variants) {
    char ratio[32] = "-";
    if (ib) std::snprintf(ratio, sizeof ratio, "%.2f", v.samples_per_s / ib->samples_per_s);
    const std::string layout = std::to_string(v.plan.pp) + " x " + std::to_string(v.plan.dp);
    std::printf("%-12s %-9s %-8s %12.1f ms %12.1f ms %10.2f %11.2f %10s\n", v.name.c_str(), layout.c_str(),
                split_of(v.plan).c_str(), v.plan.estimate.step_s * 1e3, v.measured_step_s * 1e3,
                v.measured_step_s / v.plan.estimate.step_s, v.samples_per_s, ratio);
  }
  if (holmes) std::printf("planner vs Holmes rule: %.2fx the samples/s\n", planner.samples_per_s / holmes->samples_per_s);
  if (lora)
    for (const auto& v : variants)
      std::printf("%s training a LoRA adapter (r %d, %s, %lld values) vs the whole model: %.1f ms vs %.1f ms a step, "
                  "%.2fx the samples/s\n",
                  v.name.c_str(), a.lora_rank, lora->config.targets_text().c_str(),
                  static_cast<long long>(adapter_values), v.lora_step_s * 1e3, v.measured_step_s * 1e3,
                  v.lora_samples_per_s / v.samples_per_s);
  if (lora_plan)
    std::printf("the planner's plan for the adapter: PP %d x DP %d (layers %s), predicted %.1f ms, measured %.1f ms a "
                "step, %.2fx the whole model's planner layout's samples/s\n",
                lora_plan->plan.pp, lora_plan->plan.dp, split_of(lora_plan->plan).c_str(),
                lora_plan->plan.estimate.step_s * 1e3, lora_plan->measured_step_s * 1e3,
                lora_plan->samples_per_s / planner.samples_per_s);
  for (const auto& v : one_ring)
    std::printf("%s with %d rings at once vs one at a time (%.1f ms): %.2fx the samples/s\n", v.name.c_str(),
                overlapped(v).rings_at_once, v.measured_step_s * 1e3, overlapped(v).samples_per_s / v.samples_per_s);
  return 0;
}

}  // namespace corolla::app
