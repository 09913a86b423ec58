// model/head.hpp — the ends of the model: token (and, for GPT-2, position)
// embeddings in front of the blocks, final norm and LM head after them.
//
// In serving this is the client's side (a swarm server only runs a stage);
// in pipeline training it belongs to the first and last stage. It knows
// nothing of blocks: the two meet only in hidden states [rows, D].
// With tied embeddings the LM head is embed.weight itself, so its gradient
// from both uses lands in the one buffer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/params.hpp"
#include "model/safetensors.hpp"
#include "model/workspace.hpp"

namespace corolla {

/// Canonical names and shapes of the head's parameters for `cfg`, in
/// param_set order (see model/transformer.hpp for the list).
std::vector<std::pair<std::string, shape_t>> head_layout(const model_config& cfg);

/// What head::logits keeps for head::logits_backward.
struct head_activations {
  Tensor x;           ///< input hidden states [N,D], shared with the caller (kept unchanged)
  Tensor norm;        ///< final norm output [N,D]
  Tensor mean, rstd;  ///< norm statistics [N] (mean: GPT-2 only)
  /// head::logits: [N,V]. head::loss: [rows of one chunk, V], each chunk's
  /// logits turned into its dlogits in place (head::set_loss_chunk_rows).
  Tensor logits;
  Tensor losses;      ///< per-row cross-entropy [N] (head::loss)
};

/// Embeddings, final norm and LM head of one model, with their backward.
/// Not thread-safe (shared scratch): one call at a time.
class head {
 public:
  /// The head of a model shaped by `cfg`, parameters zeroed.
  head(const model_config& cfg, Backend& be);
  /// A head over an existing parameter set (a shallow copy: it shares the
  /// caller's storage).
  head(const model_config& cfg, param_set params, Backend& be);
  /// Loads embeddings, final norm and LM head from `ck` (nothing else).
  /// Throws model_error (naming tensor and file) for a missing tensor or a
  /// wrong shape.
  static head load(const checkpoint& ck, const model_config& cfg, Backend& be);

  head(head&&) noexcept = default;
  head& operator=(head&&) noexcept = default;

  /// The model's shape and the backend the head computes on.
  const model_config& config() const { return cfg_; }
  Backend& backend() const { return *be_; }
  /// Parameters in head_layout order; update values in place.
  param_set& params() { return params_; }
  const param_set& params() const { return params_; }
  /// Gradient buffer (same layout), zeroed on first call.
  param_set& grads();
  /// Whether grads() has been allocated.
  bool has_grads() const { return grads_.size() > 0; }
  /// Sets every gradient to zero (nothing when none are allocated).
  void zero_grads();

  /// x [N,D] = embed[ids] (+ pos_embed[positions] for GPT-2). ids and
  /// positions are i32 [N]; throws tensor_error for an id outside the table.
  void embed(const Tensor& ids, const Tensor& positions, Tensor& x);
  /// Adds dx [N,D] into the embedding rows of `ids` (and position rows).
  void embed_backward(const Tensor& ids, const Tensor& positions, const Tensor& dx);

  /// logits [N,V] = lm_head(final_norm(x)). With `saved`, keeps what
  /// logits_backward needs (x then stays unchanged until the backward).
  /// Without, uses internal buffers that allocate nothing once they have
  /// seen N rows (the decode path) and reads the LM-head weight's inference
  /// copy when use_inference_weights made one.
  void logits(const Tensor& x, Tensor& logits, head_activations* saved);
  /// Backward from dlogits [N,V] (may be saved.logits): dx [N,D]
  /// overwritten, parameter gradients added into grads(). With
  /// `param_grads` false (a frozen head, e.g. prompt tuning) only dx is
  /// computed: no LM-head weight gradient, and grads() is left alone.
  void logits_backward(const head_activations& saved, const Tensor& dlogits, Tensor& dx,
                       bool param_grads = true);

