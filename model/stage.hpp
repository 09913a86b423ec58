// model/stage.hpp — a span [first, last) of transformer blocks.
//
// A stage is what a swarm server hosts and what a pipeline-parallel rank
// runs: it owns the parameters of its blocks (and, once asked for, their
// gradients), runs the training forward and backward through the span, and
// the cached incremental forward through the span for one kv_sequence.
// It knows nothing of embeddings or the LM head (model/head.hpp): the two
// meet only in hidden states [rows, D].
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/params.hpp"
#include "model/safetensors.hpp"
#include "model/workspace.hpp"

namespace corolla {

/// Activations a stage's training forward keeps for its backward: one set
/// per block (block i's input is block i-1's output, held here).
struct stage_activations {
  std::vector<block_activations> blocks;
  std::vector<Tensor> inputs;  ///< inputs[i] = input of block i for i >= 1
  /// Block 0's input in a 16-bit compute dtype (the stage's x converted);
  /// undefined when the stage computes in x's dtype.
  Tensor input;
};

/// "f32", "bf16" or "f16" as a compute dtype (stage::set_compute_dtype);
/// throws std::invalid_argument otherwise.
dtype parse_compute_dtype(const std::string& text);

/// Blocks [first, last) of one model: parameters, gradients, training
/// forward/backward and the cached inference forward. Not thread-safe (its
/// scratch and inference workspace are shared by calls): one call at a time.
class stage {
 public:
  /// Blocks [first, last) of a model shaped by `cfg`, parameters zeroed.
  /// Throws std::invalid_argument for a span outside [0, n_layers).
  stage(const model_config& cfg, int first, int last, Backend& be);
  /// Blocks [first, first + params.size()) over existing parameter sets. The
  /// sets are shallow copies: they share storage with the caller's, so this
  /// stage computes with (and its updates are seen by) the same weights.
  stage(const model_config& cfg, int first, std::vector<param_set> params, Backend& be);
  /// Loads blocks [first, last) from `ck`, reading only their tensors;
  /// `on_block(done, total)` is called after each block (a progress bar).
  /// Throws model_error (naming tensor and file) for a missing tensor or a
  /// wrong shape.
  static stage load(const checkpoint& ck, const model_config& cfg, int first, int last,
                    Backend& be, const std::function<void(int done, int total)>& on_block = {});
  /// Loads blocks [first, last) for inference only: each block's f32
  /// parameters are read, turned into inference weights of format `f`
  /// (bf16, int8 or nf4; inference_weights in model/block.hpp) and freed
  /// before the next block is read, so the stage holds (and its load peaks
  /// at) the `f` weights plus one block of f32. Such a stage has no params()
  /// or grads(); frozen_weights() widens one block at a time for
  /// frozen-weight passes (a server's fine-tuning requests), and so do its
  /// training forward and backward (an adapter beside the weights, QLoRA;
  /// a backward that would train its own weights throws). Throws
  /// tensor_error for f32.
  static stage load_inference(const checkpoint& ck, const model_config& cfg, int first, int last, Backend& be,
                              weight_format f, const std::function<void(int done, int total)>& on_block = {});
  /// An inference-only stage, as load_inference makes, of blocks
  /// [first, first + params.size()) whose parameters the caller holds (on
  /// `be`'s device): the stage keeps only the `f` weights it makes of them
  /// (and copies of the norms and biases), so once the caller lets the
  /// parameters go it holds what a server loaded with load_inference holds.
  /// Throws as load_inference.
  static stage inference_of(const model_config& cfg, int first, const std::vector<param_set>& params, Backend& be,
                            weight_format f);
  /// An inference-only stage over `other`'s blocks reading `other`'s
  /// inference weights (shared, not copied) with scratch of its own: a
  /// second decoder of an inference-only model (a generator per request).
  /// Throws tensor_error when `other` holds no inference weights (f32: give
  /// the parameters to the constructor instead).
  static stage sharing_inference_weights(const stage& other);

  stage(stage&&) noexcept = default;
  stage& operator=(stage&&) noexcept = default;

