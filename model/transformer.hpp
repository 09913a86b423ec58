// model/transformer.hpp — a whole decoder-only model in one process:
// head (embeddings, final norm, LM head) + every block. Used by local
// generation and single-process training, and as the reference that
// distributed runs must equal.
//
// Canonical parameter names (independent of the checkpoint's naming; the
// loader maps HF names onto these, the saver maps back):
//   block i  (param_set blocks()[i]):
//     attn_norm.weight [D]            attn_norm.bias [D]        (bias: gpt2)
//     q.weight [Hq*Dh, D]  k.weight [Hkv*Dh, D]  v.weight [Hkv*Dh, D]
//     q.bias, k.bias, v.bias                                     (gpt2)
//     o.weight [D, Hq*Dh]             o.bias [D]                 (gpt2)
//     mlp_norm.weight [D]             mlp_norm.bias [D]          (gpt2)
//     gate.weight [F, D]                                         (llama)
//     up.weight [F, D]   down.weight [D, F]
//     up.bias [F]        down.bias [D]                           (gpt2)
//   head (param_set head()):
//     embed.weight [V, D]
//     pos_embed.weight [P, D]                                    (gpt2)
//     final_norm.weight [D]           final_norm.bias [D]        (gpt2)
//     lm_head.weight [V, D]                                      (untied only)
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace corolla {

class block_patch;
class frozen_weight_grads;
struct span_lora;

/// A parameter set together with its gradient buffer (same layout).
struct param_group {
  param_set* params = nullptr;
  param_set* grads = nullptr;
};

class transformer {
 public:
  /// Loads config.json and the weights of `dir` (converted to f32).
  /// Throws model_error for missing files, tensors or wrong shapes. With a
  /// device backend the parameters are read on the host, then copied to the
  /// backend's device (the host holds the whole model meanwhile).
  /// `on_block(done, total)` after each block (a progress bar). `patch`
  /// changes each block as it loads (a LoRA adapter merged into the
  /// weights, model/lora.hpp).
  static transformer load(const std::filesystem::path& dir, Backend& be,
                          const std::function<void(int done, int total)>& on_block = {},
                          std::shared_ptr<const block_patch> patch = nullptr);
  /// Loads `dir` for inference only, its blocks' linear weights in format
  /// `f` (bf16, int8 or nf4): each block's f32 parameters are read, turned
  /// into `f` weights on the backend and let go before the next block is
  /// read (stage::load_inference), so the model holds the `f` weights, the
  /// blocks' norms and biases, and the head (embeddings, final norm, LM
  /// head) in f32, and the load peaks at that plus one block of f32: a 13B
  /// model in bf16 takes 26 GB, not the 52 GB of its f32 parameters beside
  /// the copies. `on_block(done, total)` after each block (a progress bar).
  /// Such a model decodes (generator, in format `f` only), computes losses
  /// and logits, and trains an adapter beside its frozen weights
  /// (lora_tuning, QLoRA: each block's weights widened to f32 for its turn
  /// in the forward and the backward, compute in f32), but trains none of
  /// its own and does not save: blocks(), groups(), save() and
  /// forward_backward without an adapter throw tensor_error.
  /// `patch` as load's, applied to the f32 parameters before they are
  /// turned into `f`. Throws tensor_error for f32 (use load), model_error as load.
  static transformer load_inference(const std::filesystem::path& dir, Backend& be, weight_format f,
                                    const std::function<void(int done, int total)>& on_block = {},
                                    std::shared_ptr<const block_patch> patch = nullptr);
  /// An inference-only model (as load_inference makes) of `model`'s
  /// weights: its blocks' linear weights as `f` (stage::inference_of), its
  /// head's parameters copied. `model` is left as it was. Throws as
  /// load_inference, and tensor_error for an inference-only `model`.
  static transformer inference_of(transformer& model, weight_format f);
  /// A model with parameters set to the GPT-2 initialisation
  /// (weights ~ N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
  /// norms 1, biases 0), deterministic for `seed`. Parameters live where
  /// `be` computes: with a device backend each group (the head, each block)
  /// is drawn on the host and copied to the device in turn, so the host
  /// holds one group at a time.
  static transformer init(const model_config& cfg, std::uint64_t seed, Backend& be);
  /// As init, but each parameter tiles one block of 65536 draws instead of
  /// drawing every value (values repeat along the tensor; shapes,
  /// magnitudes and bytes are init's). For speed benchmarks of large shapes,
  /// where init's sequential draws take minutes; deterministic for `seed`,
  /// and a different model than init(cfg, seed).
  static transformer init_tiled(const model_config& cfg, std::uint64_t seed, Backend& be);

  transformer(transformer&&) noexcept;
  transformer& operator=(transformer&&) noexcept;
  ~transformer();

  const model_config& config() const;
  Backend& backend() const;
  param_set& head();
  /// The blocks' parameters; throws tensor_error on an inference-only model.
  std::vector<param_set>& blocks();
  /// The blocks as one stage (what a generator reads: their parameters, or
  /// an inference-only model's inference weights).
  const class stage& block_stage() const;
  /// A stage over the blocks for one more decoder (a generator, the local
  /// API's batcher), with scratch of its own: over the blocks' parameters
  /// (shared), or sharing an inference-only model's inference weights.
  class stage decoding_stage();
  /// Throws model_error unless a decoder may read `f` weights of this
  /// model: any format of one with f32 parameters, only its own of one
  /// loaded for inference only.
  void require_decoding_format(weight_format f) const;
  /// Whether load_inference made this model (no f32 block parameters).
  bool inference_only() const;
  /// Every parameter set with its gradient buffer (allocated on first call).
  std::vector<param_group> groups();
  /// Values the gradient buffers made so far hold (the head's and the
  /// blocks': groups() makes them all, a backward those it writes; none in
  /// LoRA training).
  std::int64_t gradient_values() const;
  /// Frees the one block of f32 weights an inference-only model's training
  /// passes widen into (stage::release_frozen_weights): lora_tuning calls it
  /// when it ends.
  void release_frozen_weights();
  /// Which parameters forward_backward forms gradients of: all (nullopt,
  /// the default), or only the blocks' weights named (block_layout names of
  /// linear and norm weights, "q.weight", "mlp_norm.weight", with their
  /// biases): the head, the other weights and biases and a mixture of
  /// experts' MLP are frozen, their gradient products skipped and their
  /// buffers left as they are (zero after zero_grads). With none named
  /// (LoRA training, model/lora.hpp) no gradient buffer is made. Throws
  /// tensor_error for another name. `frozen` (borrowed, may be null) hears
  /// of each frozen linear weight's input and output gradient
  /// (stage::set_trained_weights), and `lora` (borrowed, may be null; block
  /// i's factors at index i, of the compute dtype) adds its terms beside
  /// the frozen weights in forward and backward.
  void set_trained_weights(std::optional<std::set<std::string>> block_weights,
                           frozen_weight_grads* frozen = nullptr, const span_lora* lora = nullptr);
  /// Zeroes every gradient buffer (and, as stage::zero_grads, says the
  /// parameters may have changed since the last forward, unless
  /// compute_copies_written() was said since the last params_changed():
  /// a write by hand after a fused optimiser step needs params_changed()).
  void zero_grads();
  /// The blocks' training compute dtype (stage::set_compute_dtype: f32, or
  /// bf16/f16 on a device backend); embeddings, final norm, LM head and
  /// loss stay f32.
  void set_compute_dtype(dtype t);
  dtype compute_dtype() const;
  /// Says the parameters were written (an optimiser step): 16-bit compute
  /// copies are converted again at the next forward.
  void params_changed();
  /// Per group of groups(), in order: the flat 16-bit copy of its
  /// parameters that the blocks' compute weights view
  /// (stage::compute_copies), or an undefined tensor (the head; every group
  /// at f32). An optimiser may write them in its update
  /// (adamw_optimizer::set_compute_copies), then compute_copies_written().
  std::vector<Tensor> compute_copies() const;
  /// Says the parameters were written and the compute copies with them:
  /// nothing is converted before the next forward.
  void compute_copies_written();

  /// Forward and backward over a batch: ids and targets are B*T tokens
  /// (row = b*T + t). Returns the mean cross-entropy over the B*T positions;
  /// gradients of that mean times `grad_scale` are *added* to the gradient
  /// buffers (so micro-batches accumulate).
  float forward_backward(std::span<const std::int32_t> ids,
                         std::span<const std::int32_t> targets, int batch, int seq,
                         float grad_scale = 1.0f);
  /// Mean loss only (no gradients).
  float forward_loss(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets,
                     int batch, int seq);
  /// Logits [T, V] of one sequence (full forward, no cache).
  Tensor forward_logits(std::span<const std::int32_t> ids);

  /// Writes a HuggingFace directory (config.json + model.safetensors, in the
  /// architecture's own tensor names and layouts) that load() reads back.
  void save(const std::filesystem::path& dir) const;

 private:
  /// Throws tensor_error naming `what` on an inference-only model.
  void require_block_parameters(const char* what) const;
  struct impl;
  explicit transformer(std::unique_ptr<impl> p);
  /// init (tiled = false) and init_tiled.
  static transformer init_with(const model_config& cfg, std::uint64_t seed, Backend& be,
                               bool tiled);
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla
