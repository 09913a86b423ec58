// corolla bench (apps/bench_common.hpp): the flags and helpers every compute
// bench shares (the model presets, the model a bench runs on, decode's
// bytes per token and bandwidth bound, the per-op profile, the CUDA reports
// of step graphs, GEMM tuning and early launch), and the `bench` command
// with its subcommands; bench train runs in apps/bench_train.cpp (with
// --cluster apps/bench_train_cluster.cpp), bench decode in
// apps/bench_decode.cpp. Each bench prints a human summary and one
// machine-readable JSON line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_common.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/membw.hpp"
#include "kernels/backend.hpp"
#include "kernels/profiling_backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/moe.hpp"
#include "model/transformer.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/bandwidth.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/gemm_tuner.hpp"
#endif

namespace corolla::app {

/// The ~100M-parameter Llama-shaped model the decode target is stated for.
model_config bench_llama_config() {
  model_config c;
  c.arch = architecture::llama;
  c.hf_architecture = "LlamaForCausalLM";
  c.vocab_size = 4096;
  c.hidden_size = 1024;
  c.n_layers = 8;
  c.n_heads = 16;
  c.n_kv_heads = 16;
  c.head_dim = 64;
  c.intermediate_size = 2816;
  c.max_positions = 2048;
  c.norm_eps = 1e-5f;
  c.rope = rope_spec(10000.0);
  c.tie_embeddings = false;
  return c;
}

model_config tiny_random_config(architecture arch, int layers) {
  model_config c;
  c.arch = arch;
  if (arch == architecture::gpt2) {
    c.hf_architecture = "GPT2LMHeadModel";
    c.n_kv_heads = 4;
    c.tie_embeddings = true;
  } else {
    c.hf_architecture = "LlamaForCausalLM";
    c.n_kv_heads = 2;
    c.rope = rope_spec(10000.0);
  }
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.n_layers = layers;
  c.n_heads = 4;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.max_positions = 256;
  c.norm_eps = 1e-5f;
  return c;
}

/// (commands.hpp) Best of 5 rounds (of 10 products on a device, 1 on the
/// cpu) of [rows x k] @ [n x k]^T after a warm-up.
double measure_gemm_flops(Backend& be, std::int64_t rows, std::int64_t k, std::int64_t n, dtype t) {
  Tensor a = be.empty({rows, k}, t), w = be.empty({n, k}, t), y = be.empty({rows, n}, t);
  // Filled on the host and copied (converted): the backend may be a device.
  Tensor fill = Tensor::empty({std::max(rows * k, n * k)});
  std::fill_n(fill.data<float>(), fill.numel(), 0.01f);
  be.copy(fill.slice(0, rows * k).view({rows, k}).to(t), a);
  be.copy(fill.slice(0, n * k).view({n, k}).to(t), w);
  be.gemm(a, false, w, true, y);  // warm-up (algorithm choice on a device)
  be.synchronize();
  // On a device several products per wait, so its wait and launch latency
  // do not count against a product of some 100 us.
  const int calls = be.dev().kind == device_kind::cpu ? 1 : 10;
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) be.gemm(a, false, w, true, y);
    be.synchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, calls * 2.0 * static_cast<double>(rows * k * n) / s);
  }
  return best;
}

namespace {

/// Llama-2-7B's shape (6.7B parameters, 27 GB in f32).
model_config llama7b_config() {
  model_config c = bench_llama_config();
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  c.intermediate_size = 11008;
  c.max_positions = 4096;
  return c;
}

/// GPT-2 XL's shape (1.56B parameters, tied LM head).
model_config gpt2_xl_config() {
  model_config c;
  c.arch = architecture::gpt2;
  c.hf_architecture = "GPT2LMHeadModel";
  c.vocab_size = 50257;
  c.hidden_size = 1600;
  c.n_layers = 48;
  c.n_heads = 25;
  c.n_kv_heads = 25;
  c.head_dim = 64;
  c.intermediate_size = 6400;
  c.max_positions = 1024;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = true;
  return c;
}

/// A Mixtral-shaped mixture of experts at the default model's scale: 8
/// layers of dim 1024, GQA (16 heads, 8 key/value heads), 8 SwiGLU experts
/// of width 1408 with top-2 routing. It holds 302M parameters, of which a
/// token reads about 94M (the attention, the router and its 2 experts),
/// about what the dense default reads (310.5M with the embeddings and head).
model_config moe_config() {
  model_config c = bench_llama_config();
  c.hf_architecture = "MixtralForCausalLM";
  c.n_kv_heads = 8;
  c.intermediate_size = 1408;
  c.n_experts = 8;
  c.experts_per_token = 2;
  c.norm_topk_prob = true;
  c.rope = rope_spec(1e6);
  return c;
}

}  // namespace

