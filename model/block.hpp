// model/block.hpp — one transformer block, forward and backward written out.
//
//   Llama:  h = x + o(attn(rope(q(n1)), rope(k(n1)), v(n1))),  n1 = rmsnorm(x)
//           y = h + down(silu(gate(n2)) * up(n2)),             n2 = rmsnorm(h)
//           Qwen2 adds biases to q, k, v (Llama's attention_bias: and o);
//           Qwen3 norms each head of q and k (RMSNorm, one [Dh] weight
//           each) before RoPE; RoPE may be scaled (kernels/rope_spec.hpp).
//   Mixtral, Qwen2-MoE, Qwen3-MoE: Llama's (Qwen2's, Qwen3's) attention,
//           and in place of the MLP a mixture of SwiGLU experts, with
//           Qwen2-MoE's gated shared expert (model/moe.hpp).
//   GPT-2:  the same with layernorm, biases on every linear, no RoPE (learned
//           positions live in the head) and y = h + down(gelu_tanh(up(n2))).
//
// Three entry points:
//  * block_forward: B sequences of T tokens at positions 0..T-1, keeping the
//    activations the backward needs (training, fine-tuning);
//  * block_backward: dx from dy, parameter gradients accumulated (+=);
//  * block_forward_cached: Tq new rows of one sequence at positions
//    start_pos.., their keys and values appended to a kv_sequence (prefill
//    with Tq = prompt length, decode with Tq = 1). It runs in a preallocated
//    workspace and allocates nothing once the workspace has seen Tq rows.
//
// Two more serve a swarm server (model/span_engine.hpp):
//  * block_forward_cached_batch: the new rows of several sequences at once,
//    each against its own kv_sequence (batched decode of concurrent
//    sessions: one GEMM per projection over every session's rows);
//  * block_backward_input: dx only, for servers whose weights are frozen
//    (fine-tuning clients train prompts, not the server's blocks).
//
// Parameters are a param_set in the canonical layout (block_layout), resolved
// once into block_tensors so no hot path looks a name up.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/lora_factors.hpp"
#include "model/moe.hpp"
#include "model/params.hpp"
#include "model/workspace.hpp"

namespace corolla {

/// Canonical names and shapes of one block's parameters for `cfg`, in
/// param_set order (see model/transformer.hpp for the list).
std::vector<std::pair<std::string, shape_t>> block_layout(const model_config& cfg);

/// Whether block tensor `name` of block_layout, shaped `shape`, is a linear
/// weight that inference weights store in their weight format: every matrix
/// but a mixture of experts' router and shared expert gate (they stay f32).
bool stored_in_weight_format(const std::string& name, const shape_t& shape);

/// The attention geometry of `cfg` (default 1/sqrt(Dh) scale).
attention_shape block_attention_shape(const model_config& cfg);

/// Views of one block's tensors by role, taken from a param_set of
/// parameters or of their gradients (same layout). Roles a family lacks stay
/// undefined (Llama's biases unless its config has them, gate for GPT-2). The views share the
/// param_set's storage: writes through them land in the set.
struct block_tensors {
  Tensor attn_norm_w, attn_norm_b;
  Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
  Tensor mlp_norm_w, mlp_norm_b;
  Tensor gate_w, up_w, up_b, down_w, down_b;
  Tensor q_norm_w, k_norm_w;  ///< Qwen3's per-head RMSNorm weights [Dh] of q and k
  /// Mixture-of-experts blocks (model_config::is_moe): the router [E, D] and
  /// the E experts, in place of gate, up and down (which stay undefined);
  /// with a shared expert (model_config::has_shared_expert, Qwen2-MoE) it
  /// is experts[E] (width shared_expert_size) and its gate is
  /// shared_gate_w [1, D] (f32 like the router).
  Tensor router_w, shared_gate_w;
  std::vector<expert_tensors> experts;
  /// Inference weights only (see inference_weights): q, k and v stacked in
  /// one [Hq*Dh + 2*Hkv*Dh, D] tensor whose row slices q_w, k_w, v_w are,
  /// with their biases stacked alike (GPT-2), and Llama's gate and up in one
  /// [2F, D] tensor. A decode step then reads each stack in one product.
  /// Undefined for training weights.
  Tensor qkv_w, qkv_b, gate_up_w;
  /// Quantised inference weights only: the scales of each linear weight,
  /// slices of the stacks' like the weights (int8: one per output channel,
  /// Backend::linear_q8; nf4: one absmax per block of 64 of a row,
  /// Backend::linear_nf4); undefined otherwise.
  Tensor q_s, k_s, v_s, o_s, gate_s, up_s, down_s, qkv_s, gate_up_s;
  /// How the linear weights are stored (f32 for training weights).
  weight_format format = weight_format::f32;
  /// A frozen block whose experts kept their inference format
  /// (stage::frozen_weights): the scratch an expert stored in another
  /// format than `format` is widened into when moe_forward or moe_backward
  /// uses it, one expert at a time, so that only the experts some row is
  /// routed to are dequantised. Null otherwise (every expert must then be
  /// stored as `format`).
  expert_tensors* expert_scratch = nullptr;

