// actors/train_job.hpp — pipeline x data-parallel training across processes:
// the layout of a job (which rank runs which blocks), one rank's runtime,
// and the coordinator that gathers the ranks, prints the losses and commits
// checkpoints. docs/training.md describes the whole flow.
//
// Rank r runs stage r / dp of replica r % dp (stage-major, so a stage's DP
// group is a run of consecutive ranks). Per step, every rank:
//  - runs its 1F1B instruction list (schedule::make_1f1b) on a stage actor
//    (detached): stage 0 embeds its micro-batches, the last stage computes
//    the loss, activations and their gradients go to the neighbouring stage
//    of the same replica;
//  - during the step's last backward hands each block's gradient bucket to
//    its DP-group actor (detached) the moment the block is done: the bucket
//    is ring reduce-scattered over the stage's replicas while the rest of
//    the backward runs, then (without clipping) AdamW updates this rank's
//    shard of it and a ring all-gather spreads the new parameters (ZeRO-1);
//  - the head (embeddings, final norm, LM head) lives on the first and last
//    stage; its gradients are reduced over all of its holders the same way,
//    so tied embeddings get both stages' gradients;
//  - reports its loss share and squared gradient-shard norm to the
//    coordinator, which sums them (the global norm for clipping comes back
//    before any update when clipping is on).
// The result equals single-process training on the same global batch up to
// floating-point summation order.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "kernels/backend.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "model/params.hpp"
#include "model/optimizer.hpp"
#include "model/stage.hpp"
#include "schedule/cluster.hpp"

namespace corolla {

class node;
class train_inbox;
struct train_peer;
class transformer;
class token_dataset;

/// Which rank runs which blocks.
struct train_layout {
  int pp = 1;                   ///< pipeline stages
  int dp = 1;                   ///< data-parallel replicas of each stage
  /// Model chunks per stage (interleaved 1F1B, Megatron's "virtual
  /// pipeline"): stage s runs virtual stages c * pp + s for c < chunks. 1 =
  /// plain 1F1B.
  int chunks = 1;
  /// pp * chunks + 1 entries: virtual stage v runs blocks
  /// [boundaries[v], boundaries[v+1]) (with one chunk, stage s's blocks).
  std::vector<int> boundaries;
  /// Optional: the worker each rank stands for (a cluster file's "node/index"), for messages.
  std::vector<std::string> worker_names;

