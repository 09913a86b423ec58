// model/lora.hpp — LoRA adapters (Hu et al., 2021) in PEFT's on-disk form.
//
// An adapter adds to chosen linear weights W [out, in] of every block a
// low-rank update: W' = W + s * B A, with A [r, in], B [out, r] and
// s = alpha / r (alpha / sqrt(r) with rsLoRA). Training changes A and B only;
// the base model stays as it is on disk.
//
// Modules are named as HuggingFace and PEFT name them inside a layer:
//   Llama family: self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj (dense
//                 MLPs only: a mixture of experts' MLP is not adapted)
//   GPT-2:        attn.c_attn (q, k and v stacked: one A, B's rows split
//                 q | k | v), attn.c_proj, mlp.c_fc, mlp.c_proj
// A target name matches a module when it is the module's path or its last
// parts ("q_proj", "c_proj" = both GPT-2 c_proj modules, as PEFT matches);
// "all-linear" is every module above.
//
// On disk (PEFT's save_pretrained layout, which peft.PeftModel loads):
//   DIR/adapter_config.json       {"peft_type": "LORA", "r", "lora_alpha",
//                                 "target_modules", "use_rslora", ...}
//   DIR/adapter_model.safetensors base_model.model.<layer prefix><module>
//                                 .lora_A.weight [r, in] and .lora_B.weight
//                                 [out, r] (nn.Linear orientation, GPT-2's
//                                 Conv1D modules too: PEFT's fan_in_fan_out)
//
// Two uses: merged into a model's weights as they load (generation, the
// local API: lora_adapter::merge, through the checkpoint's block patch), and
// trained (lora_tuning): the model's blocks keep the frozen W0 and the
// forward adds each adapted product's term s (x A^T) B^T beside it
// (block_forward's factors, model/lora_factors.hpp; no merged copy, no
// copy of W0); in the backward every weight of the model is frozen (no dW
// is formed, the head's gradients neither), each adapted weight's input
// gradient gets its term's, s (dy B) A, and hands its input x and output
// gradient dy to the adapter, which adds its low-rank gradients,
// dB += s dy^T (x A^T) and dA += s (dy B)^T x (= s B^T dW' and s dW' A^T,
// without forming dW'; summed over the parts of a stacked module). AdamW
// keeps moments of the adapter only, and the model makes no gradient buffer
// (its norms are frozen too). The model may hold inference weights (bf16,
// int8, nf4: QLoRA), widened one block at a time for the passes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/hf_names.hpp"
#include "model/lora_factors.hpp"
#include "model/params.hpp"
#include "model/transformer.hpp"

namespace corolla {

/// What an adapter adapts and how strongly.
struct lora_config {
  int rank = 8;        ///< r
  float alpha = 16.0f;  ///< lora_alpha
  bool rslora = false;  ///< s = alpha / sqrt(r) instead of alpha / r
  /// Target names (see above); empty: the family's default (PEFT's):
  /// q_proj and v_proj for the Llama family, c_attn for GPT-2.
  std::vector<std::string> targets;

