// schedule/cost_model.hpp — what a pipeline x data-parallel layout costs:
// FLOPs, bytes and seconds per layer, per stage and per step.
//
// The planner, both baselines and the simulator price layouts with these
// functions only, so "better than the Holmes rule" always means "better on
// the same model". Every formula is explained where it is defined
// (cost_model.cpp) and in docs/planner.md. Units: seconds, bytes, FLOP.
#pragma once

#include <string>
#include <vector>

#include "model/config.hpp"
#include "schedule/cluster.hpp"

namespace corolla::schedule {

/// Number formats of a training run.
enum class precision {
  bf16_mixed,  ///< bf16 weights, gradients and activations; fp32 master weights + AdamW moments
  fp32,        ///< everything fp32 (the CPU reference runtime); AdamW moments only
};

/// The most layers the planner splits: its dynamic program is O(stages x
/// layers^2) per layout priced (a million layers would take hours).
constexpr int max_planned_layers = 1024;

/// The job being planned, besides the model and the cluster.
struct training_setup {
  int global_batch = 32;  ///< sequences per optimizer step (over all replicas)
  int micro_batch = 1;    ///< sequences per micro-batch (b)
  int seq = 0;            ///< tokens per sequence (s); 0 = the model's context length

  double weight_bytes = 2;      ///< per parameter, compute copy
  double grad_bytes = 2;        ///< per parameter, gradient buffer (also what DP reduces)
  double optimizer_bytes = 12;  ///< per parameter: AdamW's 2 moments (+ fp32 master in mixed precision)
  double activation_bytes = 2;  ///< per activation element
  bool zero1 = true;            ///< optimizer states sharded across the DP group (ZeRO-1)
  /// Share of a stage's DP reduction that runs during the backward of its
  /// last micro-batch (bucketed reduce-scatter); the rest (all-gather after
  /// the optimizer step) is exposed. It never hides more than that backward lasts.
  double dp_overlap = 0.5;
  double memory_headroom = 0.1;  ///< fraction of each worker's memory left free (allocator, workspace)
  double bucket_bytes = 25.0 * 1024 * 1024;  ///< gradient bytes per reduction bucket

  /// LoRA fine-tuning: the adapter's values per block (0: the whole model
  /// trains). The model's weights then stay frozen: only the adapter has
  /// gradients, AdamW moments and DP traffic, the head and the embeddings
  /// train nothing (no reduction, no tied-embedding sync), and the
  /// backward forms input gradients only (1 x the forward's products,
  /// not 2 x).
  double lora_block_params = 0;
  /// QLoRA (beside lora_block_params): the bytes one block's frozen
  /// weights take as held, bf16, int8 or nf4 linear weights with their
  /// scales beside f32 norms (model/block.hpp's served_block_bytes without
  /// parameters); a stage then also holds one block widened to f32 (4
  /// bytes a parameter) while it computes. 0: the blocks' parameters at
  /// weight_bytes.
  double frozen_block_bytes = 0;

  int pp = 0;  ///< force this pipeline depth (0 = let the planner choose)
  int dp = 0;  ///< force this data-parallel width (0 = let the planner choose)

