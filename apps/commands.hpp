// apps/commands.hpp — how subcommands plug into the corolla CLI.
//
// Each apps/<command>.cpp defines one register_<command>() that adds its
// subcommand to the CLI11 app and sets `action` (run after parsing) when the
// subcommand is chosen. The action returns the process exit code. Errors at
// this edge are exceptions; run_cli turns them into one line on stderr.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "schedule/decode_gathering.hpp"

namespace CLI {
class App;
}

namespace corolla {
class Backend;
}

namespace corolla::app {

using action_fn = std::function<int()>;

int run_cli(int argc, char** argv);

void register_info(CLI::App& app, action_fn& action);
/// `corolla generate`: local generation from a model directory (apps/generate.cpp).
void register_generate(CLI::App& app, action_fn& action);
/// `corolla api`: the OpenAI-compatible HTTP API over a local model or a swarm (apps/api.cpp).
void register_api(CLI::App& app, action_fn& action);
/// `corolla dashboard`: the swarm dashboard page from the DHT, without an API (apps/dashboard.cpp).
void register_dashboard(CLI::App& app, action_fn& action);
/// `corolla faultlab`: fault-injection scenarios against local swarms and training jobs (apps/faultlab.cpp).
void register_faultlab(CLI::App& app, action_fn& action);
/// `corolla finetune`: prompt tuning with the blocks on a swarm (apps/finetune.cpp).
void register_finetune(CLI::App& app, action_fn& action);
/// `corolla train`: single-process AdamW training (apps/train.cpp).
void register_train(CLI::App& app, action_fn& action);
/// `corolla bench decode|train`: speed against bounds measured in the same run (apps/bench.cpp).
void register_bench(CLI::App& app, action_fn& action);
/// `corolla bench link`: runtime links vs raw ZeroMQ on loopback (apps/bench_link.cpp).
void register_bench_link(CLI::App* bench, action_fn& action);
/// `corolla bench interleave`: small requests during a large transfer (apps/bench_interleave.cpp).
void register_bench_interleave(CLI::App* bench, action_fn& action);
/// `corolla bench gemm`: Backend::linear vs the vendor GEMM called directly (apps/bench_gemm.cpp).
void register_bench_gemm(CLI::App* bench, action_fn& action);
/// `corolla bench elastic`: a throttled rank, re-planned on measured links vs the static plan (apps/bench_elastic.cpp).
void register_bench_elastic(CLI::App* bench, action_fn& action);
/// `corolla bench swarm`: a 3-server chain on loopback vs local decode (apps/bench_swarm.cpp).
void register_bench_swarm(CLI::App* bench, action_fn& action);
/// `corolla bench api`: the OpenAI-compatible API over a local swarm vs the
/// swarm engine directly (apps/bench_api.cpp).
void register_bench_api(CLI::App* bench, action_fn& action);
/// `corolla bench serve`: a swarm server's decode with concurrent sessions vs
/// one session (apps/bench_serve.cpp).
void register_bench_serve(CLI::App* bench, action_fn& action);
/// `corolla bench attention`: training attention per matmul precision vs the
/// GEMM rate at that precision (apps/bench_attention.cpp).
void register_bench_attention(CLI::App* bench, action_fn& action);
/// `corolla bench update`: a training rank's bucket update on the device vs
/// on the host (apps/bench_update.cpp).
void register_bench_update(CLI::App* bench, action_fn& action);
/// `corolla bench fusions`: training's fused ops vs the two ops each
/// replaces, on one block's shapes (apps/bench_fusions.cpp).
void register_bench_fusions(CLI::App* bench, action_fn& action);
/// `corolla bench loss`: the head's training loss with the logits in chunks
/// of rows vs all rows at once (apps/bench_loss.cpp).
void register_bench_loss(CLI::App* bench, action_fn& action);
/// corolla bench lora: a LoRA adapter's training step vs the whole model's
/// (apps/bench_lora.cpp).
void register_bench_lora(CLI::App* bench, action_fn& action);
/// `corolla bench lora-ranks`: a LoRA adapter across rank processes beside
/// f32 blocks vs quantised ones, their memory and speed
/// (apps/bench_lora_ranks.cpp).
void register_bench_lora_ranks(CLI::App* bench, action_fn& action);
/// corolla bench lora-serve: a server's decode with LoRA adapters per
/// session vs the base model's (apps/bench_lora_serve.cpp).
void register_bench_lora_serve(CLI::App* bench, action_fn& action);
/// A tensor of `shape` and dtype `t` on `be`'s device holding pseudo-random
/// values in [-1, 1) (drawn in f32 on the host from `seed`, converted by the
/// backend's copy), for the benches (apps/bench_gemm.cpp).
Tensor random_tensor_on(Backend& be, shape_t shape, dtype t, std::uint64_t seed);
/// Best GEMM FLOP/s of `be` on [rows x k] @ [n x k]^T with tensors of dtype
/// `t` (f32 ones at the current matmul precision), the best of 5 rounds
/// after a warm-up; a device's rounds are 10 products each (apps/bench.cpp).
double measure_gemm_flops(Backend& be, std::int64_t rows, std::int64_t k, std::int64_t n, dtype t = dtype::f32);
/// What `corolla bench train --cluster FILE` runs.
struct cluster_bench_options {
  std::string cluster;  ///< cluster TOML
  std::string model;    ///< model directory; "" = a built-in 2.6M-parameter model
  int batch = 16;
  int seq = 128;
  int micro_batch = 1;
  int timed_steps = 5;  ///< measured steps of each layout, after one warm-up step
  /// Clip to this global norm (0: none): every step then waits for the
  /// coordinator's norm, and the all-gathers run in the update request.
  double grad_clip = 0;
  /// Not 0: each layout also trains a LoRA adapter of this rank (q and v,
  /// the default targets) right after its whole-model run, on the same
  /// links and the same modelled compute: what the adapter's buckets
  /// instead of the model's save on the links.
  int lora_rank = 0;
  bool json = false;
};
/// An emulated heterogeneous cluster: the planner's layout vs the Holmes
/// rule, all-Ethernet and all-IB (apps/bench_train_cluster.cpp).
int run_bench_train_cluster(const cluster_bench_options& a);
/// The random ~100M-parameter Llama-shaped model of the benches (dim 1024,
/// 8 layers, vocab 4096), as a config.
model_config bench_llama_config();
/// A tiny random-model shape (width 64, 4 heads of 16, MLP 128, vocab 256,
/// context 256): Llama with grouped-query attention (2 key-value heads) or
/// GPT-2 with tied embeddings. What faultlab's built-in models and bench
/// swarm's per-hop measurement run on: compute that costs next to nothing.
model_config tiny_random_config(architecture arch, int layers);
/// `corolla demo`: the main job on the embedded corpus (apps/demo.cpp).
void register_demo(CLI::App& app, action_fn& action);
/// `corolla plan`: pipeline x data-parallel plan for a cluster file (apps/plan.cpp).
void register_plan(CLI::App& app, action_fn& action);

/// `corolla node`: a node answering echo/ping until SIGINT/SIGTERM (apps/node_cmd.cpp).
void register_node(CLI::App& app, action_fn& action);
/// `corolla serve`: a span of blocks for swarm clients (apps/serve.cpp).
void register_serve(CLI::App& app, action_fn& action);
/// `corolla ping`: echo round trips with tensors to a node (apps/ping.cpp).
void register_ping(CLI::App& app, action_fn& action);

/// The non-empty items of a comma-separated flag value ("a,,b" -> a, b).
std::vector<std::string> split_list(const std::string& text);

/// The model id a swarm uses for a model directory: its name ("models/tiny/"
/// and "models/tiny" are both "tiny"; "." is the current directory's name).
/// Servers announce it and clients look it up, so both must derive it alike.
std::string model_id_of(const std::string& dir);

/// An output directory a command writes at its end (--save, --checkpoint-dir),
/// checked before the work: made when missing; a file, a folder that cannot
/// be made, or one this process may not write into throws
/// std::invalid_argument naming `flag` (so hours of training are not lost
/// to a typo found only when they end).
void check_output_dir(const std::string& dir, const std::string& flag);
/// The same for an output file (finetune --save): not a directory, in a
/// folder that exists and can be written into.
void check_output_file(const std::string& file, const std::string& flag);

/// The most --threads any command takes.
inline constexpr int max_cpu_threads = 4096;

/// Applies --threads (0 = all cores) and --log-level to the process.
/// Throws std::invalid_argument for --threads outside [0, max_cpu_threads]
/// and a level spdlog does not know.
void apply_common_options(int threads, const std::string& log_level);

/// The dtype a --weights flag names: "f32" or "bf16" (the linear weights
/// decode reads, see generator); throws std::invalid_argument
/// ("--weights must be f32 or bf16, got 'x'") otherwise.
weight_format parse_weights_flag(const std::string& text);
/// A byte count as "6GiB", "512MiB", "2.5GB", "4G" or "1000000": units B,
/// KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB and K/M/G/T (powers of
/// 1024). Throws std::invalid_argument naming `flag` for anything else or a
/// count below one byte.
std::int64_t parse_byte_size(const std::string& text, const std::string& flag);
/// A memory budget flag (serve and bench serve --max-memory): a size as
/// parse_byte_size reads it, or "auto": what `where` has free now less a
/// reserve (kernels/memory_available.hpp auto_memory_budget), logged with
/// the figures it came from. Throws std::invalid_argument for a bad size or
/// when auto leaves nothing, std::runtime_error when the free memory cannot
/// be read.
std::int64_t parse_memory_budget(const std::string& text, const std::string& flag, device where);
/// How long a server's decode batch waits for the sessions of its last
/// batches (schedule/decode_gathering.hpp) from --batch-wait (a fraction of
/// the last batch's time) and --batch-wait-max-ms; 0 for either turns the
/// wait off. Throws std::invalid_argument for a negative or non-finite
/// fraction or a cap outside [0, 10000] ms.
swarm::gathering_policy parse_batch_wait(double fraction, double max_ms);
/// The dtype a --compute flag names for training on `where` (train and
/// bench train): f32, or bf16/f16 on a device. Throws std::invalid_argument
/// for an unknown name and for bf16/f16 on the cpu ("--compute bf16 needs a
/// GPU (--device cuda): the cpu backend computes in f32").
dtype parse_compute_flag(const std::string& text, device where);

/// The dtype a --kv-dtype flag names: "f32", "bf16" or "f16" (the KV
/// cache's elements); throws std::invalid_argument ("--kv-dtype must be
/// f32, bf16 or f16, got 'x'") otherwise.
dtype parse_kv_dtype_flag(const std::string& text);

}  // namespace corolla::app