  int world() const { return pp * dp; }
  int virtual_stages() const { return pp * chunks; }
  int stage_of(int rank) const { return rank / dp; }
  int replica_of(int rank) const { return rank % dp; }
  int rank_of(int stage, int replica) const { return stage * dp + replica; }
  /// The virtual stage of chunk `chunk` on stage `stage`.
  int virtual_stage(int stage, int chunk) const { return chunk * pp + stage; }
  /// "rank 3 (stage 1, replica 1, blocks 2..3)" (several ranges with chunks).
  std::string label(int rank) const;
  /// "2x2 [0,2) [2,4)"; with chunks "2x2 v2 [0,1) [1,2) [2,3) [3,4)".
  std::string describe() const;
};

/// pp stages (pp * chunks virtual stages) of about n_layers / (pp * chunks)
/// blocks each (the first take the remainder). Throws std::invalid_argument
/// for pp, dp or chunks < 1, or more virtual stages than blocks.
train_layout even_layout(int n_layers, int pp, int dp, int chunks = 1);
/// The buckets ("block.<i>", "head": bucket_name) whose parameters rank
/// `rank` of `l` holds: its stage's blocks (every chunk's), and the head on
/// the first and the last stage.
std::set<std::string> param_buckets(const train_layout& l, int rank);
/// Checks explicit boundaries (0 = b0 < b1 < ... = n_layers, one range per
/// virtual stage). Throws std::invalid_argument naming the problem.
void check_layout(const train_layout& l, int n_layers);

/// Calibrated synthetic compute (benchmarks of emulated clusters on one
/// machine): each rank sleeps its stage's modelled forward and backward
/// time per micro-batch instead of computing, and skips the AdamW
/// arithmetic, while every message (activations, gradients, the DP
/// reductions of its real parameter buffers) still carries its real bytes
/// over the shaped links. Losses are then 0.
struct synthetic_compute {
  std::vector<double> forward_s;   ///< per stage: one micro-batch's forward
  std::vector<double> backward_s;  ///< per stage: one micro-batch's backward
  bool enabled() const { return !forward_s.empty(); }
};

/// How a data-parallel group (and the head's group) sums gradients and
/// gathers updated parameters.
enum class dp_collectives {
  /// Rings over the actor runtime in host memory (train_comm.hpp): every
  /// backend; device ranks stage their buckets through page-locked copies.
  host,
  /// The devices' own collectives (Backend::join_group: NCCL groups on
  /// CUDA): buckets never leave the device. Needs every rank on a device
  /// backend with device groups, one device per rank.
  device,
};

/// "host" or "device".
const char* dp_collectives_name(dp_collectives c);
/// Parses "host" or "device"; throws std::invalid_argument naming the value.
dp_collectives parse_dp_collectives(const std::string& s);

/// Where a grid started after a failure reads its state: the survivors'
/// in-memory snapshots of `step` of the failed grid's run `run`, in the
/// keepers of its processes, which the elastic launcher keeps alive until
/// the new grid has its own (memory to memory, actors/train_snapshots.hpp;
/// the launcher chooses the step and copies with
/// schedule::choose_snapshot_step).
struct memory_restore {
  int step = 0;                                  ///< 0: none (a resume reads the latest checkpoint)
  std::uint64_t run = 0;                         ///< the failed grid's run id: what lets its keepers answer
  std::map<int, std::string> holder_of;          ///< owner (a rank of the failed grid) -> node holding its copy
  std::map<std::string, std::string> endpoints;  ///< node id -> where it listens
  std::string loss_scale;                        ///< the scaler's state after `step`, as a snapshot says it ("" = none)
};

/// Everything every rank and the coordinator must agree on.
/// The most buckets' rings a DP-group actor runs side by side.
inline constexpr int max_rings_at_once = 64;

/// The smallest and largest dist_train_options::message_piece_bytes (the
/// largest half of a node's default largest message; the smallest keeps a
/// save's asks and a snapshot's parts to a number a run can afford).
inline constexpr std::int64_t min_message_piece_bytes = 4096;
inline constexpr std::int64_t max_message_piece_bytes = std::int64_t{512} << 20;
/// Throws std::invalid_argument when `bytes` is outside those bounds.
void check_message_piece_bytes(std::int64_t bytes);

/// LoRA fine-tuning across the ranks (model/lora.hpp): every rank holds the
/// adapter (small: a few MB for a 7B model), trains the factors of its own
/// blocks beside its frozen blocks and head, and the DP groups reduce and
/// update the adapter's block buckets instead of the model's; no head
/// bucket, no gradient buffer of the model. --save writes the adapter in
/// PEFT's layout.
struct dist_lora {
  /// A new adapter (lora_adapter::init with `seed`: the same A on every rank
  /// and in single-process training), unless `from` names a saved one to
  /// train on (its own config then).
  lora_config config;
  std::uint64_t seed = 0;
  std::filesystem::path from;
  /// With `from`: the saved adapter's digest (lora_adapter::digest): every
  /// rank's copy must be it (the path may differ between machines).
  std::string from_digest;
  /// base_model_name_or_path in the saved adapter_config.json.
  std::string base_model;
  /// A fingerprint of the frozen model's weight files (the launcher's):
  /// every rank's model must have it, and so must a resumed job's, since
  /// an adapter's checkpoint means nothing beside other weights. Empty: no
  /// frozen weights are read, the ranks draw the model from their --seed
  /// (bench train --cluster's synthetic compute).
  std::string base_digest;
  /// The format the ranks hold the frozen model's linear weights in: f32,
  /// or bf16/int8/nf4 (QLoRA: each rank loads its stage with
  /// stage::load_inference and widens one block at a time for its turn in
  /// the forward and the backward; the head stays f32). Not f32: the
  /// blocks compute in f32 (dist_train_options::compute).
  weight_format base_weights = weight_format::f32;
};

struct dist_train_options {
  train_layout layout;
  /// Set: the ranks train this LoRA adapter, not the model's weights.
  std::optional<dist_lora> lora;
  int batch = 1;        ///< global batch: sequences per step over all replicas
  int seq = 0;          ///< tokens per sequence
  int micro_batch = 0;  ///< sequences per micro-batch; 0 = 1 when pp > 1, else batch / dp
  int steps = 0;        ///< steps to run (counted from 1, including resumed ones)
  optimizer_settings optimizer;
  /// The dtype the ranks' blocks compute in (stage::set_compute_dtype): f32,
  /// or bf16/f16 on device ranks (mixed precision; activations between
  /// stages stay f32).
  dtype compute = dtype::f32;
  /// The data-parallel groups' collectives (every rank must agree).
  dp_collectives collectives = dp_collectives::host;
  /// How many buckets' host ring collectives a DP-group actor runs at once
  /// (--rings-at-once, 1 to max_rings_at_once; 1: one bucket after
  /// another): the reductions the backward hands over while a ring waits
  /// on its neighbours start instead of queueing. Every value gives the
  /// same results (ranks started by hand may even differ).
  int rings_at_once = 4;
  /// Sharded checkpoints: every `checkpoint_every` steps (0 = never) each
  /// rank writes its shard under checkpoint_dir/step-N/, and the coordinator
  /// commits the step (manifest.json, then the `latest` pointer) once every
  /// shard is on disk. A checkpoint is never half written: `latest` only
  /// ever names a complete one.
  std::filesystem::path checkpoint_dir;
  int checkpoint_every = 0;
  /// Every `probe_every` steps (0 = never) each rank measures its links to
  /// its neighbours of higher rank with echoes (actors/link_probe.hpp) and
  /// reports the rates with the step: what the elastic scheduler re-plans
  /// on when a link changes under the job. Costs a pause of the step, and
  /// at each probe step every rank waits for the coordinator's verdict
  /// (train.drain: go on, or stop here for a new layout).
  int probe_every = 0;
  /// In-memory snapshots (elastic jobs, actors/train_snapshots.hpp): every
  /// `snapshot_every` steps (0 = never) each rank keeps a copy of what its
  /// checkpoint shard of that step would hold and sends one to its buddy
  /// rank (snapshot_buddy); a rank whose job fails writes the snapshots it
  /// holds under checkpoint_dir/memory/, from which the launcher assembles
  /// the newest complete step: a single failure loses no step.
  int snapshot_every = 0;
  /// --snapshot-every auto: snapshot_every is only the first interval; at
  /// each verdict step (verdict_at) the coordinator chooses the next from
  /// how long the copies took against the steps
  /// (schedule/snapshot_interval.hpp) and sends it with train.drain.
  bool snapshot_auto = false;
  /// Every `drain_every` steps (0 = only at probe steps) every rank also
  /// waits for the coordinator's verdict (train.drain): where an elastic
  /// launcher may stop the job to grow it onto workers that joined.
  int drain_every = 0;
  /// A rank whose job fails keeps its process, node and snapshot keeper
  /// (instead of writing its snapshots to disk and ending) until the
  /// launcher ends it: what it holds is read from memory by the next grid
  /// (from_memory).
  bool hold_snapshots = false;
  /// With hold_snapshots: a drain (a verdict that stops the job for
  /// another plan) keeps the drain step in memory instead of a checkpoint
  /// on disk: every verdict step is also a snapshot step, and after the
  /// drain step the ranks hold (as after a failure) for the next grid to
  /// read from (from_memory). Off, the drain step is checkpointed.
  bool drain_to_memory = false;
  /// Not empty: the launcher may be replaced by one of the job's rank
  /// processes if it dies (apps/launcher_takeover.hpp); only messages
  /// carrying this secret tell a rank process how to carry the job on.
  std::string takeover_token;
  /// With takeover_token: the launcher's process id (the same machine),
  /// which a rank process watches from its start.
  int launcher_pid = 0;
  /// Continue from checkpoint_dir's latest checkpoint (same layout, batch
  /// and model shape; anything else is refused with the difference), or,
  /// with from_memory.step > 0, from those snapshots.
  bool resume = false;
  memory_restore from_memory;
  /// When set, the trained model is written here (HuggingFace layout) by
  /// the coordinator after the last step.
  std::filesystem::path save_dir;
  /// The most bytes of tensor values one message of --save's parameters,
  /// of a buddy's in-memory snapshot or of a snapshot fetch carries (a
  /// node refuses messages over 1 GiB by default, and a real model's
  /// groups and stages are larger): larger ones go in pieces. From 4 KiB
  /// to 512 MiB (fetch_snapshot's default is the same 256 MiB).
  std::int64_t message_piece_bytes = std::int64_t{256} << 20;
  /// Shaping of the link between ranks a and b at [a * world + b] (a net
  /// link profile such as "bw=10Gbit,lat=5us"; "" = unshaped). Empty = no
  /// shaping anywhere. The lower rank of a pair connects with this profile
  /// and asks the other to shape its replies alike.
  std::vector<std::string> link_profiles;
  /// When enabled, ranks emulate compute (see synthetic_compute).
  synthetic_compute synthetic;
  /// How long any rank waits for one message (a dead rank is reported far
  /// sooner, by the link's failure detection).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// A rank whose stage has been inside one forward or backward for longer
  /// than max(hang_s, 10 x its longest so far) is hung (0 = never checked):
  /// it tells the coordinator and ends (actors/train_watchdog.hpp). Its
  /// node stays up, so heartbeats would not catch it.
  double hang_s = 60;