  /// Resolves every role of `p` (laid out by block_layout(cfg)); throws
  /// tensor_error if `p` lacks one.
  static block_tensors of(const model_config& cfg, const param_set& p);
};

/// Inference weights of one block: `w` with its linear weights (q, k, v, o,
/// gate, up, down) stored as `f` in fresh tensors on `be`'s device (bf16;
/// int8 quantised per output channel, or nf4 in blocks of 64, each with
/// scales), and norms and biases shared with `w` (they stay f32). With bf16
/// the cached forwards read half the bytes per token (Backend::linear takes
/// a bf16 weight), int8 a quarter, nf4 an eighth (plus an f32 absmax per 64
/// weights); training refuses such weights (linear_backward throws). The
/// copies are stacked (qkv_w, gate_up_w) so that single-row steps run one
/// product per stack. f32 returns `w` itself.
block_tensors inference_weights(Backend& be, const block_tensors& w, weight_format f);

/// Bytes one served block holds in weights with inference weights of format
/// `f`: its f32 parameters (kept for fine-tuning requests and training,
/// unless `with_parameters` is false: an inference-only server, see
/// stage::load_inference, keeps only its norms and biases of them) and,
/// unless f32, the inference copies inference_weights makes (the linear
/// weights as `f` with their scales, the q/k/v biases stacked again).
std::int64_t served_block_bytes(const model_config& cfg, weight_format f, bool with_parameters = true);

/// `w` with every f32 tensor that shares storage with `p` (norms, biases,
/// the router: what inference_weights shares with the parameters) replaced
/// by its own copy on be's device, so that `p` can be freed.
block_tensors own_shared_views(Backend& be, block_tensors w, const param_set& p);

/// f32 weights of the block whose inference weights are `w` (any format),
/// for a training-style forward and backward with frozen weights: the
/// linear weights (shapes from `cfg`) widened into `out`'s own tensors
/// (reused when their shapes match), everything else shared with `w`.
/// With `experts` false a mixture of experts' experts are shared with `w`
/// as they are stored (out.expert_scratch must then be set for them to be
/// widened on use).
void widen_block_weights(Backend& be, const model_config& cfg, const block_tensors& w, block_tensors& out,
                         bool experts = true);

/// Expert `e` (n_experts: the shared expert) of `cfg` stored as `from`
/// (any format) widened to f32 into `out`'s tensors (reused when their
/// shapes match); out.format becomes f32.
void widen_expert_weights(Backend& be, const model_config& cfg, int e, const expert_tensors& from, expert_tensors& out);

/// Training compute weights of one block for mixed precision
/// (stage::set_compute_dtype): fresh `t` (bf16 or f16) tensors on `be`'s
/// device shaped like w's linear weights (q, k, v, o, gate, up, down; of a
/// mixture-of-experts block every expert's gate, up and down, while the
/// router and the shared expert's gate stay f32, shared with `w`) and their
/// biases (a bias of the output's dtype fuses into the product), with
/// the norms' weights and biases shared with `w` (they stay f32: the norm
/// ops take f32 parameters beside 16-bit activations). The values are not
/// filled: copy_linear_weights does that. Throws tensor_error for another
/// dtype.
block_tensors compute_weights_like(Backend& be, const block_tensors& w, dtype t);
/// Copies (converting) the linear weights and biases of `from` into those
/// of `to` (the same block's roles, e.g. master weights into compute copies).
void copy_linear_weights(Backend& be, const block_tensors& from, block_tensors& to);
/// compute_weights_like, but each linear weight and bias a view of `copy`
/// (a flat bf16 or f16 tensor of p's size on p's device) at that role's
/// place in p's flat buffer, so one conversion of p.flat() into copy (or
/// Backend::adamw_with_copy) fills every compute weight at once. w's roles
/// must be views of p.flat() (block_tensors::of(cfg, p)); throws
/// tensor_error otherwise, or for another copy dtype or size.
block_tensors compute_weights_in(const block_tensors& w, const param_set& p, const Tensor& copy);

/// What block_forward keeps for block_backward. Buffers are reused when the
/// same struct sees the same shapes again.
struct block_activations {
  int batch = 0;
  int seq = 0;
  Tensor x;                   ///< the block input [N,D], shared with the caller (kept unchanged)
  Tensor norm1, mean1, rstd1; ///< first norm output [N,D], its mean (GPT-2) and 1/std [N]
  Tensor q, k, v;             ///< projections, after RoPE for Llama [N,Hq*Dh], [N,Hkv*Dh]
  Tensor qkv;                 ///< the projections' outputs (q or q_pre, k or k_pre, v) sliced from it (qkv_stack)
  Tensor q_pre, k_pre;        ///< Qwen3: q and k before their per-head norms
  Tensor rstd_q, rstd_k;      ///< Qwen3: 1/rms of each head's q and k row [N*Hq], [N*Hkv]
  Tensor attn, lse;           ///< attention output [N,Hq*Dh] and its log-sum-exp [B*Hq*T]
  Tensor h;                   ///< x + attention projection [N,D]
  Tensor norm2, mean2, rstd2; ///< second norm
  Tensor gate;                ///< Llama gate projection [N,F]
  Tensor gate_up;             ///< Llama: gate and up sliced from it [2N,F] (row_stack)
  Tensor up;                  ///< Llama up projection / GPT-2 c_fc output before GELU [N,F]
  Tensor act;                 ///< swiglu(gate, up) or gelu(up) [N,F]
  Tensor lora_t;              ///< scratch of a LoRA term's x A^T (block_forward with an adapter; grows only)
  moe_buffers moe;            ///< mixture-of-experts blocks: the routing and the experts' rows
};

/// Scratch of block_backward, grown on demand and reused across blocks.
struct block_grad_scratch {
  Tensor dnorm, dh, dattn, dq, dk, dv, dact, dgate, dup;
  Tensor dq_pre, dk_pre;  ///< Qwen3: gradients before the per-head norms
  /// The q, k and v projections' output gradients (dq or dq_pre, dk or
  /// dk_pre, dv) as slices of it where their widths match (qkv_stack)
  Tensor dqkv;
  Tensor dgate_up;        ///< Llama: dgate and dup as slices of it (as gate and up)
  Tensor lora_t;          ///< a LoRA term's dy B (with an adapter; grows only)
  moe_grad_scratch moe;   ///< mixture-of-experts blocks
  /// Where the norm backward kernels accumulate the weight gradients of
  /// frozen norms (never read; zeroed each call): [D], [D], [head_dim].
  Tensor norm_dw, norm_db, head_norm_dw;
};

/// One sequence's share of a batched cached forward: the next `rows` rows of
/// the batch are that sequence's tokens at positions start_pos ..
/// start_pos+rows-1, written to `kv` (which must have capacity for them).
/// With `lora`, those rows take that adapter's factors (block `layer`'s of
/// it in block_forward_cached_batch) beside the frozen weights.
struct cached_rows {
  kv_sequence* kv = nullptr;
  std::int64_t start_pos = 0;
  std::int64_t rows = 0;
  const span_lora* lora = nullptr;
};

/// Preallocated buffers of block_forward_cached for up to capacity() rows.
/// One workspace serves every block of a stage (they run one after another).
class block_decode_workspace {
 public:
  /// An empty workspace (for moved-from or default-constructed stages).
  block_decode_workspace() = default;
  /// Buffers shaped for `cfg`, allocated on the first reserve().
  explicit block_decode_workspace(const model_config& cfg);
  /// Grows every buffer to `rows` rows (the only allocation the cached path
  /// makes; do it once with the longest prefill chunk to stay allocation-free).
  void reserve(Backend& be, std::int64_t rows);
  /// Rows the buffers hold now.
  std::int64_t capacity() const { return norm_.capacity(); }

