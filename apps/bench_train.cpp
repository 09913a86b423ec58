// corolla bench train without --cluster (with it: apps/bench_train_cluster.cpp) —
// training tokens/s and achieved FLOP/s against the GEMM FLOP/s this backend
// reaches on the model's own MLP shape, and against the device's peak (the
// vendor GEMM at a large square shape: OpenBLAS f32 on cpu, cuBLASLt bf16 on
// cuda), the model-FLOPs utilisation; with a 16-bit compute dtype against
// f32 compute, with loss scaling in f32 against none, and with gradient
// accumulation against its micro-batch alone, each in the same run. A human
// summary and one machine-readable JSON line.
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench_common.hpp"
#include "apps/commands.hpp"
#include "kernels/backend.hpp"
#include "kernels/profiling_backend.hpp"
#include "kernels/vendor_gemm.hpp"
#include "model/config.hpp"
#include "model/moe.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/attention_mma.hpp"
#endif

namespace corolla::app {

namespace {

/// The tensor-core training attention's kernel family on `dev` ("fa", the
/// register kernels, or "wmma"; COROLLA_ATTENTION_KERNELS), "" on the cpu.
std::string attention_kernels_on(device dev) {
  if (dev.kind == device_kind::cpu) return "";
#ifdef COROLLA_HAVE_CUDA
  return cuda::mma_attention_kernels_in_use() == cuda::mma_attention_kernels::fa ? "fa" : "wmma";
#else
  throw cuda_not_built(dev);
#endif
}

/// Parameters in the linear layers of the blocks (what GEMMs touch per
/// token): of a mixture of experts, the router and the k of E experts each
/// token is routed to.
long long block_matrix_params(transformer& m) {
  long long n = 0, experts = 0;
  for (const auto& b : m.blocks())
    for (const auto& e : b.entries())
      if (e.shape.size() == 2) (is_routed_expert_param(e.name) ? experts : n) += e.numel;
  return n + std::llround(static_cast<double>(experts) * routed_expert_share(m.config()));
}

}  // namespace

int run_bench_train(const bench_common& o, int batch, int seq, int steps, int micro_batch) {
  apply_common_options(o.threads, "warn");
  const matmul_precision matmul = parse_matmul_precision(o.matmul);
  set_matmul_precision(matmul);
  Backend& device_be = backend_for(parse_device(o.device));
  // The report names the precision: a CPU run computes f32 products whatever --matmul says.
  if (device_be.dev().kind == device_kind::cpu && matmul != matmul_precision::f32)
    throw std::invalid_argument(std::string("bench train: the CPU backend computes in f32; --matmul ") +
                                matmul_precision_name(matmul) + " is for GPUs (use --matmul f32)");
  const dtype compute = parse_compute_flag(o.compute, device_be.dev());
  const loss_scaling scaling = parse_loss_scaling(o.loss_scale, compute == dtype::f16);
  profiling_backend prof(device_be);  // forwards only, until enabled after the measurement
  Backend& be = o.profile ? static_cast<Backend&>(prof) : device_be;
  check_micro_batch(batch, micro_batch);  // before a large model is built
  transformer model = open_model(o, be);
  const auto& c = model.config();
  if (seq > c.max_positions)
    throw std::invalid_argument("bench train: --seq " + std::to_string(seq) + " exceeds the model's context of " +
                                std::to_string(c.max_positions) + " tokens");
  if (!o.json)
    std::fprintf(stderr, "bench train: %s, %.1fM parameters, B=%d%s, T=%d, %d threads; measuring...\n",
                 c.hf_architecture.c_str(), static_cast<double>(c.parameter_count()) / 1e6, batch,
                 micro_batch > 0 ? (" (micro-batches of " + std::to_string(micro_batch) + ")").c_str() : "", seq,
                 cpu_threads());

  std::mt19937_64 rng(o.seed + 2);
  std::uniform_int_distribution<int> pick(0, c.vocab_size - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * seq * (steps + 2) + 1);
  for (auto& t : tokens) t = pick(rng);
  token_dataset data = token_dataset::from_tokens(std::move(tokens), c.vocab_size, "bench tokens");

  train_options opts;
  opts.batch = batch;
  opts.micro_batch = micro_batch;
  opts.seq = seq;
  // Warm-up and timed steps per compute dtype measured, and the profile's.
  // A baseline is measured in the same run: f32 compute for a 16-bit dtype,
  // else the run without loss scaling when it scales.
  const bool compute_baseline = compute != dtype::f32;
  const bool scaling_baseline = !compute_baseline && scaling.dynamic;
  opts.steps = (compute_baseline || scaling_baseline ? 2 : 1) * (steps + 1) + (o.profile ? 1 : 0);
  opts.optimizer.adamw.lr = 1e-4f;
  trainer t(model, data, opts);
  // Warm-up step each (first touch of gradients, moments and activations),
  // then the timed ones. Loss scaling (f16's default) costs one more pass
  // over the gradients, the norm (unscaling rides in AdamW's pass); a timed
  // step skipped for overflow runs no AdamW, so those are counted and
  // reported.
  // One warm-up step of `tr`, then the timed ones: their seconds, and in
  // `skips` (if given) how many were skipped for overflow.
  const auto time_steps = [&](trainer& tr, int* skips) {
    tr.step();
    double total = 0;
    for (int i = 0; i < steps; ++i) {
      const step_report r = tr.step();
      total += r.seconds;
      if (skips != nullptr && r.skipped) ++*skips;
    }
    return total;
  };
  int skipped = 0;
  auto timed_steps = [&](dtype in, const loss_scaling& s, bool main) {
    model.set_compute_dtype(in);
    t.set_loss_scaling(s);
    return time_steps(t, main ? &skipped : nullptr);
  };
  const double base_seconds =
      compute_baseline || scaling_baseline ? timed_steps(dtype::f32, loss_scaling{}, false) : 0.0;
  const double seconds = timed_steps(compute, scaling, true);
  // Gradient accumulation against its micro-batch alone (the batch that
  // fits without it), in the same run: the same forward and backward of M
  // sequences, but an optimiser step for each. Its trainer holds AdamW
  // moments of its own while it runs.
  const bool accumulating = micro_batch > 0 && micro_batch < batch;
  double alone_seconds = 0.0;
  int alone_skipped = 0;  // f16's overflowed steps: no AdamW, so faster
  if (accumulating) {
    train_options alone = opts;
    alone.batch = micro_batch;
    alone.micro_batch = 0;
    alone.steps = steps + 1;
    trainer a(model, data, alone);  // the model computes in `compute` already (timed_steps)
    a.set_loss_scaling(scaling);
    alone_seconds = time_steps(a, &alone_skipped);
  }

  double tokens_per_s = static_cast<double>(batch) * seq * steps / seconds;
  long long matrix_params = block_matrix_params(model) +
                            static_cast<long long>(c.vocab_size) * c.hidden_size;
  double flops_per_token = 6.0 * static_cast<double>(matrix_params) +
                           6.0 * c.n_layers * static_cast<double>(seq) * c.n_heads * c.head_dim;
  double achieved = tokens_per_s * flops_per_token;
  // The products' own bound: the model's MLP shape in the compute dtype
  // (16-bit tensors with --compute bf16|f16, else f32 at --matmul's precision).
  // Its rows are a forward's: a micro-batch's with gradient accumulation.
  const int rows_batch = micro_batch > 0 ? micro_batch : batch;
  double gemm_peak = measure_gemm_flops(be, static_cast<std::int64_t>(rows_batch) * seq,
                                        c.hidden_size, c.intermediate_size, compute);
  double ratio = achieved / gemm_peak;
  // The device's peak: the vendor GEMM at a large square shape, in the
  // dtype its peak is quoted for (f32 on the CPU, bf16 on CUDA).
  const bool on_host = be.dev().kind == device_kind::cpu;
  const std::int64_t peak_side = on_host ? 2048 : 8192;
  const dtype peak_dtype = on_host ? dtype::f32 : dtype::bf16;
  const vendor_gemm_timing peak_time =
      time_vendor_linear(be.dev(), peak_dtype, peak_side, peak_side, peak_side, on_host ? 1 : 20, 3);
  const double peak = 2.0 * static_cast<double>(peak_side) * peak_side * peak_side / peak_time.seconds;
  const double mfu = achieved / peak;
  nlohmann::json j = {{"bench", "train"},
                      {"device", be.name()},
                      {"matmul", matmul_precision_name(get_matmul_precision())},
                      {"compute", dtype_name(compute)},
                      {"threads", cpu_threads()},
                      {"params", c.parameter_count()},
                      {"batch", batch},
                      {"micro_batch", rows_batch},
                      {"seq", seq},
                      {"steps", steps},
                      {"tokens_per_s", tokens_per_s},
                      {"step_seconds", seconds / steps},
                      {"achieved_gflops", achieved / 1e9},
                      {"gemm_gflops", gemm_peak / 1e9},
                      {"achieved_vs_gemm", ratio},
                      {"peak_gflops", peak / 1e9},
                      {"peak_source", peak_time.library + " " + dtype_name(peak_dtype) + " " +
                                          std::to_string(peak_side) + "^3"},
                      {"mfu", mfu}};
  if (t.scaler().dynamic()) j["skipped_steps"] = skipped;
  // Which tensor-core attention kernels ran (a 16-bit compute dtype or
  // bf16 products take them), so a figure says what produced it.
  if (const std::string family = attention_kernels_on(be.dev()); !family.empty()) j["attention_kernels"] = family;
  if (!o.json) {
    std::printf("training                %8.1f tokens/s (%.2f s per step of %d tokens)\n",
                tokens_per_s, seconds / steps, batch * seq);
    std::printf("achieved                %8.2f GFLOP/s (6N + attention per token)\n",
                achieved / 1e9);
    std::printf("GEMM on model shapes    %8.2f GFLOP/s ([%d x %d] @ [%d x %d]^T, %s)\n",
                gemm_peak / 1e9, rows_batch * seq, c.hidden_size, c.intermediate_size, c.hidden_size,
                dtype_name(compute));
    std::printf("achieved / GEMM         %8.1f%%\n", 100.0 * ratio);
    std::printf("device peak             %8.2f GFLOP/s (%s %s GEMM %lld^3, called directly)\n",
                peak / 1e9, peak_time.library.c_str(), dtype_name(peak_dtype),
                static_cast<long long>(peak_side));
    std::printf("model FLOPs utilisation %8.1f%% (achieved / device peak)\n", 100.0 * mfu);
    if (j.contains("attention_kernels"))
      std::printf("attention kernels       %s (tensor-core family; COROLLA_ATTENTION_KERNELS)\n",
                  j["attention_kernels"].get<std::string>().c_str());
    if (t.scaler().dynamic())
      std::printf("loss scaling            %d of %d timed steps skipped for overflow (no update: faster)\n",
                  skipped, steps);
  }
  j["loss_scale"] = loss_scaling_name(scaling);
  if (nlohmann::json tuning = report_gemm_tuning(device_be, o.json); !tuning.empty()) j["gemm_tuning"] = tuning;
  if (compute_baseline || scaling_baseline) {
    const double base_tokens_per_s = static_cast<double>(batch) * seq * steps / base_seconds;
    const double ratio_to_base = tokens_per_s / base_tokens_per_s;
    j[compute_baseline ? "f32_compute_tokens_per_s" : "unscaled_tokens_per_s"] = base_tokens_per_s;
    j[compute_baseline ? "speedup_vs_f32_compute" : "speed_vs_unscaled"] = ratio_to_base;
    if (!o.json && compute_baseline)
      std::printf("f32 compute baseline    %8.1f tokens/s (same run)  %s / f32 compute %.2fx\n", base_tokens_per_s,
                  dtype_name(compute), ratio_to_base);
    if (!o.json && scaling_baseline)
      std::printf("without loss scaling    %8.1f tokens/s (same run)  with / without %.3fx\n", base_tokens_per_s,
                  ratio_to_base);
  }
  if (accumulating) {
    const double alone_tokens_per_s = static_cast<double>(micro_batch) * seq * steps / alone_seconds;
    j["micro_batch_alone_tokens_per_s"] = alone_tokens_per_s;
    j["speedup_vs_micro_batch_alone"] = tokens_per_s / alone_tokens_per_s;
    if (t.scaler().dynamic()) j["micro_batch_alone_skipped_steps"] = alone_skipped;
    if (!o.json)
      std::printf("micro-batch alone       %8.1f tokens/s (batch %d, same run)  accumulated / alone %.2fx\n",
                  alone_tokens_per_s, micro_batch, tokens_per_s / alone_tokens_per_s);
  }
  if (o.profile) {
    prof.enable(true);
    t.step();
    prof.enable(false);
    report_profile(prof, "one training step", o.json, j);
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace corolla::app