void add_common(CLI::App* cmd, bench_common& o, bool with_profile) {
  cmd->add_option("--model", o.model_dir,
                  "HuggingFace model directory (default: a random ~100M-parameter Llama-shaped "
                  "model: dim 1024, 8 layers, vocab 4096)");
  cmd->add_option("--preset", o.preset,
                  "Shape of the random model without --model: small (the ~100M default), moe (a "
                  "Mixtral-shaped mixture of 8 experts, top-2, reading about as much per token as small), "
                  "llama7b (Llama-2-7B, 27 GB in f32) or gpt2-1.5b (GPT-2 XL)")
      ->capture_default_str();
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->add_option("--seed", o.seed, "Seed of the random default model")
      ->check(unsigned_integer())
      ->capture_default_str();
  if (with_profile)
    cmd->add_flag("--profile", o.profile,
                  "After the measurement, run once more with every op synchronised and timed, and print "
                  "where the time goes per op (kernels/profiling_backend.hpp)");
}

/// (bench_common.hpp)
void report_profile(const profiling_backend& prof, const std::string& what, bool json_only, nlohmann::json& j) {
  double total = 0;
  for (const auto& t : prof.totals()) total += t.seconds;
  nlohmann::json rows = nlohmann::json::array();
  if (!json_only) {
    std::printf("profile of %s (each op synchronised: %.1f ms in ops)\n", what.c_str(), total * 1e3);
    std::printf("  %-28s %8s %11s %7s\n", "op", "calls", "ms", "share");
  }
  for (const auto& t : prof.totals()) {
    const double share = total > 0 ? t.seconds / total : 0.0;
    rows.push_back({{"op", t.op}, {"calls", t.calls}, {"ms", t.seconds * 1e3}, {"share", share}});
    if (!json_only)
      std::printf("  %-28s %8lld %11.3f %6.1f%%\n", t.op.c_str(), t.calls, t.seconds * 1e3, 100.0 * share);
  }
  j["profile"] = {{"run", what}, {"total_ms", total * 1e3}, {"ops", rows}};
}

transformer open_model(const bench_common& o, Backend& be) {
  if (!o.model_dir.empty()) return transformer::load(o.model_dir, be);
  if (o.preset == "small") return transformer::init(bench_llama_config(), o.seed, be);
  if (o.preset == "moe") return transformer::init(moe_config(), o.seed, be);
  // The large shapes tile their random draws: drawing billions of values
  // one by one takes minutes and does not change the speed measured.
  if (o.preset == "llama7b") return transformer::init_tiled(llama7b_config(), o.seed, be);
  if (o.preset == "gpt2-1.5b") return transformer::init_tiled(gpt2_xl_config(), o.seed, be);
  throw std::invalid_argument("bench: unknown --preset '" + o.preset +
                              "' (expected small, moe, llama7b or gpt2-1.5b)");
}

/// (bench_common.hpp)
/// Bytes of weights one decode step reads: every block parameter, the final
/// norm and the LM head (one embedding row is negligible). The blocks'
/// linear weights are stored as `weights`, the LM head as
/// head::lm_head_format says (int8 for nf4); norms, biases and a mixture of
/// experts' router and shared expert gate stay f32. A token of a mixture of
/// experts reads only the k experts it is routed to: k / E of the experts'
/// bytes (and all of a shared expert's, which every token goes through).
double decode_bytes_per_token(transformer& m, weight_format weights, bool with_head) {
  const auto& c = m.config();
  const double expert_share = routed_expert_share(c);
  double bytes = 0;
  for (const auto& b : m.blocks())
    for (const auto& e : b.entries()) {
      const bool linear = stored_in_weight_format(e.name, e.shape);
      const double stored = linear ? static_cast<double>(stored_weight_bytes(e.shape[0], e.shape[1], weights))
                                   : 4.0 * static_cast<double>(e.numel);
      bytes += is_routed_expert_param(e.name) ? stored * expert_share : stored;
    }
  if (!with_head) return bytes;
  const weight_format lm_head = is_quantized(weights) ? weight_format::int8 : weights;
  bytes += static_cast<double>(stored_weight_bytes(c.vocab_size, c.hidden_size, lm_head));
  bytes += 2.0 * c.hidden_size * 4.0;  // final norm weight and bias
  return bytes;
}

