// model/moe.hpp — the mixture-of-experts MLP of Mixtral, Qwen2-MoE and
// Qwen3-MoE blocks, in place of the dense SwiGLU MLP (model/block.hpp):
//
//   p = softmax(router(x))                   per row, over the E experts
//   e_1..e_k = the k largest p (top-k), w_j = p[e_j]
//              (/ sum_j p[e_j] with norm_topk_prob: Mixtral always)
//   y = sum_j w_j * down_ej(silu(gate_ej(x)) * up_ej(x))
//   Qwen2-MoE's shared expert s, which every row goes through:
//   y += sigmoid(shared_gate(x)) * down_s(silu(gate_s(x)) * up_s(x))
//
// exactly as HuggingFace's MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock
// and Qwen3MoeSparseMoeBlock compute it (softmax in f32, the top-k weights
// renormalised in f32). The shared expert is one more product per
// projection over all N rows; its gate's N logits come to the host with the
// router's (sigmoid there) and scale its rows as moe_combine adds them.
//
// Rows are routed on the host: the router's [N, E] logits come back (one
// small copy per block; on a GPU, one synchronisation), each row's k
// (row, slot) pairs are sorted by expert into one [N*k, D] tensor where
// expert e's rows are one contiguous range (Backend::moe_gather), and every
// expert runs one product per projection over all of its rows: experts are
// grouped GEMMs, not a loop over tokens. Backend::moe_combine sums each
// row's k expert outputs back, weighted, in slot order (deterministic).
//
// Backward: moe_combine_weight_grad gives dL/dw_j; the host turns it into
// the router logits' gradient (through the renormalisation and the
// softmax; experts not chosen get no gradient through w, as in HF, where
// top-k is a selection); the experts' products run backward per expert; and
// dx sums each row's k expert input gradients plus the router's.
//
// No auxiliary load-balancing loss: the loss is the language-model loss,
// as HF computes it with output_router_logits = false (their default).
// Activations take x's dtype: f32, or bf16 / f16 in mixed-precision
// training (stage::set_compute_dtype), where the experts run on 16-bit
// compute copies (compute_weights_like) and their rows are 16-bit. The
// router and the shared expert's gate stay f32 ("selective precision", as
// Switch Transformers' router_dtype float32 and Megatron-Core's
// moe_router_dtype fp32): they read x widened to f32, so their logits, the
// routing weights and every gradient through them are f32, and the top-k
// sees no rounding of the router's product (only of x); their input
// gradients are rounded once before they are added to dx. The parameters'
// gradients are f32.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"

