// schedule/cost_model.cpp — FLOPs, bytes and seconds of a layout.
//
// The model is deliberately simple and explicit (docs/planner.md walks
// through it): compute time = FLOPs / effective FLOP/s of the slowest
// replica; a transfer = latency + bytes / bandwidth; DP reductions are ring
// collectives on the group's slowest link; a 1F1B step is one pipeline
// flush followed by whatever part of the DP reduction the last backward did
// not hide. Element-wise work (norms, softmax, optimizer update) is left
// out: it is a few percent of a transformer's FLOPs and the same for every
// layout, so it does not change which layout wins.
#include "schedule/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "model/error.hpp"

namespace corolla::schedule {

// ---- setup --------------------------------------------------------------------

void training_setup::set_precision(precision p) {
  if (p == precision::bf16_mixed) {
    // 2 + 2 + 12 = 16 bytes per parameter: bf16 weights and gradients, fp32
    // master weights and the two AdamW moments (the ZeRO paper's count).
    weight_bytes = 2;
    grad_bytes = 2;
    optimizer_bytes = 12;
    activation_bytes = 2;
  } else {
    // fp32 weights are their own master copy: only the moments are extra.
    weight_bytes = 4;
    grad_bytes = 4;
    optimizer_bytes = 8;
    activation_bytes = 4;
  }
}

int training_setup::micro_batches(int dp_width) const {
  if (dp_width <= 0 || micro_batch <= 0) return 0;
  long long per_step = static_cast<long long>(dp_width) * micro_batch;
  if (global_batch % per_step != 0) return 0;
  return static_cast<int>(global_batch / per_step);
}

int training_setup::sequence_length(const model_config& cfg) const {
  return seq > 0 ? seq : cfg.max_positions;
}

void training_setup::validate(const model_config& cfg) const {
  auto fail = [](const std::string& what) { throw model_error(what); };
  if (global_batch <= 0) fail("the global batch must be positive, got " + std::to_string(global_batch));
  if (micro_batch <= 0) fail("the micro-batch must be positive, got " + std::to_string(micro_batch));
  if (global_batch % micro_batch != 0)
    fail("the global batch (" + std::to_string(global_batch) + ") is not a multiple of the micro-batch (" +
         std::to_string(micro_batch) + ")");
  if (seq < 0) fail("the sequence length must be positive, got " + std::to_string(seq));
  if (seq > cfg.max_positions)
    fail("the sequence length " + std::to_string(seq) + " exceeds the model's context of " +
         std::to_string(cfg.max_positions) + " tokens");
  if (!(weight_bytes > 0) || !(grad_bytes > 0) || !(activation_bytes > 0) || !(optimizer_bytes >= 0))
    fail("bytes per weight, gradient and activation must be positive");
  if (!(dp_overlap >= 0 && dp_overlap <= 1))
    fail("the DP overlap fraction must be in [0, 1], got " + std::to_string(dp_overlap));
  if (!(memory_headroom >= 0 && memory_headroom < 1))
    fail("the memory headroom must be in [0, 1), got " + std::to_string(memory_headroom));
  if (!(bucket_bytes > 0)) fail("the gradient bucket size must be positive");
  if (!(lora_block_params >= 0) || !std::isfinite(lora_block_params))
    fail("the adapter's values per block must be >= 0 (0: the whole model trains)");
  if (!(frozen_block_bytes >= 0) || !std::isfinite(frozen_block_bytes))
    fail("the bytes of a block's frozen weights must be >= 0 (0: its parameters)");
  if (frozen_block_bytes > 0 && lora_block_params == 0)
    fail("frozen weights in another format (QLoRA) carry an adapter: the whole model trains only in its parameters");
  if (pp < 0 || dp < 0) fail("a forced pipeline depth or DP width must be positive");
  // The partition's dynamic program is O(stages x layers^2) for each
  // layout it prices; the deepest published models have under 200 layers.
  if (cfg.n_layers > max_planned_layers)
    fail("the planner splits models of at most " + std::to_string(max_planned_layers) + " layers; this one has " +
         std::to_string(cfg.n_layers));
  if (pp > cfg.n_layers)
    fail("a pipeline of " + std::to_string(pp) + " stages needs at least as many layers; the model has " +
         std::to_string(cfg.n_layers));
  if (dp > 0 && micro_batches(dp) == 0)
    fail("the global batch (" + std::to_string(global_batch) + ") is not divisible by DP width " +
         std::to_string(dp) + " x micro-batch " + std::to_string(micro_batch));
}

// ---- per-layer costs ------------------------------------------------------------

namespace {

/// Parameters of the matrices a token is multiplied with in one block: with
/// a mixture of experts, the router and the k experts the token is routed
/// to (`stored`: all E experts, the parameters the block holds).
double block_matrix_params(const model_config& cfg, bool stored = false) {
  const double D = cfg.hidden_size, F = cfg.intermediate_size;
  const double q = static_cast<double>(cfg.n_heads) * cfg.head_dim;
  const double kv = static_cast<double>(cfg.n_kv_heads) * cfg.head_dim;
  // attention: Q, K, V in, O out; MLP: gate + up + down (Llama) or fc + proj (GPT-2)
  double attention = D * q + 2 * D * kv + q * D;
  double mlp = cfg.arch == architecture::llama ? 3 * D * F : 2 * D * F;
  if (cfg.is_moe()) mlp = D * cfg.n_experts + mlp * (stored ? cfg.n_experts : cfg.experts_per_token);
  // Qwen2-MoE's shared expert and its gate: every token goes through them.
  if (cfg.has_shared_expert()) mlp += 3 * D * cfg.shared_expert_size + D;
  return attention + mlp;
}

}  // namespace

double block_forward_flops(const model_config& cfg, int seq, int sequences) {
  const double tokens = static_cast<double>(seq) * sequences;
  const double q = static_cast<double>(cfg.n_heads) * cfg.head_dim;
  // A matmul costs 2 FLOPs per weight per token. Attention scores QK^T and
  // the weighted sum AV each cost 2*s*s*q per sequence for a full square;
  // causal attention computes half of it: 2 * b * s^2 * q in total.
  double matmuls = 2.0 * tokens * block_matrix_params(cfg);
  double attention = 2.0 * sequences * static_cast<double>(seq) * seq * q;
  return matmuls + attention;
}

double block_params(const model_config& cfg) {
  const double D = cfg.hidden_size, F = cfg.intermediate_size;
  const double q = static_cast<double>(cfg.n_heads) * cfg.head_dim;
  const double kv = static_cast<double>(cfg.n_kv_heads) * cfg.head_dim;
  if (cfg.arch == architecture::gpt2) {
    // ln_1 (w, b), c_attn (+bias), attn c_proj (+bias), ln_2, c_fc (+bias), mlp c_proj (+bias)
    return 2 * D + (D * (q + 2 * kv) + q + 2 * kv) + (q * D + D) + 2 * D + (D * F + F) + (F * D + D);
  }
  // two RMSNorm weights + the matrices, and the family's extras: q/k/v
  // biases (Qwen2, attention_bias), the o bias, Qwen3's q/k norm weights
  double extras = 0;
  if (cfg.qkv_bias) extras += q + 2 * kv;
  if (cfg.o_bias) extras += D;
  if (cfg.qk_norm) extras += 2.0 * cfg.head_dim;
  return 2 * D + block_matrix_params(cfg, true) + extras;
}

double block_activation_bytes(const model_config& cfg, int seq, int sequences, double bytes) {
  const double tokens = static_cast<double>(seq) * sequences;
  const double D = cfg.hidden_size, F = cfg.intermediate_size;
  const double q = static_cast<double>(cfg.n_heads) * cfg.head_dim;
  const double kv = static_cast<double>(cfg.n_kv_heads) * cfg.head_dim;
  // Per token, as model/block.hpp keeps them: input x, norm1 output, q, k,
  // v, attention output, residual h, norm2 output (4D + 2q + 2kv), then
  // the MLP: gate, up and swiglu output (3F) for Llama, fc output and GELU
  // output (2F) for GPT-2. Per-row norm statistics and the attention
  // log-sum-exp are O(tokens) and left out; attention probabilities are
  // never stored (fused attention recomputes them). Qwen3 also keeps q and
  // k before their per-head norms (q + kv).
  double per_token = 4 * D + 2 * q + 2 * kv + (cfg.arch == architecture::llama ? 3 * F : 2 * F);
  double f32_per_token = 0;  // kept in f32 whatever `bytes` says
  if (cfg.is_moe()) {
    // A mixture of experts keeps k copies of each row (gathered input,
    // three F-wide, the output) and the router's f32 logits; in 16-bit
    // compute also the router's f32 copy of its input (model/moe.hpp).
    per_token = 4 * D + 2 * q + 2 * kv + cfg.experts_per_token * (2 * D + 3 * F);
    f32_per_token = cfg.n_experts + (bytes < 4.0 ? D : 0.0);
  }
  // A shared expert keeps its three S-wide rows, its output and its gate.
  if (cfg.has_shared_expert()) per_token += 3.0 * cfg.shared_expert_size + D + 1;
  if (cfg.qk_norm) per_token += q + kv;
  return tokens * (per_token * bytes + f32_per_token * 4.0);
}

double model_costs::step_flops_per_micro_batch() const {
  double f = embedding.forward_flops + embedding.backward_flops + head.forward_flops + head.backward_flops;
  for (const auto& b : blocks) f += b.forward_flops + b.backward_flops;
  return f;
}

model_costs compute_costs(const model_config& cfg, const training_setup& setup) {
  setup.validate(cfg);
  const int s = setup.sequence_length(cfg);
  const int b = setup.micro_batch;
  const double tokens = static_cast<double>(s) * b;
  const double D = cfg.hidden_size, V = cfg.vocab_size;

  model_costs c;
  c.micro_batch = b;
  c.seq = s;
  layer_cost block;
  block.forward_flops = block_forward_flops(cfg, s, b);
  // Backward computes the input gradient and the weight gradient of every
  // matmul (and attention's two products): twice the forward.
  // With a LoRA adapter the weights are frozen: input gradients only (the
  // adapter's low-rank products are small against them).
  const bool lora = setup.lora_block_params > 0;
  block.backward_flops = (lora ? 1 : 2) * block.forward_flops;
  block.params = block_params(cfg);
  if (lora) block.trained_params = setup.lora_block_params;
  if (setup.frozen_block_bytes > 0) {
    block.weight_bytes = setup.frozen_block_bytes;
    // What stage::frozen_weights widens at once: all of the block but a
    // mixture's experts, of which one (each is widened when rows are
    // routed to it).
    const double expert = (cfg.arch == architecture::llama ? 3.0 : 2.0) * D * cfg.intermediate_size;
    const double other_experts = cfg.is_moe() ? (cfg.n_experts - 1) * expert : 0.0;
    c.widened_block_bytes = (block.params - other_experts) * 4.0;
  }
  block.activation_bytes = block_activation_bytes(cfg, s, b, setup.activation_bytes);
  c.blocks.assign(cfg.n_layers, block);

  // Embeddings: a table lookup (no FLOPs to speak of) but V*D parameters
  // (+ learned positions for GPT-2) to store, update and reduce.
  c.embedding.params = V * D + (cfg.arch == architecture::gpt2 ? double(cfg.max_positions) * D : 0.0);
  if (lora) c.embedding.trained_params = 0;

  // Head: final norm + LM head matmul (2 FLOPs per weight per token, x2
  // backward) + loss. It keeps the final norm's input and output.
  double final_norm = cfg.arch == architecture::gpt2 ? 2 * D : D;
  c.head.forward_flops = 2 * tokens * D * V;
  c.head.backward_flops = (lora ? 1 : 2) * c.head.forward_flops;  // frozen: the input gradient only
  c.head.params = final_norm + (cfg.tie_embeddings ? 0.0 : V * D);
  if (lora) c.head.trained_params = 0;
  c.head.activation_bytes = 2 * tokens * D * setup.activation_bytes;
  c.tied_copy_params = cfg.tie_embeddings ? V * D : 0.0;

  // What crosses a stage boundary: the hidden state b*s*h forward and its
  // gradient (same size) backward.
  c.boundary_bytes = tokens * D * setup.activation_bytes;
  // Logits are computed in fp32 for the loss, for one micro-batch at a time.
  c.head_transient_bytes = tokens * V * 4.0;
  return c;
}

// ---- formulas ---------------------------------------------------------------------

double ring_allreduce_time(int d, double bytes, const link_spec& slowest, int buckets) {
  if (d <= 1 || bytes <= 0) return 0.0;
  // A ring all-reduce is a reduce-scatter plus an all-gather: 2(d-1) steps,
  // each moving bytes/d over every link at once, so the slowest link paces
  // it; each step of each bucket pays one latency.
  double volume = 2.0 * (d - 1) / d * bytes;
  double transfer = std::isinf(slowest.bandwidth) ? 0.0 : volume / slowest.bandwidth;
  return transfer + 2.0 * (d - 1) * slowest.latency * std::max(1, buckets);
}

double zero1_reduction_time(int d, double grad_bytes, double weight_bytes, const link_spec& slowest,
                            int buckets) {
  if (d <= 1) return 0.0;
  // Reduce-scatter the gradients ((d-1)/d of them cross each link), each
  // member updates its shard, then all-gather the weights.
  double volume = (d - 1.0) / d * (grad_bytes + weight_bytes);
  double transfer = std::isinf(slowest.bandwidth) ? 0.0 : volume / slowest.bandwidth;
  return transfer + 2.0 * (d - 1) * slowest.latency * std::max(1, buckets);
}

int in_flight_micro_batches(int stage, int pp, int m) { return std::max(0, std::min(pp - stage, m)); }

double pipeline_interval(const std::vector<double>& stage_s, const std::vector<double>& link_s, int m) {
  // The pipeline issues one micro-batch per interval: at least the slowest
  // stage or link (links are full duplex and sends are asynchronous, so a
  // link is its own station). 1F1B also caps the micro-batches in flight:
  // stage i holds at most p - i, and each one needs the round trip R_i
  // through stages i..p-1 and back before its slot frees, so with slow
  // links the interval is at least R_i / (p - i) (when m fills the window).
  const int p = static_cast<int>(stage_s.size());
  double interval = 0, round_trip = 0;
  for (int i = p - 1; i >= 0; --i) {
    round_trip += stage_s[i];
    if (i + 1 < p && i < static_cast<int>(link_s.size())) {
      round_trip += 2 * link_s[i];
      interval = std::max(interval, link_s[i]);
    }
    interval = std::max(interval, stage_s[i]);
    if (m > p - i) interval = std::max(interval, round_trip / (p - i));
  }
  return interval;
}

double pipeline_time(const std::vector<double>& stage_s, const std::vector<double>& link_s, int m) {
  // The first micro-batch crosses every stage and link forward, and the
  // last one crosses them all backward: R_0 = sum S_i + 2 sum x_j (the
  // forward and backward halves of S_i together give sum S_i); the other
  // m - 1 follow one interval apart. With p equal stages S and free links
  // this is the textbook (m + p - 1) * S of 1F1B.
  double round_trip = 0;
  for (std::size_t i = 0; i < stage_s.size(); ++i) {
    round_trip += stage_s[i];
    if (i + 1 < stage_s.size() && i < link_s.size()) round_trip += 2 * link_s[i];
  }
  return round_trip + std::max(0, m - 1) * pipeline_interval(stage_s, link_s, m);
}

double exposed_reduction(double reduce_s, double backward_s, double overlap) {
  // Buckets are reduced while the last micro-batch's backward still runs,
  // but only a share of the reduction can start early and none of it can
  // be hidden behind more than that backward.
  return reduce_s - std::min(overlap * reduce_s, backward_s);
}

memory_breakdown stage_memory(double params, double activation_bytes, int in_flight,
                              double transient_bytes, int dp, const training_setup& setup, double trained,
                              double weight_bytes) {
  if (trained < 0) trained = params;
  memory_breakdown m;
  m.weights = weight_bytes < 0 ? params * setup.weight_bytes : weight_bytes;
  m.grads = trained * setup.grad_bytes;
  m.optimizer = trained * setup.optimizer_bytes / (setup.zero1 ? std::max(1, dp) : 1);
  m.activations = in_flight * activation_bytes + transient_bytes;
  return m;
}

std::string format_bytes(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / gib(1));
  return buf;
}