 private:
  friend struct cached_forward;  // model/block_cached.cpp: the cached forward of one sequence or a batch
  row_buffer norm_, mean_, rstd_, q_, k_, v_, attn_, tmp_, h_, gate_, up_, act_;
  row_buffer qkv_, gate_up_;  ///< single-row outputs of the stacked products
  row_buffer qn_, kn_;        ///< Qwen3: q and k after their per-head norms
  Tensor lora_t_;             ///< flat scratch of the LoRA terms' x A^T (grows only)
  /// Mixture-of-experts blocks: sized to each call's rows (a change of row
  /// count reallocates, so MoE decode is not allocation-free).
  moe_buffers moe_;
  /// [1, width] views of q, k, v (gate, up) in those rows, made once per buffer.
  Tensor q1_, k1_, v1_, gate1_, up1_;
  const void* views_of_ = nullptr;
};

/// Training forward over `batch` sequences of `seq` tokens (x, y [B*T, D],
/// row = b*T + t). `positions` (i32 [B*T], t for row b*T+t) drives RoPE.
/// Fills `saved` for block_backward; y must not alias x. The activations
/// take x's dtype (y's must equal it): f32, or bf16/f16 with linear weights
/// of that dtype (compute_weights_like) on a backend that computes in it.
/// With `lora`, each adapted linear's output gets its low-rank term beside
/// the frozen weight (model/lora_factors.hpp; factors of the activations'
/// dtype; that product then runs without its fused epilogue); pass the
/// same `lora` to the backward.
void block_forward(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x,
                   const Tensor& positions, int batch, int seq, Tensor& y,
                   block_activations& saved, const block_lora* lora = nullptr);

/// Gradients of frozen linear weights formed otherwise than dW (a LoRA
/// adapter's low-rank factors, model/lora.hpp): block_backward calls add()
/// for each frozen weight (an undefined view in its `grads`) with the
/// weight's input rows `x` [N, in] and the gradient `dy` [N, out] of its
/// output, both in the activations' dtype, where it would have added
/// dy^T x to dW.
class frozen_weight_grads {
 public:
  virtual ~frozen_weight_grads() = default;
  /// `weight`: the block_layout name ("q.weight") of block `layer`.
  virtual void add(Backend& be, int layer, const std::string& weight, const Tensor& x, const Tensor& dy) = 0;
};

/// Backward of block_forward: dx [N,D] overwritten from dy [N,D]; parameter
/// gradients added into `grads` (block_tensors of the gradient param_set,
/// f32 whatever the activations' dtype). dy and dx have the activations'
/// dtype; dx must not alias dy. A linear weight whose view in `grads` is
/// undefined is frozen: only the input's gradient goes through it (its
/// bias's view must be undefined too), and `frozen`, when given, hears of
/// it as block `layer`'s. A norm whose weight view is undefined is frozen
/// too (its bias's view must then be undefined): its gradient is formed
/// into scratch and dropped. With every view undefined no parameter
/// gradient is formed (block_backward_input). `lora`: the forward's; each
/// adapted weight's input gradient gets its term's, s (dy B) A.
void block_backward(Backend& be, const model_config& cfg, const block_tensors& w,
                    const block_activations& saved, const Tensor& positions, const Tensor& dy,
                    Tensor& dx, block_tensors& grads, block_grad_scratch& scratch,
                    frozen_weight_grads* frozen = nullptr, int layer = 0, const block_lora* lora = nullptr);

/// Inference forward of x [Tq, D] at positions start_pos .. start_pos+Tq-1
/// (`positions`, i32 [Tq], holds them): appends this block's keys and values
/// to layer `layer` of `kv` (which must have capacity, see
/// kv_sequence::reserve) and attends over everything cached. y [Tq, D] may
/// alias x. With `lora`, each adapted linear's output gets its low-rank term
/// (model/lora_factors.hpp; the fused single-row paths then run unfused).
void block_forward_cached(Backend& be, const model_config& cfg, const block_tensors& w,
                          const Tensor& x, const Tensor& positions, kv_sequence& kv, int layer,
                          std::int64_t start_pos, block_decode_workspace& ws, Tensor& y,
                          const block_lora* lora = nullptr);

/// Block_forward_cached for several sequences at once: x [R, D] stacks each
/// entry of `seqs` in order (entry i owns the next seqs[i].rows rows),
/// `positions` (i32 [R]) holds every row's own position. The norms, the
/// q/k/v/o and MLP projections and RoPE run once over all R rows; each
/// sequence's keys and values go to layer `layer` of its own cache and its
/// rows attend only to that cache. Row for row the result equals
/// block_forward_cached run per sequence (up to GEMM rounding). The rows
/// must sum to R; y [R, D] may alias x. A sequence with an adapter
/// (cached_rows::lora) gets its terms on its own rows only.
void block_forward_cached_batch(Backend& be, const model_config& cfg, const block_tensors& w,
                                const Tensor& x, const Tensor& positions,
                                std::span<const cached_rows> seqs, int layer,
                                block_decode_workspace& ws, Tensor& y);

/// The input gradient of block_forward without parameter gradients: dx
/// [N,D] overwritten from dy [N,D], given the activations `saved`
/// (block_backward with every gradient view undefined). Skips the
/// weight-gradient GEMMs (two thirds of a full backward's work) and needs no
/// gradient buffers, so a server with frozen weights can serve backward
/// requests without doubling its memory. dx must not alias dy. `lora`: the
/// forward's (its terms' input gradients, s (dy B) A, are added).
void block_backward_input(Backend& be, const model_config& cfg, const block_tensors& w,
                          const block_activations& saved, const Tensor& positions,
                          const Tensor& dy, Tensor& dx, block_grad_scratch& scratch,
                          const block_lora* lora = nullptr);

}  // namespace corolla
