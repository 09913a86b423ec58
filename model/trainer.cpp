#include "model/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>

#include "model/error.hpp"
#include "model/progress_bar.hpp"

namespace corolla {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Checked before the optimiser is built so a bad option never allocates.
const train_options& validated(const transformer& model, const token_dataset& data,
                               const train_options& o) {
  if (o.batch < 1)
    throw model_error("batch size must be at least 1 (got " + std::to_string(o.batch) + ")");
  check_micro_batch(o.batch, o.micro_batch);
  if (o.seq < 1)
    throw model_error("sequence length must be at least 1 (got " + std::to_string(o.seq) + ")");
  if (o.steps < 0)
    throw model_error("number of steps must not be negative (got " + std::to_string(o.steps) +
                      ")");
  if (o.log_every < 1)
    throw model_error("log interval must be at least 1 (got " + std::to_string(o.log_every) +
                      ")");
  const int context = model.config().max_positions;
  if (context > 0 && o.seq > context)
    throw model_error("sequence length " + std::to_string(o.seq) +
                      " is longer than the model's context of " + std::to_string(context) +
                      " positions");
  const auto needed = static_cast<std::int64_t>(o.batch) * o.seq + 1;
  if (static_cast<std::int64_t>(data.size()) < needed)
    throw model_error("training data holds " + std::to_string(data.size()) +
                      " tokens, but one batch of " + std::to_string(o.batch) + " x " +
                      std::to_string(o.seq) + " needs at least " + std::to_string(needed));
  // token_dataset checks ids when it is given the vocabulary size; one built
  // without it must not reach the embedding with an id it cannot look up.
  const int vocab = model.config().vocab_size;
  const auto tokens = data.tokens();
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw model_error("training data holds token id " + std::to_string(tokens[i]) +
                        " at position " + std::to_string(i) +
                        ", outside the model's vocabulary of " + std::to_string(vocab));
  return o;
}

}  // namespace

trainer::trainer(transformer& model, token_dataset& data, const train_options& options)
    : model_(&model),
      data_(&data),
      options_(validated(model, data, options)),
      lora_(options.adapter ? std::make_unique<lora_tuning>(model, *options.adapter) : nullptr),
      optimizer_(lora_ ? lora_->groups() : model.groups(), options.optimizer, model.backend()),
      scaler_(options.optimizer.loss_scale) {}

void check_micro_batch(int batch, int micro_batch) {
  if (micro_batch < 0)
    throw model_error("micro-batch size must not be negative (got " + std::to_string(micro_batch) +
                      "; 0 is the whole batch)");
  if (micro_batch > 0 && batch % micro_batch != 0)
    throw model_error("a micro-batch of " + std::to_string(micro_batch) + " sequences does not divide the batch of " +
                      std::to_string(batch));
}

bool trainer::is_logged(int step, int total, int log_every) {
  return step == 1 || step == total || (log_every > 0 && step % log_every == 0);
}

step_report trainer::step() {
  const auto start = clock_type::now();
  const int B = options_.batch, T = options_.seq;
  model_->zero_grads();
  if (lora_) lora_->zero_grads();
  optimizer_.set_lr(scheduled_lr(options_.optimizer.adamw.lr, options_.optimizer.schedule, steps_done() + 1,
                                 std::max(options_.steps, steps_done() + 1)));
  data_->next_batch(B, T, ids_, targets_);
  // With a 16-bit compute dtype, AdamW writes the blocks' compute weights
  // in its own pass (asked each step: the dtype may be set after this
  // trainer was made).
  if (!lora_) optimizer_.set_compute_copies(model_->compute_copies());
  step_report r;
  r.loss_scale = scaler_.scale();
  // Micro-batch j adds the gradients of its mean loss times scale / k: the
  // batch mean's, since every micro-batch has M*T of the B*T positions.
  const int M = options_.micro_batch > 0 ? options_.micro_batch : B, k = B / M;
  const std::size_t rows = static_cast<std::size_t>(M) * static_cast<std::size_t>(T);
  const std::span<const std::int32_t> ids(ids_), targets(targets_);
  double loss = 0.0;
  for (int j = 0; j < k; ++j)
    loss += model_->forward_backward(ids.subspan(j * rows, rows), targets.subspan(j * rows, rows), M, T,
                                     r.loss_scale / static_cast<float>(k));
  r.loss = static_cast<float>(loss / k);
  if (scaler_.dynamic()) {
    r.grad_norm = optimizer_.step_unscaling(r.loss_scale);
    r.skipped = overflowed(r.grad_norm);
    scaler_.update(r.skipped);
  } else {
    r.grad_norm = optimizer_.step();
  }
  if (!r.skipped) {
    if (lora_)
      lora_->refresh();
    else if (optimizer_.writes_compute_copies())
      model_->compute_copies_written();
    else
      model_->params_changed();
  }
  model_->backend().synchronize();
  ++steps_done_;
  r.step = steps_done();
  r.total_steps = std::max(options_.steps, r.step);
  r.seconds = seconds_since(start);
  r.tokens_per_second = r.seconds > 0.0 ? static_cast<double>(B) * T / r.seconds : 0.0;
  return r;
}

train_summary trainer::run(const std::function<void(const step_report&)>& on_log) {
  train_summary s;
  progress_bar bar(options_.progress);
  const auto start = clock_type::now();
  while (steps_done() < options_.steps) {
    step_report r = step();
    s.losses.push_back(r.loss);
    if (r.skipped) ++s.skipped_steps;
    s.tokens += static_cast<std::int64_t>(options_.batch) * options_.seq;
    if (on_log && is_logged(r.step, options_.steps, options_.log_every)) {
      bar.clear();
      on_log(r);
    }
    bar.draw_step(r.step, r.total_steps, r.loss, r.tokens_per_second);
  }
  s.seconds = seconds_since(start);
  s.tokens_per_second = s.seconds > 0.0 ? static_cast<double>(s.tokens) / s.seconds : 0.0;
  bar.finish();
  if (!options_.save_dir.empty()) {
    // A diverged model is not saved over what the directory holds.
    if (!s.losses.empty() && !std::isfinite(s.losses.back()))
      throw model_error("the loss of step " + std::to_string(steps_done()) + " is not finite: the model diverged "
                        "and is not saved (" + options_.save_dir.string() + " is unchanged)");
    if (options_.adapter)
      options_.adapter->save(options_.save_dir, options_.adapter_base);
    else
      model_->save(options_.save_dir);
  }
  return s;
}

}  // namespace corolla