  /// The byte sizes of `p` (bf16_mixed: 2/2/12/2; fp32: 4/4/8/4).
  void set_precision(precision p);
  /// Micro-batches per replica per step, m = global_batch / (dp * micro_batch),
  /// or 0 when `dp * micro_batch` does not divide the global batch.
  int micro_batches(int dp) const;
  /// `seq` resolved against the model (0 -> cfg.max_positions).
  int sequence_length(const model_config& cfg) const;
  /// Throws model_error naming the bad value (non-positive sizes, seq above
  /// the model's context, overlap outside [0, 1], a model of more than
  /// max_planned_layers layers, ...).
  void validate(const model_config& cfg) const;
};

/// FLOPs, parameters and activation memory of one piece of the model for
/// one micro-batch of b sequences of s tokens.
struct layer_cost {
  double forward_flops = 0;
  double backward_flops = 0;    ///< input and weight gradients: 2 x forward for matmuls
  double params = 0;
  double activation_bytes = 0;  ///< kept from forward until backward, per micro-batch
  /// Parameters that train (gradients, moments, DP traffic); -1: all of
  /// `params` (training_setup::lora_block_params sets fewer).
  double trained_params = -1;
  double trained() const { return trained_params < 0 ? params : trained_params; }
  /// The bytes its weights take as held; -1: `params` at the setup's
  /// weight_bytes (training_setup::frozen_block_bytes sets fewer).
  double weight_bytes = -1;
  double held(const training_setup& s) const { return weight_bytes < 0 ? params * s.weight_bytes : weight_bytes; }
};

/// The cost of every piece of a model for one training setup.
struct model_costs {
  std::vector<layer_cost> blocks;  ///< transformer block i (all equal today; indexable for the DP)
  layer_cost embedding;            ///< token (and GPT-2 position) embeddings: first stage
  layer_cost head;                 ///< final norm + LM head + loss: last stage
  /// Parameters of the tied LM head copy the last stage holds when the
  /// model ties head and embeddings and p > 1 (Megatron's embedding group);
  /// its gradient is all-reduced with the first stage's every step.
  double tied_copy_params = 0;
  double boundary_bytes = 0;        ///< activation (= gradient) bytes crossing a stage boundary per micro-batch: b*s*h*bytes
  double head_transient_bytes = 0;  ///< fp32 logits of one micro-batch, alive on the last stage between its forward and backward
  /// QLoRA: one block's weights widened to f32 for its turn, alive on every
  /// stage with blocks (training_setup::frozen_block_bytes); else 0.
  double widened_block_bytes = 0;
  int micro_batch = 0;              ///< b
  int seq = 0;                      ///< s

