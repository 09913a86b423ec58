// corolla bench decode — batch-1 decode and prefill tokens/s against the
// memory-bandwidth bound measured on this machine in the same run: every
// weight is read once per generated token (4 bytes in f32, 2 in bf16, 1 in
// int8 plus a scale per row, half a byte in nf4 plus an absmax per 64); the
// bandwidth is the host's (apps/membw.hpp) on cpu, the device's HBM on cuda
// (kernels/cuda/bandwidth.hpp). With --weights other than f32 (or a 16-bit
// KV cache) the all-f32 generator is measured too, and with int8 or nf4 the
// bf16 one as well, alternating in the same run. Prints a human summary
// and one machine-readable JSON line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_common.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#include "model/block.hpp"
#include "model/generator.hpp"
#include "model/moe.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/linear_bf16.hpp"
#endif

namespace corolla::app {
namespace {

void use_early_launch(bool on) {
#ifdef COROLLA_HAVE_CUDA
  cuda::set_early_launch(on);
#else
  (void)on;
#endif
}

/// Whether decode steps are submitted as CUDA graphs now (device.hpp's step
/// graphs); false without CUDA.
bool step_graphs_on() {
#ifdef COROLLA_HAVE_CUDA
  return cuda::step_graphs_requested();
#else
  return false;
#endif
}

void use_step_graphs(bool on) {
#ifdef COROLLA_HAVE_CUDA
  cuda::set_step_graphs(on);
#else
  (void)on;
#endif
}


/// The batch-1 GEMV variants the CUDA backend chose per weight shape, with
/// every variant's time (kernels/cuda/linear_bf16.hpp); printed unless
/// `json`, returned for the JSON line. Empty on the cpu.
nlohmann::json report_gemv_choices(bool json) {
  nlohmann::json out = nlohmann::json::array();
#ifdef COROLLA_HAVE_CUDA
  const std::vector<std::string> names = cuda::gemv_variant_names();
  for (const cuda::gemv_choice& c : cuda::gemv_choices()) {
    nlohmann::json us = nlohmann::json::object();
    for (std::size_t i = 0; i < c.microseconds.size(); ++i)  // variants not timed for these rows left out
      if (!std::isnan(c.microseconds[i])) us[names[i]] = c.microseconds[i];
    const std::string& name = names[static_cast<std::size_t>(c.chosen)];
    out.push_back({{"in", c.in}, {"out", c.out}, {"rows", c.rows}, {"chosen", name}, {"microseconds", us}});
    if (json) continue;
    if (c.microseconds.empty())
      std::printf("GEMV %6lld -> %6lld x%-3lld %s (not timed)\n", static_cast<long long>(c.in),
                  static_cast<long long>(c.out), static_cast<long long>(c.rows), name.c_str());
    else
      std::printf("GEMV %6lld -> %6lld x%-3lld %s %.1f us (default %s %.1f us)\n", static_cast<long long>(c.in),
                  static_cast<long long>(c.out), static_cast<long long>(c.rows), name.c_str(),
                  c.microseconds[static_cast<std::size_t>(c.chosen)], names[0].c_str(), c.microseconds[0]);
  }
#else
  (void)json;
#endif
  return out;
}


/// One generator measured in the run, with its best figures.
struct measured {
  std::string name;  ///< "f32", "bf16" (baselines) or the measured one
  weight_format weights;
  std::optional<generator> gen;
  double decode = 0, prefill = 0;
};

int run_decode(const bench_common& o, int prompt_tokens, int new_tokens, int repeats,
               const std::string& weights_flag, const std::string& kv_flag) {
  apply_common_options(o.threads, "warn");
  const weight_format weights = parse_weights_flag(weights_flag);
  const dtype kv = parse_kv_dtype_flag(kv_flag);
  Backend& device_be = backend_for(parse_device(o.device));
  profiling_backend prof(device_be);  // forwards only, until enabled after the measurement
  Backend& be = o.profile ? static_cast<Backend&>(prof) : device_be;
  transformer model = open_model(o, be);
  const auto& c = model.config();
  if (prompt_tokens < 1 || new_tokens < 2 || prompt_tokens + new_tokens > c.max_positions)
    throw std::invalid_argument("bench decode: need --prompt-tokens >= 1, --new-tokens >= 2 and "
                                "their sum within the context of " +
                                std::to_string(c.max_positions));
  if (!o.json)
    std::fprintf(stderr, "bench decode: %s, %.1fM parameters, %d threads; measuring...\n",
                 c.hf_architecture.c_str(), static_cast<double>(c.parameter_count()) / 1e6,
                 cpu_threads());

  std::mt19937_64 rng(o.seed + 1);
  std::uniform_int_distribution<int> pick(0, c.vocab_size - 1);
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_tokens));
  for (auto& t : prompt) t = pick(rng);