// ---- a whole layout -------------------------------------------------------------------

namespace {

void check_layout(const cluster_description& cluster, const model_costs& costs,
                  const pipeline_layout& layout) {
  auto fail = [](const std::string& what) { throw model_error("invalid pipeline layout: " + what); };
  if (layout.stages.empty()) fail("no stages");
  const int d = layout.dp();
  if (d <= 0) fail("stage 0 has no workers");
  int expected_first = 0;
  std::set<int> seen;
  for (int i = 0; i < layout.pp(); ++i) {
    const stage_layout& s = layout.stages[i];
    if (static_cast<int>(s.workers.size()) != d)
      fail("stage " + std::to_string(i) + " has " + std::to_string(s.workers.size()) +
           " replicas, stage 0 has " + std::to_string(d));
    if (s.first_layer != expected_first || s.last_layer <= s.first_layer)
      fail("stage " + std::to_string(i) + " spans layers [" + std::to_string(s.first_layer) + ", " +
           std::to_string(s.last_layer) + "); spans must be non-empty, contiguous and start at " +
           std::to_string(expected_first));
    expected_first = s.last_layer;
    for (int r : s.workers) {
      if (r < 0 || r >= cluster.size()) fail("rank " + std::to_string(r) + " is not in the cluster");
      if (!seen.insert(r).second) fail("worker " + cluster.workers[r].name + " is used twice");
    }
  }
  if (expected_first != static_cast<int>(costs.blocks.size()))
    fail("the stages cover " + std::to_string(expected_first) + " of " +
         std::to_string(costs.blocks.size()) + " layers");
}

}  // namespace