/// (bench_common.hpp)
bandwidth_result measure_bound_bandwidth(device dev) {
  if (dev.kind == device_kind::cpu) return measure_read_bandwidth(std::size_t{1} << 29, 3);
#ifdef COROLLA_HAVE_CUDA
  cuda::device_bandwidth d = cuda::measure_read_bandwidth(dev.index, std::size_t{2} << 30, 10);
  return {d.read_gbps, d.bytes, 0};
#else
  throw cuda_not_built(dev);
#endif
}

/// (bench_common.hpp)
nlohmann::json step_graph_report() {
#ifdef COROLLA_HAVE_CUDA
  const cuda::step_graph_counts c = cuda::step_graph_totals();
  return {{"launched", c.launched},
          {"updated", c.updated},
          {"instantiated", c.instantiated},
          {"failed", c.failed},
          {"eager", c.eager},
          {"last_failure", c.last_failure}};
#else
  return nlohmann::json::object();
#endif
}

/// (bench_common.hpp)
nlohmann::json report_gemm_tuning(const Backend& be, bool json) {
#ifdef COROLLA_HAVE_CUDA
  const auto* cb = dynamic_cast<const cuda::cuda_backend*>(&be);
  if (cb == nullptr) return nlohmann::json::object();
  const std::vector<cuda::gemm_choice> choices = cb->gemm_choices();
  const cuda::gemm_tuning_totals t = cuda::gemm_tuning_summary(choices);
  // NaN (a candidate that refused) as JSON null.
  const auto number = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
  nlohmann::json problems = nlohmann::json::array();
  for (const cuda::gemm_choice& c : choices) {
    problems.push_back({{"m", c.m},
                        {"n", c.n},
                        {"k", c.k},
                        {"batch", c.batch},
                        {"what", c.what},
                        {"candidates", c.candidates},
                        {"chosen", c.chosen},
                        {"first_us", number(c.first_us)},
                        {"chosen_us", number(c.chosen_us)},
                        {"calls", c.calls},
                        {"from_file", c.from_file}});
    if (!json)
      std::printf("GEMM %5lld x %5lld x %5lld%s %-28s %d of %d  %8.1f us (first %8.1f us) x %llu calls%s\n",
                  static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
                  c.batch > 1 ? (" [" + std::to_string(c.batch) + "]").c_str() : "", c.what.c_str(), c.chosen,
                  c.candidates, c.chosen_us, c.first_us, static_cast<unsigned long long>(c.calls),
                  c.from_file ? " (from COROLLA_CUDA_GEMM_TUNE_FILE)" : "");
  }
  if (!json)
    std::printf("GEMM algorithms         %d problems timed (%d of them read from COROLLA_CUDA_GEMM_TUNE_FILE, "
                "at its writer's times), %d run another than cuBLASLt's first: %.3fx the firsts' time at this "
                "run's calls (COROLLA_CUDA_GEMM_TUNE%s)\n",
                t.problems, t.from_file, t.changed, t.speedup(), cuda::gemm_tuning_requested() ? "" : "=0");
  return {{"problems", t.problems},          {"changed", t.changed},       {"from_file", t.from_file},
          {"first_ms", t.first_us / 1000.0}, {"chosen_ms", t.chosen_us / 1000.0},
          {"speedup", t.speedup()},          {"each", problems}};
#else
  (void)be;
  (void)json;
  return nlohmann::json::object();
#endif
}

/// (bench_common.hpp)
bool launches_early(device dev) {
#ifdef COROLLA_HAVE_CUDA
  return dev.kind == device_kind::cuda && cuda::early_launch_requested() && cuda::early_launch_supported(dev.index);
#else
  (void)dev;
  return false;
#endif
}

