// model/trainer.hpp — the single-process training loop.
//
// One step = zero the gradients, take the next B x T batch from the token
// data (sequential, wrapping; see token_data.hpp), forward and backward
// (mean cross-entropy over the B*T positions), one AdamW step. With
// micro-batches (gradient accumulation) the batch's forward and backward
// run M sequences at a time, each adding its share of the batch mean's
// gradients: the same step to f32 summation order, with the activations
// of M sequences instead of B. Steps are
// numbered from 1 to N, as llm.c and `corolla train` print them: the first
// step reports the loss of the initial weights on the first batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "model/lora.hpp"
#include "model/loss_scale.hpp"
#include "model/optimizer.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"

namespace corolla {

/// What to train and how.
struct train_options {
  int batch = 1;       ///< B sequences per step
  /// M sequences per forward and backward (gradient accumulation): divides
  /// B; 0 (the default) is B, the whole batch at once.
  int micro_batch = 0;
  int seq = 0;         ///< T tokens per sequence; at most the model's context
  int steps = 0;       ///< N steps to run (0 = none: only save, if asked)
  optimizer_settings optimizer;
  /// Step i (1-based) is logged when i == 1, i == N, or i % log_every == 0.
  int log_every = 1;
  /// Draw a progress bar on stderr — only when stderr is a terminal, so
  /// piped or captured output never sees it.
  bool progress = false;
  /// When not empty, run() saves the trained model here (HuggingFace layout,
  /// transformer::save) after the last step; with an adapter, the adapter
  /// (PEFT layout, lora_adapter::save).
  std::filesystem::path save_dir;
  /// When set, only this LoRA adapter trains (model/lora.hpp): the model's
  /// own weights stay as they were while the trainer lives (the adapter's
  /// terms run beside them) and take the adapter merged when it is
  /// destroyed (f32 weights; inference weights, QLoRA, stay as loaded);
  /// AdamW keeps moments of the adapter alone, and clipping and
  /// the gradient norm are over its gradients. Borrowed: it must outlive
  /// the trainer.
  lora_adapter* adapter = nullptr;
  /// With an adapter: base_model_name_or_path in the saved adapter_config.json.
  std::string adapter_base;
};

/// The outcome of one step.
struct step_report {
  int step = 0;                   ///< 1-based
  int total_steps = 0;            ///< N
  float loss = 0.0f;              ///< mean loss of the batch, before the update
  /// Before clipping (unscaled); -1 when clipping and loss scaling are off.
  /// Not finite on a step skipped for overflow.
  double grad_norm = -1.0;
  float loss_scale = 1.0f;        ///< the loss scale this step used (1 without scaling)
  bool skipped = false;           ///< the gradients overflowed: no update (loss scaling)
  double seconds = 0.0;           ///< wall time of this step
  double tokens_per_second = 0.0; ///< B*T / seconds
};

/// The outcome of a whole run.
struct train_summary {
  std::vector<float> losses;       ///< losses[i] is the loss of step i+1
  std::int64_t tokens = 0;         ///< B*T*steps
  std::int64_t skipped_steps = 0;  ///< steps skipped for overflow (loss scaling)
  double seconds = 0.0;            ///< wall time of the steps (not the save)
  double tokens_per_second = 0.0;  ///< tokens / seconds (0 without steps)
};

/// Throws model_error unless `micro_batch` sequences (0: the whole batch)
/// divide a batch of `batch`: the trainer's rule, for callers that check
/// before building a model.
void check_micro_batch(int batch, int micro_batch);

/// Trains `model` (or an adapter of it: train_options::adapter) on `data`.
/// Both are borrowed and must outlive the trainer; the trainer owns the
/// optimiser (and so the AdamW moments).
class trainer {
 public:
  /// Validates the options against the model and the data; throws
  /// model_error for batch < 1, a micro-batch that is negative or does not
  /// divide the batch, seq < 1, steps < 0, log_every < 1, a
  /// sequence longer than the model's context, data with fewer than B*T+1
  /// tokens, or a token id outside the model's vocabulary.
  trainer(transformer& model, token_dataset& data, const train_options& options);

  /// Runs the next step (steps_done() + 1). With dynamic loss scaling
  /// (options.optimizer.loss_scale) the loss gradient is multiplied by the
  /// scaler's scale and a step whose gradients overflow updates nothing
  /// (report.skipped). May be called beyond options.steps (benchmarks); the
  /// options only bound run().
  step_report step();

  /// Runs the remaining steps up to options.steps, calling `on_log` for
  /// each logged step (see train_options::log_every), then saves if
  /// options.save_dir is set.
  train_summary run(const std::function<void(const step_report&)>& on_log = {});

  /// Whether step `step` of `total` is logged with this log_every.
  static bool is_logged(int step, int total, int log_every);

  /// The optimiser (moments, step counter, learning rate for schedules).
  adamw_optimizer& optimizer() { return optimizer_; }
  /// The options as validated by the constructor.
  const train_options& options() const { return options_; }
  /// Steps completed so far, skipped ones included (the optimiser's own
  /// counter leaves those out).
  int steps_done() const { return steps_done_; }
  /// The dynamic loss scale (scale 1 and never skipping when off).
  const loss_scaler& scaler() const { return scaler_; }
  /// Starts a fresh scaler with `s` for the next steps (benchmarks time
  /// f32 compute without the scaling an f16 phase of the same run uses).
  void set_loss_scaling(const loss_scaling& s) { scaler_ = loss_scaler(s); }

 private:
  transformer* model_;
  token_dataset* data_;
  train_options options_;
  std::unique_ptr<lora_tuning> lora_;  ///< with an adapter: before optimizer_, which takes its groups
  adamw_optimizer optimizer_;
  loss_scaler scaler_;
  int steps_done_ = 0;
  std::vector<std::int32_t> ids_;
  std::vector<std::int32_t> targets_;
};

}  // namespace corolla
