// model/prompt_tuning.hpp — tuning a frozen model the way a swarm's
// fine-tuning client does it (Petals' ptune / deep_ptune, and LoRA): (deep)
// prompts, a LoRA adapter of the blocks, or both.
//
// The client holds the head (embeddings, final norm, LM head; frozen) and
// what trains: the prompts and the adapter, with their AdamW moments. The
// blocks run elsewhere, behind a span_runner: the swarm's servers
// (actors/swarm_finetune.hpp), which get the adapter's factors of their
// blocks with each request and answer their gradients, or local blocks (the
// reference the swarm must equal).
//
// Layout of one batch: each of the B sequences gets P prefix positions in
// front of its T tokens (P = 0 without prompts), so the blocks see B
// sequences of P + T rows. Prefix rows enter block 0 as zeros; deep prompt i
// ([P, D]) is added to the first P rows of every sequence at the input of
// block i (span_engine's deep prompts). Shallow prompt tuning trains prompt
// 0 only, which is then the prefix's input embedding; the others stay zero.
// The loss is the mean next-token cross-entropy over the B*T token rows
// (prefix rows have no target); gradients reach the prompts and the adapter
// only (the model is frozen), and AdamW updates them on the client. With
// an adapter alone the steps equal a single process's LoRA training
// (lora_tuning) with the same optimiser.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "kernels/backend.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/optimizer.hpp"
#include "model/span_engine.hpp"

namespace corolla {

/// Runs the model's blocks [0, n_blocks) for a prompt tuner: stateless
/// forward, then the backward of that same forward. Throws
/// std::runtime_error (with the reason) when it cannot.
class span_runner {
 public:
  virtual ~span_runner() = default;
  /// hidden [B*S, D] rows of B sequences of S positions; deep_prompts
  /// [n_blocks, P, D] or undefined; `adapter` (of every block, on the host)
  /// or null. Returns the last block's output [B*S, D].
  virtual Tensor forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts,
                         lora_adapter* adapter = nullptr) = 0;
  /// Backward of the last forward(), given the loss gradient of its output:
  /// the gradient of the input, of every block's prompts (with prompts) and
  /// of the adapter's values (with one: grad_lora, laid out as
  /// lora_adapter::span_values(0, n_blocks)).
  virtual span_gradients backward(const Tensor& grad_output) = 0;
};

/// The blocks of a local checkpoint (a span_engine over all of them).
class local_span_runner final : public span_runner {
 public:
  explicit local_span_runner(span_engine& engine) : engine_(engine) {}
  Tensor forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts,
                 lora_adapter* adapter = nullptr) override;
  span_gradients backward(const Tensor& grad_output) override;

 private:
  span_engine& engine_;
  Tensor hidden_, prompts_;
  lora_span_values lora_;  ///< the forward's adapter, carried as a server gets it
  bool with_lora_ = false;
  int batch_ = 0, seq_ = 0;
};

/// What prompt tuning trains and how.
struct prompt_tuning_options {
  int prompt_len = 16;  ///< P, prefix positions per sequence; 0 = no prompts (an adapter alone)
  bool deep = true;     ///< a prompt per block; false = block 0's only (shallow)
  adamw_params optimizer{.lr = 1e-2f};
  float init_std = 0.02f;  ///< trained prompts start as N(0, init_std) (seeded)
  std::uint64_t seed = 0;
};

/// Reads the prompts prompt_tuner::save wrote (`deep_prompts`, any float
/// dtype) as f32 [n_layers, P, D] host memory, for generator::
/// set_deep_prompts. Throws model_error naming the file for a missing file or
/// tensor, or a shape that does not fit `cfg`.
Tensor load_deep_prompts(const std::filesystem::path& file, const model_config& cfg);

/// The metadata key of prompt_tuner::save_state's step count.
inline constexpr const char* tuning_state_step_key = "corolla.step";

/// Tuning of a frozen model's prompts and/or a LoRA adapter of its blocks
/// through a span_runner. Not thread-safe.
class prompt_tuner {
 public:
  /// `h` is the model's head (frozen: its gradients are never formed).
  /// With `adapter` (borrowed, on the host, of h's model), it trains too,
  /// with AdamW of options.optimizer (an adamw_optimizer over its groups:
  /// the single-process trainer's). Throws model_error for a bad option (P
  /// < 0, P = 0 without an adapter, P beyond the context) or an adapter of
  /// another model.
  prompt_tuner(head& h, span_runner& runner, prompt_tuning_options options, lora_adapter* adapter = nullptr);

  /// One optimiser step on B sequences of T tokens: ids and targets are
  /// [B, T] row-major (token_dataset::next_batch); target -1 = no loss.
  /// Returns the mean loss over the token rows before the update. Throws
  /// model_error for bad shapes or ids, and what the runner throws.
  float step(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch, int seq);
  /// The mean loss on a batch, without gradients or an update.
  float loss(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch, int seq);
  /// The mean loss and its gradient with respect to the prompts
  /// (prompt_gradients()), without an update.
  float gradients(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch, int seq);

  /// The prompts [n_blocks, P, D] (shallow: rows of blocks >= 1 stay zero;
  /// undefined with P = 0); values may be changed in place (e.g. to resume
  /// from a saved file).
  Tensor& prompts() { return prompts_; }
  const Tensor& prompts() const { return prompts_; }
  /// The gradient of the last step() or gradients() call, [n_blocks, P, D]
  /// (shallow: zero beyond block 0).
  const Tensor& prompt_gradients() const { return grads_; }
  /// The adapter trained beside the prompts, or null (its gradients of the
  /// last step() or gradients() call are its groups()' gradients).
  lora_adapter* adapter() { return adapter_; }
  /// Steps taken.
  std::int64_t steps() const { return step_; }
  /// Writes the prompts as safetensors ("deep_prompts", f32 [n_blocks, P, D],
  /// with metadata: mode, steps). Throws model_error with P = 0.
  void save(const std::filesystem::path& file) const;

  /// Writes what this tuner needs to go on as if it had never stopped (a
  /// client's checkpoint): the prompts and their AdamW moments, the
  /// adapter's blocks and theirs, and the step count, with `meta` (the
  /// caller's account of the run) as the file's metadata; safetensors,
  /// through a temporary file and a rename.
  void save_state(const std::filesystem::path& file, const std::map<std::string, std::string>& meta) const;
  /// Whether every value save_state would write is finite (a state that
  /// diverged is not worth keeping over an older one).
  bool state_is_finite() const;
  /// Restores save_state's file into this tuner, which must train the same
  /// things of the same shapes and hold finite values (model_error naming
  /// the file and what differs otherwise, nothing changed then); returns
  /// the file's metadata.
  std::map<std::string, std::string> load_state(const std::filesystem::path& file);

 private:
  Tensor input_rows(std::span<const std::int32_t> ids, int batch, int seq);
  enum class pass { loss, gradients, step };
  float run(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch, int seq, pass what);

  head& head_;
  span_runner& runner_;
  prompt_tuning_options options_;
  model_config cfg_;
  Tensor prompts_, grads_, m_, v_;
  lora_adapter* adapter_ = nullptr;
  std::unique_ptr<adamw_optimizer> adapter_optimizer_;
  head_activations saved_;
  std::int64_t step_ = 0;
};

}  // namespace corolla