step_estimate estimate_step(const cluster_description& cluster, const model_costs& costs,
                            const training_setup& setup, const pipeline_layout& layout) {
  check_layout(cluster, costs, layout);
  const int p = layout.pp(), d = layout.dp();
  const int m = setup.micro_batches(d);
  if (m == 0)
    throw model_error("the global batch (" + std::to_string(setup.global_batch) +
                      ") is not divisible by DP width " + std::to_string(d) + " x micro-batch " +
                      std::to_string(setup.micro_batch));

  step_estimate e;
  e.micro_batches = m;
  e.stages.resize(p);
  std::vector<double> stage_s(p), link_s(p > 1 ? p - 1 : 0);
  for (int i = 0; i < p; ++i) {
    const stage_layout& sl = layout.stages[i];
    stage_estimate& st = e.stages[i];
    st.flops_per_s = std::numeric_limits<double>::infinity();
    st.capacity = std::numeric_limits<double>::infinity();
    for (int r : sl.workers) {
      // Replicas run in lock-step (the DP reduction waits for all), so the
      // slowest one sets the pace and the smallest one the memory.
      st.flops_per_s = std::min(st.flops_per_s, cluster.workers[r].flops);
      st.capacity = std::min(st.capacity, cluster.workers[r].memory * (1.0 - setup.memory_headroom));
    }
    double fwd = 0, bwd = 0, act = 0, trained = 0, held = 0;
    for (int l = sl.first_layer; l < sl.last_layer; ++l) {
      fwd += costs.blocks[l].forward_flops;
      bwd += costs.blocks[l].backward_flops;
      act += costs.blocks[l].activation_bytes;
      st.params += costs.blocks[l].params;
      trained += costs.blocks[l].trained();
      held += costs.blocks[l].held(setup);
    }
    double transient = sl.last_layer > sl.first_layer ? costs.widened_block_bytes : 0.0;
    if (i == 0) {
      fwd += costs.embedding.forward_flops;
      bwd += costs.embedding.backward_flops;
      act += costs.embedding.activation_bytes;
      st.params += costs.embedding.params;
      trained += costs.embedding.trained();
      held += costs.embedding.held(setup);
    }
    if (i == p - 1) {
      fwd += costs.head.forward_flops;
      bwd += costs.head.backward_flops;
      act += costs.head.activation_bytes;
      const double tied = p > 1 ? costs.tied_copy_params : 0.0;
      st.params += costs.head.params + tied;
      trained += costs.head.trained() + (p > 1 && costs.head.trained() > 0 ? costs.tied_copy_params : 0.0);
      held += costs.head.held(setup) + tied * setup.weight_bytes;
      transient += costs.head_transient_bytes;
    }
    st.forward_s = fwd / st.flops_per_s;
    st.backward_s = bwd / st.flops_per_s;
    stage_s[i] = st.forward_s + st.backward_s;

    st.in_flight = in_flight_micro_batches(i, p, m);
    st.memory = stage_memory(st.params, act, st.in_flight, transient, d, setup, trained, held);
    st.fits = st.memory.total() <= st.capacity;

    if (i + 1 < p) {
      // Replica r of stage i feeds replica r of stage i+1; all replicas
      // move in lock-step, so the slowest pair is the boundary's link, and
      // the replicas that cross to another cluster share that link.
      std::vector<std::pair<int, int>> pairs;
      for (int r = 0; r < d; ++r) pairs.emplace_back(sl.workers[r], layout.stages[i + 1].workers[r]);
      st.next_link = cluster.concurrent_link(pairs);
      st.send_s = st.next_link.time(costs.boundary_bytes);
      link_s[i] = st.send_s;
    }
    std::vector<std::pair<int, int>> ring;
    for (int r = 0; d > 1 && r < d; ++r) ring.emplace_back(sl.workers[r], sl.workers[(r + 1) % d]);
    st.dp_link = cluster.concurrent_link(ring);
    // What the DP group reduces and gathers: the trained parameters.
    double grad_total = trained * setup.grad_bytes;
    st.grad_buckets = std::max(1, static_cast<int>(std::ceil(grad_total / setup.bucket_bytes)));
    st.reduce_s = setup.zero1 ? zero1_reduction_time(d, grad_total, trained * setup.weight_bytes,
                                                     st.dp_link, st.grad_buckets)
                              : ring_allreduce_time(d, grad_total, st.dp_link, st.grad_buckets);
    st.exposed_reduce_s = exposed_reduction(st.reduce_s, st.backward_s, setup.dp_overlap);
  }

  e.pipeline_s = pipeline_time(stage_s, link_s, m);
  e.interval_s = pipeline_interval(stage_s, link_s, m);
  e.steady_s = m * e.interval_s;
  e.fill_drain_s = e.pipeline_s - e.steady_s;

  // The last backward drains from the last stage to stage 0: stage i is
  // done that much earlier than stage 0, and its reduction can start then.
  double drain = 0;
  for (int i = 0; i < p; ++i) {
    e.stages[i].finish_s = e.pipeline_s - drain;
    e.stages[i].end_s = e.stages[i].finish_s + e.stages[i].exposed_reduce_s;
    drain += e.stages[i].backward_s + (i + 1 < p ? link_s[i] : 0.0);
  }
  // Tied embeddings: the head copy's gradient is all-reduced with stage 0
  // (per replica) once stage 0 finishes; stage 0's embedding shard cannot
  // be reduced over DP before that.
  if (p > 1 && costs.tied_copy_params > 0 && costs.head.trained() > 0) {
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r < d; ++r) pairs.emplace_back(layout.stages[0].workers[r], layout.stages[p - 1].workers[r]);
    e.embedding_sync_s = ring_allreduce_time(2, costs.tied_copy_params * setup.grad_bytes,
                                             cluster.concurrent_link(pairs));
    e.stages[0].end_s += e.embedding_sync_s;
    e.stages[p - 1].end_s = std::max(e.stages[p - 1].end_s, e.pipeline_s + e.embedding_sync_s);
  }
  e.step_s = e.pipeline_s;
  double busy = 0;
  for (int i = 0; i < p; ++i) {
    e.step_s = std::max(e.step_s, e.stages[i].end_s);
    busy += m * stage_s[i];
  }
  e.dp_tail_s = e.step_s - e.pipeline_s;
  e.bubble_fraction = e.pipeline_s > 0 ? 1.0 - busy / (p * e.pipeline_s) : 0.0;

  e.model_flops = static_cast<double>(d) * m * costs.step_flops_per_micro_batch();
  e.samples_per_s = setup.global_batch / e.step_s;
  e.tokens_per_s = e.samples_per_s * costs.seq;
  e.flops_per_worker = e.model_flops / e.step_s / (static_cast<double>(p) * d);

  // Memory: report the stage furthest over its capacity.
  double worst_ratio = 0;
  int worst = -1;
  for (int i = 0; i < p; ++i) {
    double ratio = e.stages[i].memory.total() / e.stages[i].capacity;
    if (!e.stages[i].fits && ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst >= 0) {
    e.fits = false;
    const stage_estimate& st = e.stages[worst];
    const stage_layout& sl = layout.stages[worst];
    int small = sl.workers.front();
    for (int r : sl.workers)
      if (cluster.workers[r].memory < cluster.workers[small].memory) small = r;
    const worker_spec& w = cluster.workers[small];
    e.memory_problem =
        "stage " + std::to_string(worst) + " of " + std::to_string(p) + " (layers " +
        std::to_string(sl.first_layer) + "-" + std::to_string(sl.last_layer - 1) +
        (worst == 0 ? " + embeddings" : "") + (worst == p - 1 ? " + LM head" : "") + ", DP " +
        std::to_string(d) + ") needs " + format_bytes(st.memory.total()) + " per worker (weights " +
        format_bytes(st.memory.weights) + ", gradients " + format_bytes(st.memory.grads) +
        ", optimizer " + format_bytes(st.memory.optimizer) + ", activations " +
        format_bytes(st.memory.activations) + " for " + std::to_string(st.in_flight) + (st.in_flight == 1 ? " micro-batch" : " micro-batches") + " in flight) but worker " + w.name + " (" + w.model + ") has " +
        format_bytes(st.capacity) + " usable (" + format_bytes(w.memory) + " less " +
        std::to_string(static_cast<int>(std::lround(setup.memory_headroom * 100))) + "% headroom)";
  }
  return e;
}

}  // namespace corolla::schedule