  // The generator measured, then its baselines: the all-f32 one whenever the
  // weights or the KV cache are not f32, and bf16 weights (f32 KV) for the
  // quantised formats. They alternate, so drift hits all alike.
  std::vector<measured> runs;
  runs.push_back({weight_format_name(weights), weights, std::nullopt});
  runs.back().gen.emplace(model, 0, weights, kv);
  if (weights != weight_format::f32 || kv != dtype::f32) {
    runs.push_back({"f32", weight_format::f32, std::nullopt});
    runs.back().gen.emplace(model, 0, weight_format::f32, dtype::f32);
  }
  if (is_quantized(weights)) {
    runs.push_back({"bf16", weight_format::bf16, std::nullopt});
    runs.back().gen.emplace(model, 0, weight_format::bf16, dtype::f32);
  }
  generation_params p;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  const auto warm_prompt = std::span(prompt).first(std::min<std::size_t>(prompt.size(), 8));
  for (measured& m : runs) m.gen->generate(warm_prompt, p);  // warm-up

  // Bandwidth drifts on shared machines: measure it between the runs and
  // compare the best decode with the best bandwidth seen.
  bandwidth_result bw;
  const bool early = launches_early(be.dev());
  double serial_decode = 0, serial_prefill = 0;  // early launch off
  // On a GPU the measured generator also runs with step graphs the other
  // way (on where they are off by default), alternating in the same run.
  const bool graphs_default = step_graphs_on(), on_gpu = be.dev().kind == device_kind::cuda;
  double flipped_decode = 0, flipped_prefill = 0;  // step graphs the other way
  auto run_once = [&](generator& g, double& decode, double& prefill) {
    generation_result res = g.generate(prompt, p);
    if (res.decode_seconds > 0) decode = std::max(decode, res.decode_steps / res.decode_seconds);
    if (res.prefill_seconds > 0)
      prefill = std::max(prefill, res.prompt_tokens / res.prefill_seconds);
  };
  for (int r = 0; r < repeats; ++r) {
    bandwidth_result b = measure_bound_bandwidth(be.dev());
    if (b.read_gbps > bw.read_gbps) bw = b;
    run_once(*runs[0].gen, runs[0].decode, runs[0].prefill);
    if (early) {
      use_early_launch(false);
      run_once(*runs[0].gen, serial_decode, serial_prefill);
      use_early_launch(true);
    }
    if (on_gpu) {
      use_step_graphs(!graphs_default);
      run_once(*runs[0].gen, flipped_decode, flipped_prefill);
      use_step_graphs(graphs_default);
    }
    for (std::size_t i = 1; i < runs.size(); ++i) run_once(*runs[i].gen, runs[i].decode, runs[i].prefill);
  }