  /// s.
  float scaling() const;
  /// The targets comma-separated ("self_attn.q_proj, self_attn.v_proj"),
  /// for people.
  std::string targets_text() const;
};

/// One adaptable linear module of a block.
struct lora_module {
  std::string path;     ///< inside a layer: "self_attn.q_proj", "attn.c_attn"
  std::int64_t in = 0;  ///< A's columns
  std::int64_t out = 0; ///< B's rows
  /// The canonical block weights it updates (block_layout names) and the
  /// rows of B each takes, in order: {"q.weight", Q} (GPT-2's c_attn: q, k
  /// and v).
  std::vector<std::pair<std::string, std::int64_t>> parts;
};

/// Every module an adapter of `cfg` may adapt, in block order.
std::vector<lora_module> lora_modules(const model_config& cfg);

/// The modules `targets` name (empty: the family's default). Throws
/// model_error for a name that matches no module, listing the ones there are.
std::vector<lora_module> lora_targets(const model_config& cfg, const std::vector<std::string>& targets);

/// The tensors of one block of an adapter `c` of a model of `cfg`, in
/// order: "<module>.lora_A" [r, in] and "<module>.lora_B" [out, r] of each
/// target (lora_adapter::block's layout). Throws as lora_adapter::init.
std::vector<std::pair<std::string, shape_t>> lora_block_layout(const model_config& cfg, const lora_config& c);

/// Blocks of a client's own adapter carried by a stateless request (a
/// fine-tuning client training it through a swarm's servers, Petals'
/// client-side trainable parameters): its config, and one f32 host tensor
/// [values] holding, block after block, the tensors lora_block_layout lists
/// in its order (lora_adapter::span_values). One tensor whatever the
/// blocks and targets: a message carries at most 64.
struct lora_span_values {
  lora_config config;
  Tensor values;
};

/// The highest rank a server takes in a client's carried adapter: its
/// factors for one 7B-wide block at all-linear are then ~40 MB.
inline constexpr int max_carried_lora_rank = 128;

/// A LoRA adapter of one model's blocks: per block a param_set holding
/// "<module>.lora_A" [r, in] and "<module>.lora_B" [out, r] of each target.
class lora_adapter final : public block_patch, public frozen_weight_grads {
 public:
  /// A fresh adapter as PEFT starts one: A uniform in +-1/sqrt(in) (its
  /// kaiming_uniform(a = sqrt(5))), deterministic for `seed`; B zero, so
  /// the adapted model equals the base. Throws model_error for rank < 1, a
  /// non-finite or non-positive alpha, or a bad target.
  static lora_adapter init(const model_config& cfg, lora_config c, std::uint64_t seed, Backend& be);
  /// An adapter whose factors are all zero, on the host: blocks to be
  /// filled (a distributed job's --save gathers its ranks' blocks into one).
  /// Throws as init.
  static lora_adapter zeros(const model_config& cfg, lora_config c);
  /// A server's copy of n consecutive blocks of a client's adapter (`v`,
  /// lora_span_values), on be's device: the adapter has n layers. Throws
  /// model_error naming what does not fit a model of `cfg`: the config (as
  /// init, and a rank above max_carried_lora_rank) or the values (f32, on
  /// the host, as many as the blocks' layout holds), before allocating.
  static lora_adapter of_span(const model_config& cfg, const lora_span_values& v, int n, Backend& be);
  /// Reads a PEFT directory written for a model of `cfg`. Throws
  /// model_error naming the file for what this cannot apply exactly: another
  /// peft_type, DoRA, per-module ranks or alphas, layers_to_transform,
  /// modules_to_save, trained biases, a missing or misshapen tensor, or a
  /// tensor for a module or layer the model does not have.
  static lora_adapter load(const std::filesystem::path& dir, const model_config& cfg, Backend& be);
  /// Writes `dir` (created if missing): adapter_config.json and
  /// adapter_model.safetensors, each through a temporary file and a rename.
  /// `base_model` goes into base_model_name_or_path.
  void save(const std::filesystem::path& dir, const std::string& base_model = "") const;

  const lora_config& config() const { return config_; }
  const std::vector<lora_module>& modules() const { return modules_; }
  /// The adapter's tensors of block `layer`.
  param_set& block(int layer) { return blocks_.at(static_cast<std::size_t>(layer)); }
  const param_set& block(int layer) const { return blocks_.at(static_cast<std::size_t>(layer)); }
  int n_layers() const { return static_cast<int>(blocks_.size()); }
  /// Whether this adapter's modules are those of a model of `cfg` (depth
  /// and widths).
  bool fits(const model_config& cfg) const;
  /// Adapter values in all (A and B of every block).
  std::int64_t numel() const;
  /// A fingerprint of the adapter (16 hex digits: FNV-1a, 64 bits, over its
  /// rank, alpha, rsLoRA flag, target paths and every value of A and B):
  /// servers holding the same adapter announce the same one, so a client
  /// tells apart adapters that share a name. Not a cryptographic hash.
  std::string digest() const;
  /// The blocks' tensors with gradient buffers (allocated on first call), for
  /// an optimiser.
  std::vector<param_group> groups();

  /// Blocks [first, first + n)'s tensors in lora_block_layout's order,
  /// block after block, copied into one f32 host tensor [values]: the
  /// values, or with `grads` the gradients (zero before the first
  /// backward). What a stateless request carries (lora_span_values) and
  /// its answer.
  Tensor span_values(int first, int n, bool grads = false);
  /// The reverse of span_values: blocks [first, first + n)'s values (or
  /// gradients) set from `flat`. Throws model_error for another count.
  void set_span_values(int first, int n, const Tensor& flat, bool grads = false);
  /// Values of one block (span_values(i, 1)'s numel).
  std::int64_t block_numel() const;

