// apps/bench_common.hpp — what `corolla bench decode` and `bench train`
// share (apps/bench.cpp): their common flags, the model they run on, the
// bandwidth bound of decode, and the per-op profile.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "apps/membw.hpp"
#include "kernels/profiling_backend.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

struct bench_common {
  std::string model_dir;
  std::string preset = "small";
  std::string device = "auto";
  std::string matmul = "f32";  ///< bench train --matmul
  std::string compute = "f32";  ///< bench train --compute
  std::string loss_scale = "auto";  ///< bench train --loss-scale
  int threads = 0;
  bool json = false;
  bool profile = false;
  std::uint64_t seed = 0;
};

/// --model, --preset, --device, --threads, --json, --seed, and --profile
/// where `with_profile` (bench decode and bench train).
void add_common(CLI::App* cmd, bench_common& o, bool with_profile = true);
/// Prints the profile of the run `what` (and puts it in the JSON).
void report_profile(const profiling_backend& prof, const std::string& what, bool json_only, nlohmann::json& j);
/// The model of --model, else the random model of --preset.
transformer open_model(const bench_common& o, Backend& be);
/// Bytes of weights one decode step of `m` reads with its blocks' linear
/// weights stored as `weights`: every block parameter (of a mixture of
/// experts, the routed experts' share) and, `with_head`, the final norm and
/// the LM head as head::lm_head_format stores it.
double decode_bytes_per_token(transformer& m, weight_format weights, bool with_head = true);
/// The memory read bandwidth decode on `dev` is bound by: the host's (all
/// CPU backend threads, 512 MiB) or the device's HBM (2 GiB, CUDA events).
bandwidth_result measure_bound_bandwidth(device dev);
/// Whether decode on `dev` launches its GEMVs early (a GPU of sm_90 or
/// later, COROLLA_CUDA_EARLY_LAUNCH not 0); bench decode then also measures
/// it with early launch off, in the same run.
bool launches_early(device dev);

/// What the step graphs (kernels/cuda/device.hpp) did in this process, for
/// a JSON line: launched, updated, instantiated, failed, eager, last_failure;
/// {} without CUDA.
nlohmann::json step_graph_report();

/// What the cuBLASLt algorithm tuner (kernels/cuda/gemm_tuner.hpp) did on
/// `be` (a CUDA backend; {} for others or without CUDA): every problem it
/// timed and the totals at this process's calls, printed unless `json`,
/// returned for the JSON line (problems, changed, first_ms, chosen_ms,
/// speedup, and each problem).
nlohmann::json report_gemm_tuning(const Backend& be, bool json);

/// `corolla bench decode` (apps/bench_decode.cpp).
void register_bench_decode(CLI::App* bench, action_fn& action);

/// `corolla bench train` without --cluster (apps/bench_train.cpp): B =
/// `batch` sequences of `seq` tokens a step, `steps` timed steps after a
/// warm-up; `micro_batch` sequences per forward and backward (gradient
/// accumulation; 0 for the whole batch).
int run_bench_train(const bench_common& o, int batch, int seq, int steps, int micro_batch);

}  // namespace corolla::app