void register_bench(CLI::App& app, action_fn& action) {
  auto* bench = app.add_subcommand("bench", "Benchmarks, each against a bound measured in the same run");
  bench->require_subcommand(1);

  register_bench_decode(bench, action);

  static bench_common train_opts;
  static int batch = 4, seq = 64, steps = 3, micro_batch = 1;
  static double grad_clip = 0;
  static int lora_rank = 0;
  static std::string cluster;
  auto* train = bench->add_subcommand(
      "train",
      "Training tokens/s and FLOP/s vs GEMM FLOP/s; with --cluster, an emulated heterogeneous cluster: the "
      "planner's layout vs the Holmes rule, all-Ethernet and all-IB");
  add_common(train, train_opts);
  train->add_option("--batch", batch, "Sequences per step (global batch with --cluster; default there 16)")
      ->check(integer_between(1, 1 << 20))
      ->capture_default_str();
  train->add_option("--seq", seq, "Tokens per sequence (default with --cluster: 128)")
      ->check(integer_between(2, 1 << 24))
      ->capture_default_str();
  train->add_option("--steps", steps, "Timed steps (after one warm-up step)")
      ->check(integer_between(1, 1000000))
      ->capture_default_str();
  train->add_option("--matmul", train_opts.matmul,
                    "Products of f32 tensors on a GPU: f32, tf32 or bf16 (tensor cores, f32 accumulation)")
      ->capture_default_str();
  train->add_option("--compute", train_opts.compute,
                    "dtype the blocks compute in: f32, or bf16/f16 on a GPU (mixed precision, f16 with dynamic "
                    "loss scaling; then f32 compute is measured too, in the same run, and the speed-up printed)")
      ->capture_default_str();
  train->add_option("--loss-scale", train_opts.loss_scale,
                    "auto (dynamic with --compute f16), dynamic or off; dynamic with f32 compute also measures the "
                    "run without it, in the same run, and prints the ratio")
      ->capture_default_str();
  train->add_option("--cluster", cluster,
                    "Cluster TOML: one local rank process per planned worker, links shaped by the file, compute "
                    "emulated by the cost model's times (docs/benchmarks.md)");
  train->add_option("--micro-batch", micro_batch,
                    "Sequences per micro-batch, dividing --batch: in one process gradient accumulation (default: "
                    "the whole batch at once); with --cluster the pipeline's unit (default 1)");
  train->add_option("--grad-clip", grad_clip,
                    "With --cluster: clip gradients to this global L2 norm (0 = none), so every step waits for the "
                    "coordinator's norm and the parameter all-gathers run in the update")
      ->check(finite_at_least(0))
      ->capture_default_str();
  train->add_option("--lora-rank", lora_rank,
                    "With --cluster: also train a LoRA adapter of this rank (q and v) on each layout, its blocks "
                    "the DP buckets, on the same links and modelled compute, and print its step against the whole "
                    "model's (0 = not)")
      ->check(integer_between(0, 65536))
      ->capture_default_str();
  train->callback([&action, train] {
    for (const char* flag : {"--grad-clip", "--lora-rank"})
      if (cluster.empty() && train->count(flag) > 0) {
        action = [flag]() -> int {
          throw std::invalid_argument(std::string("bench train: ") + flag + " applies to --cluster only");
        };
        return;
      }
    if (!cluster.empty()) {
      if (train->count("--compute") > 0 || train->count("--loss-scale") > 0) {
        action = [] () -> int {
          throw std::invalid_argument(
              "bench train --cluster emulates compute by the cost model: --compute and --loss-scale do not apply");
        };
        return;
      }
      cluster_bench_options c;
      c.cluster = cluster;
      c.model = train_opts.model_dir;
      if (train->count("--batch") > 0) c.batch = batch;
      if (train->count("--seq") > 0) c.seq = seq;
      if (train->count("--steps") > 0) c.timed_steps = steps;
      c.micro_batch = micro_batch;
      c.grad_clip = grad_clip;
      c.lora_rank = lora_rank;
      c.json = train_opts.json;
      action = [c] { return run_bench_train_cluster(c); };
      return;
    }
    const int local_micro_batch = train->count("--micro-batch") > 0 ? micro_batch : 0;
    action = [local_micro_batch] { return run_bench_train(train_opts, batch, seq, steps, local_micro_batch); };
  });

  register_bench_gemm(bench, action);
  register_bench_link(bench, action);
  register_bench_interleave(bench, action);
  register_bench_swarm(bench, action);
  register_bench_elastic(bench, action);
  register_bench_api(bench, action);
  register_bench_serve(bench, action);
  register_bench_attention(bench, action);
  register_bench_update(bench, action);
  register_bench_fusions(bench, action);
  register_bench_loss(bench, action);
  register_bench_lora(bench, action);
  register_bench_lora_ranks(bench, action);
  register_bench_lora_serve(bench, action);
}

}  // namespace corolla::app