  /// Whether a checkpoint is written after step `step`.
  bool checkpoints_at(int step) const {
    return checkpoint_every > 0 && !checkpoint_dir.empty() && step % checkpoint_every == 0;
  }
  /// Whether the ranks take in-memory snapshots after step `step`, with
  /// the interval `every` in force (snapshot_every, or what the coordinator
  /// chose since with snapshot_auto).
  bool snapshots_at(int step, int every) const {
    return every > 0 && !checkpoint_dir.empty() && (step % every == 0 || (drains_to_memory() && verdict_at(step)));
  }
  bool snapshots_at(int step) const { return snapshots_at(step, snapshot_every); }
  /// Whether a drain keeps its step in memory (drain_to_memory, with
  /// snapshots and held ranks), not in a checkpoint.
  bool drains_to_memory() const {
    return drain_to_memory && hold_snapshots && snapshot_every > 0 && !checkpoint_dir.empty();
  }
  /// Whether a job that stops after `step` (its last step `last`, below
  /// `steps` after a drain) writes a checkpoint there.
  bool saves_at(int step, int last) const {
    return checkpoints_at(step) || (step == last && last < steps && !drains_to_memory());
  }
  /// Whether the ranks probe their links at step `step` (probe_every).
  bool probes_at(int step) const { return probe_every > 0 && step % probe_every == 0; }
  /// Whether every rank waits for the coordinator's verdict (train.drain)
  /// after step `step`: a probe or drain_every step that is not the last.
  bool verdict_at(int step) const {
    return (probes_at(step) || (drain_every > 0 && step % drain_every == 0)) && step < steps;
  }

