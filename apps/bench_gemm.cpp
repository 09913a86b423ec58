// corolla bench gemm — Backend::linear on a model's GEMM shapes next to the
// vendor library's own GEMM of the same shape and dtype, called directly in
// the same run on the same device: OpenBLAS cblas_sgemm on the CPU, cuBLASLt
// on CUDA (kernels/vendor_gemm.hpp). The ratio says how much of what the
// library itself reaches the backend keeps (descriptor setup, heuristic
// cache, launch path, the CPU backend's own threading).
//
// On CUDA the library side runs cuBLASLt's heuristic's first algorithm, as
// a caller of cuBLASLt would; the backend times the heuristic's candidates
// on a problem's first call (kernels/cuda/gemm_tuner.hpp, unless
// COROLLA_CUDA_GEMM_TUNE=0), so there the ratio is the tuner's gain, and
// the tuner's own lines follow the table.
//
// Every product is y[M,N] = x[M,K] @ w[N,K]^T (linear's layout, no bias).
// Both sides are timed the same way: `calls` products queued, then a wait
// for all of them, on the host clock; the best of `rounds` rounds counts.
#include <algorithm>
#include <chrono>
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
#include "kernels/vendor_gemm.hpp"

namespace corolla::app {

Tensor random_tensor_on(Backend& be, shape_t shape, dtype t, std::uint64_t seed) {
  Tensor host = Tensor::empty(shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* p = host.data<float>();
  for (std::int64_t i = 0; i < host.numel(); ++i) p[i] = u(rng);
  Tensor dev = be.empty(std::move(shape), t);
  be.copy(host, dev);
  return dev;
}

namespace {

/// One weight matrix of a model: y[M,N] = x[M,K] @ w[N,K]^T.
struct gemm_shape {
  std::string name;
  std::int64_t n = 0, k = 0;
};

/// A named shape set: the model's distinct linear layers and the row
/// counts they run with (1 = batch-1 decode, many = prefill / training).
struct shape_set {
  std::string name;
  std::vector<gemm_shape> shapes;
  std::vector<std::int64_t> rows;
};

shape_set shapes_for(const std::string& name) {
  // Projections as the model runs them: q, k, v and o are separate [D, D]
  // linears (model/block.cpp), the LM head is [V, D].
  if (name == "llama7b")  // Llama-2-7B: D 4096, MLP 11008, vocab 32000
    return {name,
            {{"q/k/v/o", 4096, 4096}, {"gate/up", 11008, 4096}, {"down", 4096, 11008},
             {"lm_head", 32000, 4096}},
            {1, 2048}};
  if (name == "gpt2-1.5b")  // GPT-2 XL: D 1600, MLP 6400, vocab 50257
    return {name,
            {{"q/k/v/o", 1600, 1600}, {"up", 6400, 1600}, {"down", 1600, 6400},
             {"lm_head", 50257, 1600}},
            {1, 2048}};
  if (name == "tiny")  // seconds on any machine: for tests and smoke runs
    return {name, {{"q/k/v/o", 64, 64}, {"up", 176, 64}, {"down", 64, 176}, {"lm_head", 256, 64}},
            {1, 16}};
  throw std::invalid_argument("bench gemm: unknown --shapes '" + name +
                              "' (expected llama7b, gpt2-1.5b or tiny)");
}

dtype parse_dtype(const std::string& text, device dev) {
  if (text == "auto") return dev.kind == device_kind::cpu ? dtype::f32 : dtype::bf16;
  if (text == "f32") return dtype::f32;
  if (text == "bf16") return dtype::bf16;
  if (text == "f16") return dtype::f16;
  throw std::invalid_argument("bench gemm: unknown --dtype '" + text +
                              "' (expected auto, f32, bf16 or f16)");
}

struct gemm_options {
  std::string device = "auto";
  std::string dtype_name = "auto";
  std::string shapes = "llama7b";
  std::vector<std::int64_t> rows;
  int rounds = 3;
  double round_ms = 25;
  int threads = 0;
  bool json = false;
};

struct backend_timing {
  double seconds = 0;  ///< best round's seconds per product
  int calls = 0;       ///< products per round (used for the vendor side too)
};

/// Times be.linear on [m,k] x [n,k]^T: one warm-up product, batches of
/// products to size the rounds (about `round_ms` each, 1..1000 products),
/// then `rounds` rounds.
backend_timing time_backend_linear(Backend& be, dtype t, std::int64_t m, std::int64_t n,
                                   std::int64_t k, int rounds, double round_ms) {
  Tensor x = random_tensor_on(be, {m, k}, t, 1), w = random_tensor_on(be, {n, k}, t, 2);
  Tensor y = be.empty({m, n}, t);
  using clock = std::chrono::steady_clock;
  auto run = [&](int calls) {
    const auto t0 = clock::now();
    for (int c = 0; c < calls; ++c) be.linear(x, w, nullptr, y);
    be.synchronize();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  run(1);  // warm-up: algorithm choice, scratch, clocks up
  // Size the rounds from a batch of products long enough that one stall
  // (a descheduled thread on a shared machine) does not set the count.
  const double target = round_ms * 1e-3;
  int calls = 1;
  double elapsed = run(calls);
  while (elapsed < target / 4 && calls < 1000) {
    calls = std::min(calls * 4, 1000);
    elapsed = run(calls);
  }
  backend_timing r;
  r.calls = static_cast<int>(std::clamp(calls * target / std::max(elapsed, 1e-9), 1.0, 1000.0));
  for (int round = 0; round < rounds; ++round) {
    const double s = run(r.calls) / r.calls;
    if (round == 0 || s < r.seconds) r.seconds = s;
  }
  return r;
}

int run_gemm(const gemm_options& o) {
  apply_common_options(o.threads, "warn");
  const device dev = parse_device(o.device);
  const dtype t = parse_dtype(o.dtype_name, dev);
  shape_set set = shapes_for(o.shapes);
  if (!o.rows.empty()) set.rows = o.rows;
  for (std::int64_t m : set.rows)
    if (m < 1) throw std::invalid_argument("bench gemm: --rows must be positive");
  if (dev.kind == device_kind::cpu && t != dtype::f32)
    throw std::invalid_argument(std::string("bench gemm: the CPU backend computes in f32; no ") +
                                dtype_name(t) + " GEMM to compare on cpu (use --dtype f32)");
  Backend& be = backend_for(dev);  // a clear error when the device is missing
  const std::string baseline = dev.kind == device_kind::cpu ? "OpenBLAS cblas_sgemm" : "cuBLASLt";
  if (!o.json)
    std::fprintf(stderr,
                 "bench gemm: %s, %s, %s shapes, y[M,N] = x[M,K] @ w[N,K]^T; baseline: %s called "
                 "directly%s\n",
                 be.name().c_str(), dtype_name(t), set.name.c_str(), baseline.c_str(),
                 dev.kind == device_kind::cpu
                     ? (", " + std::to_string(cpu_threads()) + " threads").c_str()
                     : "");

  nlohmann::json results = nlohmann::json::array();
  double backend_total = 0, baseline_total = 0, worst = 0;
  bool first = true;
  if (!o.json)
    std::printf("%-9s %6s %6s %6s  %12s %12s  %8s  %12s\n", "layer", "M", "N", "K",
                "backend", "baseline", "ratio", "weights");
  for (std::int64_t m : set.rows) {
    for (const auto& s : set.shapes) {
      const backend_timing mine = time_backend_linear(be, t, m, s.n, s.k, o.rounds, o.round_ms);
      const vendor_gemm_timing ref =
          time_vendor_linear(dev, t, m, s.n, s.k, mine.calls, o.rounds);
      const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(s.n) *
                           static_cast<double>(s.k);
      const double weight_bytes =
          static_cast<double>(s.n) * static_cast<double>(s.k) * static_cast<double>(dtype_size(t));
      const double ratio = ref.seconds / mine.seconds;
      backend_total += mine.seconds;
      baseline_total += ref.seconds;
      worst = first ? ratio : std::min(worst, ratio);
      first = false;
      results.push_back({{"layer", s.name},
                         {"m", m},
                         {"n", s.n},
                         {"k", s.k},
                         {"calls", mine.calls},
                         {"backend_seconds", mine.seconds},
                         {"baseline_seconds", ref.seconds},
                         {"backend_tflops", flops / mine.seconds / 1e12},
                         {"baseline_tflops", flops / ref.seconds / 1e12},
                         {"backend_weight_gbps", weight_bytes / mine.seconds / 1e9},
                         {"backend_vs_baseline", ratio}});
      if (!o.json)
        std::printf("%-9s %6lld %6lld %6lld  %8.3f TF/s %8.3f TF/s  %7.1f%%  %7.1f GB/s\n",
                    s.name.c_str(), static_cast<long long>(m), static_cast<long long>(s.n),
                    static_cast<long long>(s.k), flops / mine.seconds / 1e12,
                    flops / ref.seconds / 1e12, 100.0 * ratio, weight_bytes / mine.seconds / 1e9);
    }
  }
  // Overall: the time the whole set takes with the library over the time it
  // takes through the backend (shapes weighted by their cost).
  const double overall = baseline_total / backend_total;
  nlohmann::json j = {{"bench", "gemm"},
                      {"device", be.name()},
                      {"dtype", dtype_name(t)},
                      {"shapes", set.name},
                      {"baseline", baseline},
                      {"threads", cpu_threads()},
                      {"results", results},
                      {"backend_vs_baseline", overall},
                      {"backend_vs_baseline_min", worst}};
  if (nlohmann::json tuning = report_gemm_tuning(be, o.json); !tuning.empty()) j["gemm_tuning"] = tuning;
  if (!o.json) {
    std::printf("backend / %s: %.1f%% over the set (time-weighted), %.1f%% at the worst shape\n",
                baseline.c_str(), 100.0 * overall, 100.0 * worst);
    std::printf("(ratio = baseline time / backend time; weights = the backend's weight bytes "
                "read per second, the bound that matters at M = 1)\n");
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_gemm(CLI::App* bench, action_fn& action) {
  static gemm_options o;
  auto* cmd = bench->add_subcommand(
      "gemm",
      "Backend::linear on a model's GEMM shapes vs the vendor library called directly "
      "(OpenBLAS on cpu, cuBLASLt on cuda)");
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", o.dtype_name,
                  "auto (f32 on cpu, bf16 on cuda) | f32 | bf16 | f16 (cpu: f32 only)")
      ->capture_default_str();
  cmd->add_option("--shapes", o.shapes,
                  "llama7b (D 4096, MLP 11008, vocab 32000) | gpt2-1.5b (D 1600, MLP 6400, vocab "
                  "50257) | tiny")
      ->capture_default_str();
  cmd->add_option("--rows", o.rows,
                  "Row counts M to run each shape with (default: 1 and 2048; tiny: 1 and 16)")
      ->delimiter(',');
  cmd->add_option("--rounds", o.rounds, "Timed rounds per shape and side; the best counts")
      ->check(integer_between(1, 1000))
      ->capture_default_str();
  cmd->add_option("--round-ms", o.round_ms,
                  "Target length of a round (sets the products per round, 1..1000)")
      ->check(finite_between(0.01, 10000))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_gemm(o); }; });
}

}  // namespace corolla::app