  /// The model's shape and the backend the stage computes on.
  const model_config& config() const { return cfg_; }
  Backend& backend() const { return *be_; }
  /// Whether a step of forward_cached / forward_cached_batch can run as a
  /// recorded step (Backend::run_step: a CUDA graph), which must read
  /// nothing back to the host: not a mixture of experts, whose routing
  /// does.
  bool steps_recordable() const { return !cfg_.is_moe(); }
  /// The span: blocks [first(), last()), size() of them.
  int first() const { return first_; }
  int last() const { return first_ + size(); }
  int size() const { return blocks_; }
  /// Whether the f32 parameters were dropped (load_inference): the stage
  /// holds its inference weights only.
  bool inference_only() const { return params_.empty() && blocks_ > 0; }
  /// Block first()+i's weights in f32 for a frozen-weight forward and
  /// backward (block_forward, block_backward_input): the parameters, or for
  /// an inference-only stage its inference weights widened (dequantised)
  /// into a scratch block, valid until the next call (and not across a
  /// move of the stage). A mixture of experts' experts are not widened
  /// here: each is widened when rows are routed to it, into one expert's
  /// scratch (block_tensors::expert_scratch).
  const block_tensors& frozen_weights(int i);
  /// Frees frozen_weights' scratch (one block's f32 attention weights and
  /// dense MLP, or one expert's, on an inference-only stage): a server
  /// calls it when a request is done, so that memory is held only while
  /// one runs.
  void release_frozen_weights() {
    widened_ = block_tensors{};
    widened_expert_ = expert_tensors{};
  }
  /// Bytes frozen_weights' scratch holds now (0 after release_frozen_weights).
  std::int64_t frozen_scratch_bytes() const;

  /// Parameters of block first()+i at index i. Update values in place;
  /// replacing a set's storage is not seen by this stage's cached views.
  std::vector<param_set>& params() { return params_; }
  const std::vector<param_set>& params() const { return params_; }
  /// Gradient buffers (same layouts), zeroed on first call.
  std::vector<param_set>& grads();
  /// Whether grads() has been allocated.
  bool has_grads() const { return !grads_.empty(); }
  /// Which weights get gradients in backward(): every one (nullopt, the
  /// default), or only those named (block_layout names of linear and norm
  /// weights, "q.weight", "attn_norm.weight"; a bias follows its weight):
  /// the others are frozen, their gradient products are skipped and their
  /// buffers keep what they hold; so is a mixture of experts' whole MLP
  /// (router, experts, shared expert). With none named (LoRA training,
  /// model/lora.hpp) backward() forms input gradients only and makes no
  /// gradient buffer. Throws tensor_error for another name. `frozen`
  /// (borrowed; may be null) hears of each frozen linear weight's input and
  /// output gradient (block_backward; not of the experts'). `lora`
  /// (borrowed; may be null): factors beside the frozen weights, block
  /// first()+i's at index i, of the compute dtype, whose terms forward()
  /// and backward() add (block_forward's lora: LoRA training without
  /// merging).
  void set_trained_weights(std::optional<std::set<std::string>> names, frozen_weight_grads* frozen = nullptr,
                           const span_lora* lora = nullptr);
  /// Whether backward() forms any parameter gradient (and so needs grads()).
  bool forms_parameter_grads() const;
  /// Sets every gradient to zero (nothing when none are allocated). Also
  /// params_changed() (a step's parameter updates come before the next
  /// step's zero_grads), unless compute_copies_written() was said since
  /// the last params_changed(): after a fused optimiser step, a write to
  /// params() must say params_changed() itself.
  void zero_grads();