  /// Micro-batch size after the default rule. Throws std::invalid_argument
  /// when batch is not a multiple of dp, or batch / dp of micro_batch.
  int micro_batch_size() const;
  /// Micro-batches per replica per step. Throws as micro_batch_size, and
  /// with chunks > 1 unless it is a multiple of pp (interleaved 1F1B).
  int micro_batches() const;
};

/// Every bucket of a job of `n_layers` blocks: "head" (not in a LoRA
/// job, whose head trains nothing), then each "block.<i>" (the model's
/// block, or in a LoRA job the adapter's): what a complete step's
/// checkpoint or snapshots hold.
std::vector<std::string> job_buckets(const dist_train_options& o, int n_layers);
/// The buckets rank `rank` of `o` trains: param_buckets, less the head in
/// a LoRA job.
std::set<std::string> trained_buckets(const dist_train_options& o, int rank);

/// A string that differs between jobs whose checkpoints are not
/// interchangeable (model shape, global batch, sequence length): checkpoints
/// of another job are refused at resume. The layout and the micro-batch are
/// not part of it: a checkpoint restores into any layout.
std::string checkpoint_key(const dist_train_options& o, const model_config& cfg);
/// checkpoint_key plus the layout, the micro-batch and what every rank of
/// one run must also agree on (steps, optimizer, clipping, checkpointing,
/// --save, synthetic compute): ranks
/// that differ are refused at join instead of training differently or
/// waiting for messages that never come.
std::string join_key(const dist_train_options& o, const model_config& cfg);

/// What the coordinator reports per step.
struct dist_step_report {
  int step = 0;
  double loss = 0;       ///< mean loss of the global batch before the update
  /// Global gradient norm before clipping, unscaled (0 when clipping and
  /// loss scaling are off: not computed; not finite on a skipped step).
  double grad_norm = 0;
  double loss_scale = 1;  ///< the loss scale of this step (1 without loss scaling)
  bool skipped = false;   ///< the gradients overflowed: no rank updated (loss scaling)
  double seconds = 0;    ///< wall time since the previous report
  /// On probe steps (dist_train_options::probe_every): each link a rank
  /// measured, from the lower rank to the higher.
  std::vector<schedule::link_measurement> links;
  /// Each rank's seconds inside its stage's forward and backward this
  /// step (0 = not measured: device ranks).
  std::vector<double> compute_s;
  /// The most bucket reductions over host rings of two or more ranks any
  /// rank's DP group ran side by side this step
  /// (dist_train_options::rings_at_once; 0: none).
  int rings_side_by_side = 0;
  /// The same of the step before's update jobs (with clipping or loss
  /// scaling the update is one job per bucket, after the coordinator's
  /// norm, so after this report left; 0: none).
  int updates_side_by_side = 0;
  /// The in-memory snapshot interval in force after this step: with
  /// snapshot_auto, what the coordinator chose at this verdict step.
  int snapshot_every = 0;
  /// On a snapshot step: seconds from the last report of the step to the
  /// last buddy's acknowledgement of its copy (train.kept); else 0.
  double snapshot_copy_s = 0;
  /// When snapshot_every changed at this step: the median copy and step
  /// seconds since the previous verdict that it was chosen on; else 0.
  double snapshot_median_copy_s = 0, snapshot_median_step_s = 0;
};

/// Where a rank gets its parameters: only the blocks of its stage (and the
/// head on the first and last stage) are asked for, so a rank of a large
/// model reads only its own tensors from a checkpoint.
struct rank_weights {
  model_config cfg;
  Backend* be = nullptr;
  /// The parameter sets of blocks [first, last).
  std::function<std::vector<param_set>(int first, int last)> blocks;
  /// The head's parameter set.
  std::function<param_set()> head;
  /// Blocks [first, last) as an inference-only stage holding format `f`
  /// (not f32) on `be` (stage::load_inference): a QLoRA job's frozen
  /// blocks, read without holding the stage's f32 parameters at once.
  /// Empty: stage::inference_of over blocks(first, last).
  std::function<stage(int first, int last, Backend& be, weight_format f)> frozen_stage;
};

/// Weights from a whole model in memory (shared, not copied).
rank_weights weights_of(transformer& model);
/// A fresh initialisation for `seed` (transformer::init's values), of which
/// only rank `rank`'s groups in `l` are kept (param_buckets): the others
/// are drawn and dropped, so every rank holds the values the whole model
/// has without holding the whole model. Each group is handed over once
/// (moved out, so no host copy stays behind a group placed on a device);
/// asking for another group, or for one again, throws train_error.
rank_weights weights_from_seed(const model_config& cfg, std::uint64_t seed, Backend& be, const train_layout& l,
                               int rank);
/// Zeroed parameters of the shapes asked for, for a rank that restores
/// every one of them before its first step (a resume from a checkpoint or
/// from in-memory snapshots: dp_group::restore writes every bucket whole),
/// so nothing is drawn or read that would be overwritten.
rank_weights weights_to_restore(const model_config& cfg, Backend& be);
/// Weights read from `dir`'s checkpoint on demand (model/stage.hpp's and
/// model/head.hpp's loaders: only the tensors asked for are read).
rank_weights weights_from_checkpoint(const std::filesystem::path& dir, Backend& be);

/// Runs rank `rank` of the job on node `n` until the last step, training
/// its blocks (and the head on the first and last stage) from `weights` on
/// the token data (every rank reads the same batches; stage 0 uses the ids,
/// the last stage the targets). `coordinator` is the coordinator's
/// endpoint. Throws train_error (see train_comm.hpp) naming the rank that
/// failed, model_error for bad data or weights.
///
/// The stages compute on `compute` (null: the weights' backend); weights
/// elsewhere are copied there. With a device backend, activations and
/// gradients between stages go through host memory; parameters, gradients
/// and AdamW moments stay on the device, where the update runs (on the
/// backend's companion instance, from the DP group's thread). A bucket
/// shared with other replicas goes through host copies for the
/// collectives: its gradients come down once its last backward is queued,
/// are reduce-scattered, this rank's reduced shard goes up to be updated,
/// the updated shard comes down for the all-gather, and the other shards
/// go up. A bucket of a group of one never leaves the device.
///
/// Returns the last step it ran: o.steps, or the drain step when the
/// coordinator stopped the job there for another plan.
int run_train_rank(node& n, const dist_train_options& o, int rank, const std::string& coordinator,
                   const rank_weights& weights, token_dataset& data, Backend* compute = nullptr);

/// Gathers the job's ranks on node `n` (published as "train-coord"), hands
/// them the roster, then per step sums their reports and calls `on_step`
/// (from the coordinator actor's own thread: a detached, event-based
/// actor on `n`, actors/train_coordinator.cpp; the caller's thread waits);
/// commits checkpoints; saves the model when asked (`cfg` shapes it).
/// Returns when every rank is done. On a failure (a rank died, a wrong
/// job) it tells every rank to abort and throws train_error.
/// `inbox` (optional) is the coordinator's mailbox store: failing it from
/// outside (a launcher that saw a rank process exit) fails the job at once.
void run_train_coordinator(node& n, const dist_train_options& o, const model_config& cfg,
                           const std::function<void(const dist_step_report&)>& on_step,
                           std::shared_ptr<train_inbox> inbox = nullptr);

/// What a launcher hears from the coordinator, and whom the coordinator
/// asks for a drain. Every callback runs on the coordinator actor's thread.
struct coordinator_hooks {
  std::function<void(const dist_step_report&)> on_step;
  /// Once every rank joined: who they are (rank, node id, endpoint), and
  /// the run's id (what the ranks' snapshot keepers answer to).
  std::function<void(const std::vector<train_peer>&, std::uint64_t run)> on_roster;
  /// The elastic scheduler actor (actors/train_scheduler.hpp). After
  /// on_step of a verdict step (o.verdict_at; not the last step), while
  /// every rank waits at that step boundary, the coordinator asks it
  /// (request sched_msg::verdict_atom, drain_query -> drain_verdict) and
  /// goes on with its answer, never blocking: a verdict to drain stops the
  /// job after this step, with a checkpoint written and committed there (or
  /// the step held in memory). Needs o.checkpoint_dir (else never asked).
  /// A scheduler that answers with an error, or not within o.timeout (plus
  /// its own wait for the lobby), fails the job. Null: no verdicts.
  caf::actor scheduler;
  /// A verdict's notes (lines for stderr, in order), before the
  /// coordinator acts on it.
  std::function<void(const std::vector<std::string>&)> on_verdict_notes;
};

/// As above, with hooks; returns the last step run: o.steps, or the step a
/// drain stopped the job after (its checkpoint is committed).
int run_train_coordinator(node& n, const dist_train_options& o, const model_config& cfg, const coordinator_hooks& hooks,
                          std::shared_ptr<train_inbox> inbox = nullptr);

}  // namespace corolla