  /// Mean softmax cross-entropy of x's logits against `targets` (i32 [N],
  /// -1 = ignored row, still counted in the mean). With `dx`, also runs the
  /// backward of (mean loss * grad_scale): dx [N,D] overwritten, parameter
  /// gradients added unless `param_grads` is false (see logits_backward).
  /// `saved` holds the buffers (reused across calls). The logits are formed
  /// a chunk of rows at a time (set_loss_chunk_rows), so at most
  /// [chunk, V] of them exist: with one chunk the ops are those of logits()
  /// and logits_backward(); with several, the LM-head gradient is summed
  /// over the chunks' products.
  float loss(const Tensor& x, const Tensor& targets, Tensor* dx, float grad_scale,
             head_activations& saved, bool param_grads = true);

  /// Bytes of f32 logits loss() forms at once by default: rows per chunk =
  /// this / (4 V), so GPT-2's 50257 tokens take 1335 rows a chunk and a
  /// 128K vocabulary 512, while B*T rows of a small vocabulary stay one chunk.
  static constexpr std::int64_t loss_logits_budget = std::int64_t{256} << 20;
  /// Rows per chunk of loss(): 0 (the default) = by loss_logits_budget.
  /// Throws tensor_error for a negative count.
  void set_loss_chunk_rows(std::int64_t rows);
  /// The rows per chunk loss() uses for `rows` rows.
  std::int64_t loss_chunk_rows(std::int64_t rows) const;

  /// Makes logits() without `saved` (the inference path) read a copy of
  /// the LM-head weight for blocks stored as `f`: bf16 halves its bytes per
  /// token; int8 and nf4 quantise it to int8 per vocabulary row (a quarter
  /// of the bytes, with scales: 4 bits would cost the logits too much, as
  /// HF's 4-bit loading keeps the LM head out of it); f32 (the default)
  /// drops the copy. Embeddings, the final norm and the training path
  /// (logits with `saved`, the backward) keep the f32 parameters, which
  /// stay allocated. The copy is a snapshot of params() now.
  void use_inference_weights(weight_format f);
  /// Makes the inference path read `other`'s LM-head copy, shared (no copy
  /// made). Throws tensor_error for a head of another shape or backend.
  void share_inference_weights(const head& other);
  /// The LM-head copy the inference path reads (undefined: the f32 weight).
  const Tensor& lm_head_inference() const { return lm_head_inference_; }
  /// The format the blocks' weights were asked for (see above).
  weight_format inference_format() const { return inference_format_; }
  /// The format of the LM-head weight the inference path reads.
  weight_format lm_head_format() const {
    return is_quantized(inference_format_) ? weight_format::int8 : inference_format_;
  }

 private:
  void resolve_views();
  /// The final norm of x: into `saved` (which then keeps x) or, without,
  /// into the inference scratch. Returns the normalised rows.
  Tensor& final_norm(const Tensor& x, head_activations* saved);
  /// dnorm = dlogits @ W (overwritten) and, with param_grads, the LM-head
  /// weight gradient added.
  void lm_head_backward(const Tensor& norm, const Tensor& dlogits, Tensor& dnorm, bool param_grads);
  /// dx from dnorm through the final norm (its parameter gradients added,
  /// or discarded without param_grads).
  void norm_backward(const head_activations& saved, const Tensor& dnorm, Tensor& dx, bool param_grads);

  model_config cfg_;
  Backend* be_;
  param_set params_;
  param_set grads_;
  // Views by role (lm_head_w is embed.weight when tied).
  Tensor embed_w_, pos_w_, norm_w_, norm_b_, lm_head_w_;
  Tensor lm_head_inference_;  ///< bf16 or int8 copy of lm_head_w_ for logits() without saved, or undefined
  Tensor lm_head_scale_;      ///< its per-row scales when int8, else undefined
  weight_format inference_format_ = weight_format::f32;
  Tensor g_embed_, g_pos_, g_norm_w_, g_norm_b_, g_lm_head_;
  // Inference and embedding scratch.
  row_buffer pos_rows_, norm_rows_, mean_rows_, rstd_rows_;
  // Where a frozen head's norm backward puts the gradients nobody reads.
  Tensor discard_norm_w_, discard_norm_b_;
  Tensor host_losses_;
  std::int64_t loss_chunk_rows_ = 0;
};

}  // namespace corolla