  /// The dtype the training forward and backward compute in: f32 (the
  /// default) or, on a device backend, bf16 or f16 (mixed precision). With
  /// 16 bits the blocks' activations and activation gradients are of that
  /// dtype, and their linear weights and biases are per-step copies of the
  /// f32 parameters converted to it; parameters, their gradients (which the
  /// products accumulate in f32), norms, norm statistics and the optimiser
  /// stay f32. forward/backward still take and give f32 hidden states (they are
  /// converted at the stage's ends), so heads, pipelines and the wire are
  /// unchanged. The copies are views of one flat 16-bit copy of each
  /// block's parameter buffer (compute_copies(); 2 bytes per parameter),
  /// converted in one op per block when stale. Throws
  /// tensor_error for another dtype, or a 16-bit one on the cpu backend
  /// (which computes in f32).
  void set_compute_dtype(dtype t);
  dtype compute_dtype() const { return compute_dtype_; }
  /// Says that params() were written (an optimiser step, a restore): with a
  /// 16-bit compute dtype the next forward converts them again.
  void params_changed() {
    compute_stale_ = true;
    copies_written_ = false;
  }
  /// With a 16-bit compute dtype, block i's flat 16-bit copy of params()[i]
  /// at index i, which the compute weights view; empty at f32. An
  /// optimiser that writes them with the parameters
  /// (Backend::adamw_with_copy) says so with compute_copies_written().
  const std::vector<Tensor>& compute_copies() const { return compute_copies_; }
  /// Says that params() were written and compute_copies() hold them rounded
  /// (a fused optimiser step): nothing to convert before the next forward,
  /// nor at the next zero_grads.
  void compute_copies_written() {
    compute_stale_ = false;
    copies_written_ = true;
  }

  // ---- training ------------------------------------------------------------------
  /// Forward of `batch` sequences of `seq` tokens at positions 0..seq-1
  /// through every block: x, y [B*T, D] (distinct tensors). With `saved`,
  /// keeps what backward() needs (x must then stay unchanged until the
  /// backward); without, reuses internal scratch.
  void forward(const Tensor& x, int batch, int seq, Tensor& y, stage_activations* saved);
  /// Backward through every block in reverse: dx [B*T, D] overwritten from
  /// dy, parameter gradients added into grads(). `on_block_done(i)` (when
  /// set) is called as soon as block first()+i's gradients are added, last
  /// block first: in a step's last backward, that bucket is final and its
  /// reduction can start while the earlier blocks still run.
  void backward(const stage_activations& saved, const Tensor& dy, Tensor& dx,
                const std::function<void(int)>& on_block_done = {});

  // ---- inference -----------------------------------------------------------------
  /// Grows the inference workspace to `rows` rows (the longest prefill chunk)
  /// so forward_cached allocates nothing afterwards.
  void reserve_rows(std::int64_t rows);
  /// Cached forward of x [Tq, D] at positions start_pos.. through every
  /// block; block first()+i uses layer i of `kv` (so kv's pool has size()
  /// layers). kv must have capacity for start_pos + Tq tokens
  /// (kv_sequence::reserve). y [Tq, D] may alias x. With `from`/`to`
  /// (indices into this stage, to = -1: the end) only blocks [from, to) run,
  /// against their own layers of kv; a sequence must always run the same
  /// range (the other layers of its cache stay empty). With `lora` (an
  /// adapter's factors for this stage's blocks, indexed as they are) each
  /// block adds its terms (model/lora_factors.hpp).
  void forward_cached(const Tensor& x, kv_sequence& kv, std::int64_t start_pos, Tensor& y, int from = 0,
                      int to = -1, const span_lora* lora = nullptr);
  /// Cached forward of several sequences' new rows at once through every
  /// block (a server's batched decode): x [R, D] stacks the rows of each
  /// entry of `seqs` in order, each at its own positions start_pos.. and
  /// against its own kv_sequence (each with size() layers and capacity for
  /// its rows). The projections run once over all R rows per block; the
  /// result equals forward_cached per sequence up to GEMM rounding. y [R, D]
  /// may alias x A sequence's adapter (cached_rows::lora) covers this
  /// stage's blocks, indexed as they are.
  void forward_cached_batch(const Tensor& x, std::span<const cached_rows> seqs, Tensor& y);
  /// Makes forward_cached and forward_cached_batch read every block's
  /// linear weights stored as `f` (inference_weights in model/block.hpp):
  /// bf16 halves the bytes a decoded token reads, int8 (per output channel,
  /// Backend::linear_q8) quarters them, nf4 (blocks of 64,
  /// Backend::linear_nf4) takes an eighth plus an absmax per block; f32 (the
  /// default) drops the copies and reads params() again. The copies are a
  /// snapshot of params() now: later updates are not seen until the next
  /// call. The f32 parameters stay allocated next to them (training,
  /// backward and params() keep using them). On an inference-only stage
  /// only its own format is accepted (tensor_error otherwise).
  void use_inference_weights(weight_format f);
  /// Makes the cached forwards read `other`'s inference weights, shared (no
  /// copy): several stages over the same parameters (a local API's
  /// generators, each with its own workspace) then hold one set of them.
  /// Throws tensor_error unless `other` covers the same blocks of the same
  /// shape on the same backend.
  void share_inference_weights(const stage& other);
  /// The format of the linear weights the cached forwards read.
  weight_format inference_format() const { return inference_format_; }
  /// Block first()+i's inference weights (empty when they are the f32
  /// parameters).
  const std::vector<block_tensors>& inference_block_weights() const { return inference_weights_; }