  const double best_decode = runs[0].decode, best_prefill = runs[0].prefill;
  double bytes = decode_bytes_per_token(model, weights);
  double bound = bw.read_gbps * 1e9 / bytes;
  double ratio = best_decode / bound;
  const bool on_host = be.dev().kind == device_kind::cpu;
  nlohmann::json j = {{"bench", "decode"},
                      {"device", be.name()},
                      {"weights", weight_format_name(weights)},
                      {"kv_dtype", dtype_name(kv)},
                      {"bandwidth_source", on_host ? "host read sweep" : "device read sweep"},
                      {"threads", cpu_threads()},
                      {"cpu_decode_isa", cpu::isa_name(cpu::decode_isa())},
                      {"params", c.parameter_count()},
                      {"weight_bytes_per_token", bytes},
                      {"prompt_tokens", prompt_tokens},
                      {"new_tokens", new_tokens},
                      {"decode_tokens_per_s", best_decode},
                      {"prefill_tokens_per_s", best_prefill},
                      {"read_bandwidth_gbps", bw.read_gbps},
                      {"bandwidth_bound_tokens_per_s", bound},
                      {"decode_vs_bound", ratio}};
  if (o.profile) {
    prof.enable(true);
    runs[0].gen->generate(std::span(prompt).first(1), p);
    prof.enable(false);
  }
  j["early_launch"] = early;
  if (early) {
    j["serialised_decode_tokens_per_s"] = serial_decode;
    j["decode_vs_serialised"] = serial_decode > 0 ? best_decode / serial_decode : 0.0;
  }
  const double graph_decode = graphs_default ? best_decode : flipped_decode;
  const double launch_decode = graphs_default ? flipped_decode : best_decode;
  j["step_graphs"] = graphs_default;
  if (on_gpu) {
    j["graph_decode_tokens_per_s"] = graph_decode;
    j["launch_decode_tokens_per_s"] = launch_decode;
    j["graphs_vs_launches"] = launch_decode > 0 ? graph_decode / launch_decode : 0.0;
    j["graph_decode_vs_bound"] = graph_decode / bound;
    j["step_graph_counts"] = step_graph_report();
  }
  for (std::size_t i = 1; i < runs.size(); ++i) {
    const measured& b = runs[i];
    j[b.name + "_weight_bytes_per_token"] = decode_bytes_per_token(model, b.weights);
    j[b.name + "_decode_tokens_per_s"] = b.decode;
    j[b.name + "_prefill_tokens_per_s"] = b.prefill;
    j["decode_vs_" + b.name] = b.decode > 0 ? best_decode / b.decode : 0.0;
  }
  if (!o.json) {
    if (on_host)
      std::printf("memory read bandwidth   %8.2f GB/s (%d threads, %.0f MiB swept)\n",
                  bw.read_gbps, bw.threads, static_cast<double>(bw.bytes) / (1 << 20));
    else
      std::printf("device read bandwidth   %8.2f GB/s (%s, %.0f MiB swept, best of 10 per run)\n",
                  bw.read_gbps, be.name().c_str(), static_cast<double>(bw.bytes) / (1 << 20));
    std::printf("weights per token       %8.1f MB (%s linear weights)\n", bytes / 1e6,
                weight_format_name(weights));
    if (on_host && weights != weight_format::f32)
      std::printf("%-4s CPU kernels        %8s (COROLLA_CPU_ISA=avx2 for the build's AVX2)\n",
                  weight_format_name(weights), cpu::isa_name(cpu::decode_isa()));
    std::printf("bandwidth bound         %8.2f tokens/s\n", bound);
    std::printf("decode (batch 1)        %8.2f tokens/s  = %.1f%% of the bound\n", best_decode,
                100.0 * ratio);
    std::printf("prefill (%d tokens)    %8.1f tokens/s\n", prompt_tokens, best_prefill);
    if (early)
      std::printf("early launch off        %8.2f tokens/s  (same run, alternating: early launch %.2fx)\n",
                  serial_decode, serial_decode > 0 ? best_decode / serial_decode : 0.0);
    if (on_gpu)
      std::printf("step graphs %-3s         %8.2f tokens/s  (same run, alternating: graphs / launches %.2fx; "
                  "graphs %.1f%% of the bound)\n",
                  graphs_default ? "off" : "on", flipped_decode, launch_decode > 0 ? graph_decode / launch_decode : 0.0,
                  100.0 * graph_decode / bound);
    for (std::size_t i = 1; i < runs.size(); ++i) {
      const measured& b = runs[i];
      std::printf("%-4s baseline decode    %8.2f tokens/s  (same run, alternating)\n", b.name.c_str(), b.decode);
      std::printf("%-4s baseline prefill   %8.1f tokens/s\n", b.name.c_str(), b.prefill);
      std::printf("%s weights, %s KV / %s decode %6.2fx\n", weight_format_name(weights), dtype_name(kv),
                  b.name.c_str(), b.decode > 0 ? best_decode / b.decode : 0.0);
    }
  }
  if (nlohmann::json gemv = report_gemv_choices(o.json); !gemv.empty()) j["gemv"] = gemv;
  if (o.profile)
    report_profile(prof, "one generation: a 1-token prompt and " + std::to_string(new_tokens) + " new tokens", o.json,
                   j);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_decode(CLI::App* bench, action_fn& action) {
  static bench_common decode_opts;
  static int prompt_tokens = 128, new_tokens = 64, repeats = 5;
  auto* decode = bench->add_subcommand("decode", "Batch-1 decode and prefill tokens/s vs memory bandwidth");
  add_common(decode, decode_opts);
  decode->add_option("--prompt-tokens", prompt_tokens, "Prompt length (prefill)")
      ->check(integer_between(1, 1 << 20))
      ->capture_default_str();
  decode->add_option("--new-tokens", new_tokens, "Tokens generated per run")
      ->check(integer_between(1, 1 << 20))
      ->capture_default_str();
  decode->add_option("--repeats", repeats, "Runs; the best is reported")
      ->check(integer_between(1, 1000))
      ->capture_default_str();
  static std::string weights = "f32";
  decode->add_option("--weights", weights,
                     "Linear weights decode reads: f32, bf16, int8 or nf4 (then f32 is measured too, in the same run, "
                     "and for int8 and nf4 bf16 as well, and the ratios printed)")
      ->capture_default_str();
  static std::string kv_dtype = "f32";
  decode->add_option("--kv-dtype", kv_dtype,
                     "KV cache elements: f32, or bf16/f16 (then the all-f32 generator is measured too, in the same "
                     "run)")
      ->capture_default_str();
  decode->callback([&action] {
    action = [] { return run_decode(decode_opts, prompt_tokens, new_tokens, repeats, weights, kv_dtype); };
  });

}

}  // namespace corolla::app