  /// W += s B A for each target of block `layer` in `block` (laid out by
  /// block_layout; on `be`'s device, as this adapter is).
  void merge(Backend& be, int layer, param_set& block) const;
  /// The factors of blocks [first, first + n) for cached forwards beside
  /// the frozen weights (model/lora_factors.hpp: a server's per-session
  /// adapters), copied to be's device; block first+i at index i, A shared
  /// by the parts of a stacked module. Throws model_error for blocks
  /// outside the adapter.
  span_lora factors(Backend& be, int first, int n) const;
  /// The factors of every block in dtype `t` for training beside the
  /// frozen weights (lora_tuning): with f32, views of this adapter's own
  /// tensors (an update is seen at once); else copies converted on `be`.
  span_lora training_factors(Backend& be, dtype t) const { return training_factors(be, t, 0, n_layers()); }
  /// The same for blocks [first, first + n) (a pipeline stage's; block
  /// first+i at index i). Throws model_error for blocks outside the adapter.
  span_lora training_factors(Backend& be, dtype t, int first, int n) const;
  /// block_patch: merge on the host as a checkpoint's block loads.
  void apply(const model_config& cfg, int layer, param_set& block) const override;
  /// frozen_weight_grads: adds the low-rank gradients of the adapted weight
  /// `weight` of block `layer` from its input x [N, in] and output gradient
  /// dy [N, out] (in the activations' dtype; A and B are converted to it):
  /// dB_part += s dy^T (x A^T), dA += s (dy B_part)^T x. Nothing for a
  /// weight the adapter does not adapt.
  void add(Backend& be, int layer, const std::string& weight, const Tensor& x, const Tensor& dy) override;
  /// Zeroes the adapter's gradients (allocating them on first call).
  void zero_grads();

 private:
  /// Zeroed host tensors for `modules`; `c`'s targets become their paths.
  lora_adapter(const model_config& cfg, lora_config c, std::vector<lora_module> modules);

  /// Where one adapted weight lies: its module and rows of B.
  struct part {
    std::size_t module = 0;
    std::int64_t row = 0, rows = 0;
  };

  model_config cfg_;
  lora_config config_;
  std::vector<lora_module> modules_;
  std::map<std::string, part> parts_;  ///< by block_layout name
  std::vector<param_set> blocks_;
  std::vector<param_set> grads_;  ///< empty until groups()
  Tensor t_, u_, a_act_, b_act_;  ///< add()'s flat scratch: x A^T, dy B, A and B in the activations' dtype
};

/// Training an adapter on a model: while this lives, `model`'s forward and
/// backward add the adapter's terms beside its frozen weights (transformer::
/// set_trained_weights' factors: the adapter's own A and B with f32
/// compute, copies in a 16-bit compute dtype). Both are borrowed and must
/// outlive this. The model may be inference-only (transformer::
/// load_inference: bf16, int8 or nf4 weights, QLoRA): its forward and
/// backward then widen one block's frozen weights to f32 at a time, and
/// compute in f32.
class lora_tuning {
 public:
  /// Has the model compute with the adapter's terms and form no weight
  /// gradient (the head's, the linear weights' and the norms' products are
  /// skipped, and the model makes no gradient buffer for them; the adapted
  /// weights hand their inputs and output gradients to the adapter). Throws
  /// model_error when the adapter is of another shape.
  lora_tuning(transformer& model, lora_adapter& adapter);
  /// The model forms every gradient again, and its f32 weights take the
  /// adapter merged (W0 + s B A, once): the trained model. An
  /// inference-only model's weights stay as they were (the adapter is what
  /// was trained; serve it beside them, or merge it as a checkpoint loads).
  ~lora_tuning();
  lora_tuning(const lora_tuning&) = delete;
  lora_tuning& operator=(const lora_tuning&) = delete;
  /// Before a step's first forward and backward: the adapter's gradients
  /// to zero (the backward adds to them), and the factors in the model's
  /// compute dtype (it may have changed since).
  void zero_grads();
  /// After an update of the adapter: 16-bit copies of its factors follow
  /// (with f32 compute the model reads the adapter's own).
  void refresh();
  /// The adapter's parameters and gradients, for the optimiser.
  std::vector<param_group> groups() { return adapter_->groups(); }
  lora_adapter& adapter() { return *adapter_; }

 private:
  /// The factors the model reads: the adapter's own tensors (f32 compute)
  /// or copies in the compute dtype, made for `factors_dtype_`.
  void make_factors();

  transformer* model_;
  lora_adapter* adapter_;
  span_lora factors_;
  dtype factors_dtype_ = dtype::f32;
};

}  // namespace corolla
