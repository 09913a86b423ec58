// corolla bench attention — training attention (Backend::attention with the
// log-sum-exp saved, then attention_backward; causal) on a model's shape,
// once per matmul precision, each next to the rate the backend's GEMM
// reaches at that precision in the same run (on the model's projection
// shape): the bound a fused attention kernel is judged against. On CUDA, f32
// runs the f32 kernels and bf16 the tensor-core ones
// (kernels/cuda/attention_mma.cu); the ratio bf16 / f32 is their speed-up.
// --storage repeats it all with the tensors in bf16 or f16 (CUDA: the
// tensor-core kernels on 16-bit tiles at every precision, where the head
// size takes them). --kernels fa,wmma runs every tensor-core case with each
// of the two kernel families (the register kernels, the default, and the
// WMMA ones: COROLLA_ATTENTION_KERNELS) and prints their ratio.
//
// FLOPs are the causal algorithm's: forward 4 * Dh per visible (query, key)
// pair and head (QK^T and PV), backward 2.5 times that (dV, dP, dS K, dS^T Q
// and the recomputed scores), as flash-attention papers count them.
// Timing: `calls` calls queued then one wait, best of `rounds` rounds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_timing.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"

namespace corolla::app {

namespace {

/// One attention call's geometry: B sequences of T tokens, Hq query heads
/// over Hkv key/value heads of size Dh.
struct attention_case {
  std::string name;
  int batch = 0, seq = 0, hq = 0, hkv = 0, dh = 0;
};

attention_case case_for(const std::string& name) {
  if (name == "gpt2-1.5b") return {name, 4, 1024, 25, 25, 64};  // bench train's step: B 4, T 1024
  if (name == "llama7b") return {name, 1, 4096, 32, 32, 128};
  if (name == "tiny") return {name, 2, 64, 4, 2, 32};  // seconds on any machine: tests and smoke runs
  throw std::invalid_argument("bench attention: unknown --shape '" + name + "' (expected gpt2-1.5b, llama7b or tiny)");
}

struct attention_options {
  std::string device = "auto";
  std::string shape = "gpt2-1.5b";
  std::string precisions;  ///< "" = f32 and bf16 on a GPU, f32 on the cpu
  std::string storage = "f32";  ///< tensor dtypes to run (f32, bf16, f16)
  std::string kernels = "fa";   ///< tensor-core kernel families to run (fa, wmma)
  int rounds = 3;
  int calls = 3;
  int threads = 0;
  bool json = false;
};

int run_attention(const attention_options& o) {
  apply_common_options(o.threads, "warn");
  const attention_case c = case_for(o.shape);
  if (o.rounds < 1 || o.calls < 1) throw std::invalid_argument("bench attention: need --rounds >= 1 and --calls >= 1");
  const device dev = parse_device(o.device);
  std::vector<matmul_precision> precisions;
  for (const std::string& p : split_list(o.precisions.empty() ? (dev.kind == device_kind::cpu ? "f32" : "f32,bf16")
                                                              : o.precisions))
    precisions.push_back(parse_matmul_precision(p));
  if (dev.kind == device_kind::cpu)
    for (matmul_precision p : precisions)
      if (p != matmul_precision::f32)
        throw std::invalid_argument(std::string("bench attention: the CPU backend computes in f32; no ") +
                                    matmul_precision_name(p) + " attention on cpu (use --precisions f32)");
  std::vector<dtype> storages;
  for (const std::string& t : split_list(o.storage)) {
    if (t == "f32")
      storages.push_back(dtype::f32);
    else if (t == "bf16")
      storages.push_back(dtype::bf16);
    else if (t == "f16")
      storages.push_back(dtype::f16);
    else
      throw std::invalid_argument("bench attention: unknown --storage '" + t + "' (expected f32, bf16 or f16)");
    if (dev.kind == device_kind::cpu && storages.back() != dtype::f32)
      throw std::invalid_argument("bench attention: the CPU backend keeps tensors in f32; no " + t +
                                  " storage on cpu (use --storage f32)");
  }
  if (storages.empty()) throw std::invalid_argument("bench attention: --storage must not be empty");
  const std::vector<std::string> families = split_list(o.kernels);
  for (const std::string& f : families)
    if (f != "fa" && f != "wmma")
      throw std::invalid_argument("bench attention: unknown --kernels '" + f + "' (expected fa or wmma)");
  if (families.empty()) throw std::invalid_argument("bench attention: --kernels must not be empty");
  if (dev.kind == device_kind::cpu && families != std::vector<std::string>{"fa"})
    throw std::invalid_argument("bench attention: --kernels chooses CUDA tensor-core kernels; the cpu has none");
  // The caller's choice comes back after the run.
  const char* env = std::getenv("COROLLA_ATTENTION_KERNELS");
  const std::string saved = env ? env : "";
  Backend& be = backend_for(dev);

  const attention_shape s{c.hq, c.hkv, c.dh, 0.0f};
  const std::int64_t rows = std::int64_t{c.batch} * c.seq;
  const std::int64_t qw = std::int64_t{c.hq} * c.dh, kw = std::int64_t{c.hkv} * c.dh;
  Tensor lse = be.empty({std::int64_t{c.batch} * c.hq * c.seq});
  const double pairs = static_cast<double>(c.batch) * c.hq * (static_cast<double>(c.seq) * (c.seq + 1) / 2);
  const double fwd_flops = 4.0 * c.dh * pairs, bwd_flops = 2.5 * fwd_flops;
  if (!o.json)
    std::fprintf(stderr, "bench attention: %s, %s: B=%d T=%d, %d query / %d key-value heads of %d; measuring...\n",
                 be.name().c_str(), c.name.c_str(), c.batch, c.seq, c.hq, c.hkv, c.dh);

  nlohmann::json results = nlohmann::json::array();
  std::vector<double> totals;
  std::vector<float> first_out;
  if (!o.json)
    std::printf("%-7s %-9s %-7s %11s %9s %11s %9s %12s %10s %8s\n", "storage", "precision", "kernels", "forward ms",
                "TFLOP/s", "backward ms", "TFLOP/s", "GEMM TFLOP/s", "vs GEMM", "out diff");
  nlohmann::json ratios = nlohmann::json::array();
  for (const dtype st : storages) {
    // The same values in every storage (rounded to it): outputs compare across runs.
    Tensor q = random_tensor_on(be, {rows, qw}, st, 1), k = random_tensor_on(be, {rows, kw}, st, 2),
           v = random_tensor_on(be, {rows, kw}, st, 3), dout = random_tensor_on(be, {rows, qw}, st, 4);
    Tensor out = be.empty({rows, qw}, st);
    Tensor dq = be.empty({rows, qw}, st), dk = be.empty({rows, kw}, st), dv = be.empty({rows, kw}, st);
    for (matmul_precision p : precisions) {
      // Only the tensor-core cases (a 16-bit storage, or bf16 products) have
      // a kernel family to choose; the others run once.
      const bool tensor_cores = dev.kind != device_kind::cpu && (st != dtype::f32 || p == matmul_precision::bf16);
      double fa_total = 0, wmma_total = 0;
      for (const std::string& family : tensor_cores ? families : std::vector<std::string>{"-"}) {
        if (family != "-") setenv("COROLLA_ATTENTION_KERNELS", family.c_str(), 1);
        set_matmul_precision(p);
        const double fwd =
            best_seconds(be, o.rounds, o.calls, [&] { be.attention(q, k, v, c.batch, c.seq, s, out, &lse); });
        const double bwd = best_seconds(be, o.rounds, o.calls, [&] {
          be.attention_backward(q, k, v, out, lse, dout, c.batch, c.seq, s, dq, dk, dv);
        });
        // The bound: the backend's products at this precision on the model's
        // up-projection shape ([B*T, Hq*Dh] @ [4*Hq*Dh, Hq*Dh]^T).
        const double gemm = measure_gemm_flops(be, rows, qw, 4 * qw);
        const double rate = (fwd_flops + bwd_flops) / (fwd + bwd);
        // How far this run's output is from the first run's (f32 storage and
        // precision by default).
        be.attention(q, k, v, c.batch, c.seq, s, out, &lse);
        Tensor host = Tensor::empty(out.shape());  // f32: copy converts
        be.copy(out, host);
        const std::vector<float> now = host.to_vector();
        double diff = 0;
        if (first_out.empty())
          first_out = now;
        else
          for (std::size_t i = 0; i < now.size(); ++i)
            diff = std::max(diff, static_cast<double>(std::abs(now[i] - first_out[i])));
        totals.push_back(fwd + bwd);
        (family == "wmma" ? wmma_total : fa_total) = fwd + bwd;
        results.push_back({{"storage", dtype_name(st)},
                           {"precision", matmul_precision_name(p)},
                           {"kernels", family},
                           {"forward_ms", fwd * 1e3},
                           {"backward_ms", bwd * 1e3},
                           {"forward_tflops", fwd_flops / fwd / 1e12},
                           {"backward_tflops", bwd_flops / bwd / 1e12},
                           {"gemm_tflops", gemm / 1e12},
                           {"attention_vs_gemm", rate / gemm},
                           {"max_out_diff_vs_first", diff}});
        if (!o.json)
          std::printf("%-7s %-9s %-7s %11.3f %9.2f %11.3f %9.2f %12.2f %9.1f%% %8.1e\n", dtype_name(st),
                      matmul_precision_name(p), family.c_str(), fwd * 1e3, fwd_flops / fwd / 1e12, bwd * 1e3,
                      bwd_flops / bwd / 1e12, gemm / 1e12, 100.0 * rate / gemm, diff);
      }
      if (fa_total > 0 && wmma_total > 0)
        ratios.push_back({{"storage", dtype_name(st)},
                          {"precision", matmul_precision_name(p)},
                          {"fa_vs_wmma", wmma_total / fa_total}});
    }
  }
  if (saved.empty())
    unsetenv("COROLLA_ATTENTION_KERNELS");
  else
    setenv("COROLLA_ATTENTION_KERNELS", saved.c_str(), 1);
  set_matmul_precision(matmul_precision::f32);
  nlohmann::json j = {{"bench", "attention"},
                      {"device", be.name()},
                      {"shape", c.name},
                      {"batch", c.batch},
                      {"seq", c.seq},
                      {"heads", c.hq},
                      {"kv_heads", c.hkv},
                      {"head_dim", c.dh},
                      {"threads", cpu_threads()},
                      {"results", results}};
  if (!ratios.empty()) {
    j["fa_vs_wmma"] = ratios;
    if (!o.json)
      for (const auto& r : ratios)
        std::printf("%s storage, %s products: register kernels %.2fx the WMMA ones (forward + backward)\n",
                    r["storage"].get<std::string>().c_str(), r["precision"].get<std::string>().c_str(),
                    r["fa_vs_wmma"].get<double>());
  }
  if (totals.size() > 1) {
    j["speedup_last_vs_first"] = totals.front() / totals.back();
    if (!o.json)
      std::printf("last / first run: %.2fx (forward + backward)\n", totals.front() / totals.back());
  }
  if (!o.json)
    std::printf("(vs GEMM = attention FLOP/s over the backend's GEMM FLOP/s at the same precision on "
                "[%lld x %lld] @ [%lld x %lld]^T)\n",
                static_cast<long long>(rows), static_cast<long long>(qw), static_cast<long long>(4 * qw),
                static_cast<long long>(qw));
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_attention(CLI::App* bench, action_fn& action) {
  static attention_options o;
  auto* cmd = bench->add_subcommand(
      "attention",
      "Training attention (forward + backward) per matmul precision vs the GEMM rate at that precision");
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--shape", o.shape,
                  "gpt2-1.5b (B 4, T 1024, 25 heads of 64) | llama7b (B 1, T 4096, 32 heads of 128) | tiny")
      ->capture_default_str();
  cmd->add_option("--precisions", o.precisions,
                  "Comma-separated matmul precisions to run (f32, tf32, bf16); default f32,bf16 on a GPU, f32 on cpu")
      ->check(non_empty());
  cmd->add_option("--storage", o.storage,
                  "Comma-separated tensor dtypes to run (f32, bf16, f16; 16-bit on cuda only), each at every precision")
      ->capture_default_str();
  cmd->add_option("--kernels", o.kernels,
                  "Comma-separated tensor-core kernel families to run (fa: registers, the default; wmma), cuda only")
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Timed rounds; the best counts")->capture_default_str();
  cmd->add_option("--calls", o.calls, "Calls per round")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_attention(o); }; });
}

}  // namespace corolla::app