namespace corolla {

struct block_tensors;

/// One expert's SwiGLU weights: gate [F, D], up [F, D], down [D, F] (f32
/// parameters, or inference copies of the block's weight format with their
/// scales; the scales stay undefined for f32 and bf16).
struct expert_tensors {
  Tensor gate_w, up_w, down_w;
  Tensor gate_s, up_s, down_s;
  /// How gate, up and down are stored: their block's format
  /// (block_tensors::format), except in a frozen block whose experts keep
  /// their inference format and are widened when used
  /// (block_tensors::expert_scratch).
  weight_format format = weight_format::f32;
};

/// The width of expert `e` of a block of `cfg`: intermediate_size, or
/// shared_expert_size for the shared expert (e == n_experts).
inline std::int64_t expert_width(const model_config& cfg, int e) {
  return e == cfg.n_experts ? cfg.shared_expert_size : cfg.intermediate_size;
}

/// The share of the routed experts' weights one token reads: k / E of a
/// mixture of experts (its shared expert, which every token goes through,
/// is not a routed one), 1 otherwise.
inline double routed_expert_share(const model_config& cfg) {
  return cfg.is_moe() ? static_cast<double>(cfg.experts_per_token) / cfg.n_experts : 1.0;
}

/// Whether a block parameter's name (block_layout) is a routed expert's
/// ("experts.E.gate.weight"; the shared expert's are "shared.*").
inline bool is_routed_expert_param(const std::string& name) { return name.rfind("experts.", 0) == 0; }

/// Where N rows go: the top-k experts of each row and the order of the
/// expert-sorted rows. Host tensors (indices are uploaded by the ops that
/// take them), with device copies of the weights.
struct moe_routing {
  std::int64_t rows = 0;        ///< N
  int k = 0;                    ///< experts per row
  int experts = 0;              ///< E
  bool renormalised = false;    ///< the top-k weights were divided by their sum
  Tensor logits;                ///< host f32 [N, E]: the router's output
  std::vector<float> probs;     ///< softmax of each row's logits [N * E]
  std::vector<std::int32_t> chosen;  ///< the expert of (row t, slot j) [N * k], largest p first
  /// Expert e's rows are [offsets[e], offsets[e + 1]) of the sorted rows (E + 1 entries).
  std::vector<std::int64_t> offsets;
  Tensor slots;                 ///< host i32 [N, k]: the sorted row of (row t, slot j)
  Tensor sorted_rows;           ///< host i32 [N * k]: the input row of each sorted row
  Tensor weights_host;          ///< host f32 [N, k]: w_j of (row t, slot j)
  Tensor row_weights_host;      ///< host f32 [N * k]: the weight of each sorted row
  Tensor weights, row_weights;  ///< the two weight tensors on the backend's device
};

/// Routes N rows of router logits (host f32 [N, E] in r.logits) to their
/// top `k` experts: fills everything but the device copies. Ties go to the
/// lower expert index.
void route_rows(int k, bool renormalise, moe_routing& r);

/// How close row `t` of routing `r` came to another choice of experts: the
/// gap between its k-th and (k+1)-th largest router logit, relative to the
/// spread of its logits (largest - smallest); 0 for a tie (all logits
/// equal included), +inf when every expert is chosen (k == E). Two
/// computations of the row whose logits differ by less than this (relative
/// to the spread) choose the same experts.
float routing_margin(const moe_routing& r, std::int64_t t);

/// The gradient of the router logits (host f32 [N, E], overwritten) from
/// that of the routing weights (host f32 [N, k]), for routing `r`.
void route_rows_backward(const moe_routing& r, const Tensor& dweights, Tensor& dlogits);

/// What one MoE forward computes: kept for the backward in training, reused
/// as the workspace of the cached (inference) forwards. Grown on demand.
struct moe_buffers {
  Tensor logits;                 ///< [N, E] on the device
  moe_routing route;
  Tensor xs, gate, up, act, ys;  ///< the expert-sorted rows: [N*k, D], three [N*k, F], [N*k, D]
  /// Views of one expert's rows of those five, kept so that a decode step
  /// allocates nothing (Tensor::slice_into).
  Tensor xe, ge, ue, ae, ye;
  /// The shared expert (Qwen2-MoE): its gate's logits [N, 1], their sigmoid
  /// (host, and on the device), its rows' three [N, S] products and output
  /// [N, D], and the rows 0..N-1 (host i32 [N]: the identity routing that
  /// moe_combine and moe_gather take).
  Tensor shared_logit, shared_w_host, shared_w, sgate, sup, sact, sy, identity;
  /// x widened to f32 for the router and the shared gate (16-bit
  /// activations only; kept for the backward).
  Tensor x32;
};

/// Scratch of moe_backward, grown on demand.
struct moe_grad_scratch {
  Tensor dweights, dweights_host, dlogits, dlogits_host;
  Tensor row_weights;  ///< the routing's row weights on the device
  Tensor dys, dact, dgate, dup, dxs;
  /// The shared expert's: its gate weights' gradient [N, 1] (device and
  /// host), its gate logits' [N, 1], its output rows' [N, D], three [N, S],
  /// and its input's [N, D].
  Tensor dshared_w, dshared_w_host, dshared_z, dsy, dsact, dsgate, dsup, dsx;
  /// 16-bit activations: the router's (or shared gate's) input gradient in
  /// f32, and rounded to the activations' dtype before it is added to dx.
  Tensor dx32, dx16;
};

/// y [N, D] = the mixture of experts of x [N, D] (the block's second norm),
/// with w's router, experts (E, then the shared expert when cfg has one)
/// and shared expert gate (model/block.hpp). The experts are stored as
/// w.format (f32 in training, or 16-bit compute copies of x's dtype); the
/// router and the shared gate stay f32. y (x's dtype) must not alias x.
void moe_forward(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x, Tensor& y,
                 moe_buffers& b);

/// The backward of moe_forward (whose buffers are `b`, input `x`): dx
/// [N, D] overwritten from dy [N, D]. With `g` (the block's gradients, f32)
/// the router's, the experts' and the shared gate's gradients are added
/// into it; without (null) only dx is computed (frozen weights: a server's
/// input-only backward).
void moe_backward(Backend& be, const model_config& cfg, const block_tensors& w, const moe_buffers& b, const Tensor& x,
                  const Tensor& dy, Tensor& dx, block_tensors* g, moe_grad_scratch& s);

}  // namespace corolla