 private:
  /// load_inference and inference_of: n blocks from first, block i's f32
  /// parameters from `block_params(i)`, each turned into `f` weights and let
  /// go before the next is asked for; `on_block(done, n)` after each.
  static stage inference_stage(const model_config& cfg, int first, int n, Backend& be, weight_format f,
                               const std::function<param_set(int i)>& block_params,
                               const std::function<void(int done, int total)>& on_block = {});
  /// What the cached forwards read for block first()+i.
  const block_tensors& cached_weights(int i) const {
    const auto k = static_cast<std::size_t>(i);
    return inference_weights_.empty() ? weights_[k] : inference_weights_[k];
  }

  void resolve_views();
  /// grad_views_ over grads_, the frozen weights' (linear and norm) left undefined.
  void resolve_grad_views();
  const Tensor& train_positions(int batch, int seq);
  /// The weights training reads for block first()+i: the parameters, or
  /// their compute copies (converted first when params_changed()), or on
  /// an inference-only stage its inference weights widened to f32
  /// (frozen_weights: valid until the next call).
  const block_tensors& train_weights(int i);
  /// Block first()+i's factors beside the weights (set_trained_weights), or null.
  const block_lora* train_lora(int i) const {
    return block_lora_of(train_lora_, static_cast<std::size_t>(i));
  }
  /// `t` in the compute dtype: `t` itself, or converted into `buffer`.
  const Tensor& in_compute_dtype(const Tensor& t, Tensor& buffer);

  /// Throws tensor_error naming `what` on an inference-only stage.
  void require_parameters(const char* what) const;

  model_config cfg_;
  Backend* be_;
  int first_ = 0;
  int blocks_ = 0;
  std::vector<param_set> params_;
  std::vector<param_set> grads_;
  std::vector<block_tensors> weights_;
  std::vector<block_tensors> grad_views_;
  std::optional<std::set<std::string>> trained_;  ///< set_trained_weights
  frozen_weight_grads* frozen_grads_ = nullptr;          ///< its hook
  const span_lora* train_lora_ = nullptr;                ///< its factors beside the weights
  std::vector<block_tensors> inference_weights_;  ///< bf16, int8 or nf4 linear weights, or empty (use weights_)
  block_tensors widened_;          ///< frozen_weights' scratch on an inference-only stage
  expert_tensors widened_expert_;  ///< its experts' scratch (block_tensors::expert_scratch)
  weight_format inference_format_ = weight_format::f32;
  std::vector<block_tensors> compute_weights_;  ///< 16-bit linear weights for training (views of compute_copies_), or empty (use weights_)
  std::vector<Tensor> compute_copies_;          ///< per block: the flat 16-bit copy of params_[b], or empty
  dtype compute_dtype_ = dtype::f32;
  bool compute_stale_ = true;    ///< compute_weights_ predate a params() write
  bool copies_written_ = false;  ///< compute_copies_written() since the last params_changed() or zero_grads()

  // Training scratch, reused across steps.
  Tensor positions_;          ///< i32 [B*T] on the host: t for row b*T+t
  int positions_batch_ = 0, positions_seq_ = 0;
  block_activations scratch_acts_;
  Tensor ping_, pong_;
  Tensor boundary_in_, boundary_out_;  ///< x / dy and y / dx in the compute dtype
  block_grad_scratch grad_scratch_;

  // Inference workspace.
  block_decode_workspace decode_ws_;
  row_buffer decode_positions_{0, dtype::i32};  ///< on the host
};

}  // namespace corolla