  /// FLOPs of forward+backward of the whole model for one micro-batch.
  double step_flops_per_micro_batch() const;
};

/// Forward FLOPs of one transformer block of `cfg` on `sequences` x `seq`
/// tokens: 2 x tokens x (matrix parameters) + causal attention 2 x b x s^2 x (Hq x Dh).
double block_forward_flops(const model_config& cfg, int seq, int sequences);
/// Parameters of one transformer block (matrices, biases and norms).
double block_params(const model_config& cfg);
/// Bytes one block keeps for its backward per micro-batch (what
/// model/block.hpp's block_activations holds): tokens x (4h + 2 Hq Dh +
/// 2 Hkv Dh + 3F (Llama) or 2F (GPT-2)) x bytes.
double block_activation_bytes(const model_config& cfg, int seq, int sequences, double bytes);
/// Every cost of `cfg` under `setup` (setup.validate() is called).
model_costs compute_costs(const model_config& cfg, const training_setup& setup);

/// Ring all-reduce of `bytes` over `d` members: 2(d-1)/d x bytes/bandwidth
/// on the slowest ring link, plus 2(d-1) latencies per bucket. 0 for d = 1.
double ring_allreduce_time(int d, double bytes, const link_spec& slowest, int buckets = 1);
/// ZeRO-1 reduction: reduce-scatter of the gradients then all-gather of
/// the updated weights, (d-1)/d x (grad + weight bytes)/bandwidth plus
/// 2(d-1) latencies per bucket; equals the all-reduce when both are the same size.
double zero1_reduction_time(int d, double grad_bytes, double weight_bytes, const link_spec& slowest,
                            int buckets = 1);
/// Micro-batches of activations stage `stage` (0-based) of a p-stage 1F1B
/// pipeline holds at most: min(p - stage, m).
int in_flight_micro_batches(int stage, int pp, int m);
/// Seconds between consecutive micro-batches of a 1F1B pipeline in steady
/// state: max(max_i S_i, max_j x_j, max_{i: m > p-i} R_i / (p - i)), in the
/// notation of pipeline_time().
double pipeline_interval(const std::vector<double>& stage_s, const std::vector<double>& link_s, int m);
/// Seconds of one 1F1B pipeline flush (no DP reduction): every micro-batch
/// passes every stage; S_i = forward + backward of stage i per micro-batch,
/// x_j = one-way link time of boundary j per micro-batch,
/// R_i = sum_{k>=i} S_k + 2 sum_{k>=i} x_k (the round trip from stage i):
///   T = R_0 + (m - 1) * max(max_i S_i, max_j x_j, max_{i: m > p-i} R_i / (p - i)).
/// With uniform stages and free links this is (m + p - 1) * S.
double pipeline_time(const std::vector<double>& stage_s, const std::vector<double>& link_s, int m);
/// The part of a reduction of `reduce_s` seconds not hidden behind a
/// backward of `backward_s`: reduce_s - min(overlap * reduce_s, backward_s).
double exposed_reduction(double reduce_s, double backward_s, double overlap);

/// Memory of one worker of a stage, by kind (bytes).
struct memory_breakdown {
  double weights = 0;
  double grads = 0;
  double optimizer = 0;    ///< divided by d under ZeRO-1
  double activations = 0;  ///< in-flight micro-batches x per-micro-batch bytes (+ logits on the last stage)
  double total() const { return weights + grads + optimizer + activations; }
};
/// Memory of a worker holding `params` parameters and `in_flight` x
/// `activation_bytes` of activations (+ `transient_bytes`), in a DP group
/// of `dp`; gradients and moments of `trained` of them (-1: all); their
/// weights take `weight_bytes` as held (-1: `params` at setup.weight_bytes).
memory_breakdown stage_memory(double params, double activation_bytes, int in_flight,
                              double transient_bytes, int dp, const training_setup& setup, double trained = -1,
                              double weight_bytes = -1);

/// One stage of a layout: blocks [first_layer, last_layer) run by `workers`
/// (replica r of the stage on workers[r]; every stage has the same count).
struct stage_layout {
  std::vector<int> workers;  ///< ranks; workers.size() = d
  int first_layer = 0;
  int last_layer = 0;
};

/// Stages in pipeline order; stage 0 holds the embeddings, the last the head.
struct pipeline_layout {
  std::vector<stage_layout> stages;
  int pp() const { return static_cast<int>(stages.size()); }
  int dp() const { return stages.empty() ? 0 : static_cast<int>(stages.front().workers.size()); }
};

/// What one stage costs in a layout (per worker of the stage).
struct stage_estimate {
  double flops_per_s = 0;   ///< the slowest replica's speed: replicas run in lock-step
  double capacity = 0;      ///< usable bytes of the smallest replica (after headroom)
  double params = 0;        ///< blocks + embeddings/head/tied copy held by this stage
  double forward_s = 0;     ///< per micro-batch
  double backward_s = 0;    ///< per micro-batch
  double send_s = 0;        ///< one-way activation (or gradient) transfer to the next stage per micro-batch; 0 on the last
  link_spec next_link;      ///< slowest link to the next stage over the replicas (concurrent_link)
  link_spec dp_link;        ///< slowest link of the DP ring (concurrent_link)
  int grad_buckets = 1;     ///< gradient buckets of the DP reduction
  double reduce_s = 0;      ///< the DP reduction of this stage's gradients (whole)
  double exposed_reduce_s = 0;  ///< its part not hidden behind the last backward
  double finish_s = 0;      ///< when this stage's last backward ends
  double end_s = 0;         ///< when its reduction (and the embedding sync) ends
  int in_flight = 0;        ///< micro-batches of activations held at the peak
  memory_breakdown memory;
  bool fits = true;         ///< memory.total() <= capacity
};

/// The predicted cost of one optimizer step of a layout.
struct step_estimate {
  std::vector<stage_estimate> stages;
  int micro_batches = 0;       ///< m per replica
  double interval_s = 0;       ///< steady-state time per micro-batch: the slowest stage or link
  double steady_s = 0;         ///< m x interval
  double fill_drain_s = 0;     ///< pipeline_s - steady_s (bubble + link traversals)
  double pipeline_s = 0;       ///< pipeline_time() of the stages
  double embedding_sync_s = 0; ///< tied embedding all-reduce between first and last stage
  double dp_tail_s = 0;        ///< step_s - pipeline_s: exposed reductions after the flush
  double step_s = 0;           ///< predicted seconds per optimizer step
  double bubble_fraction = 0;  ///< 1 - busy compute / (p x pipeline_s)
  double samples_per_s = 0;
  double tokens_per_s = 0;
  double model_flops = 0;      ///< FLOPs of one step (forward + backward, all replicas)
  double flops_per_worker = 0; ///< model_flops / step_s / workers used (the Holmes metric)
  bool fits = true;            ///< every stage fits its memory
  std::string memory_problem;  ///< when !fits: which stage, which worker, how much over, by kind
};

/// Prices `layout` on `cluster` (setup.validate() and the layout's shape are
/// checked: contiguous complete spans, equal replica counts, ranks in range,
/// no worker twice; violations throw model_error). Memory that does not fit
/// is reported in fits/memory_problem, not thrown.
step_estimate estimate_step(const cluster_description& cluster, const model_costs& costs,
                            const training_setup& setup, const pipeline_layout& layout);

/// "12.3 GiB" style, for messages.
std::string format_bytes(double bytes);

}  // namespace corolla::schedule
