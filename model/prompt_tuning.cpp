#include "model/prompt_tuning.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <stdexcept>
#include <vector>

#include "model/error.hpp"
#include "model/safetensors.hpp"

namespace corolla {

namespace {

[[noreturn]] void fail(const span_error& e) {
  throw std::runtime_error(std::string(span_errc_name(e.code)) + ": " + e.message);
}

}  // namespace

// ---- local_span_runner ------------------------------------------------------------

Tensor local_span_runner::forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts,
                                  lora_adapter* adapter) {
  // The adapter goes as a server gets it: its config and the blocks' tensors.
  with_lora_ = adapter != nullptr;
  if (adapter) lora_ = {adapter->config(), adapter->span_values(0, adapter->n_layers())};
  auto out = engine_.forward(hidden, batch, seq, deep_prompts, -1, -1, nullptr, "", with_lora_ ? &lora_ : nullptr);
  if (!out) fail(out.error());
  hidden_ = hidden;
  prompts_ = deep_prompts;
  batch_ = batch;
  seq_ = seq;
  return std::move(out.value());
}

span_gradients local_span_runner::backward(const Tensor& grad_output) {
  if (!hidden_.defined()) throw std::runtime_error("backward without a forward");
  auto g = engine_.backward(hidden_, grad_output, batch_, seq_, prompts_, -1, -1, "", with_lora_ ? &lora_ : nullptr);
  if (!g) fail(g.error());
  return std::move(g.value());
}

// ---- prompt_tuner -------------------------------------------------------------------

prompt_tuner::prompt_tuner(head& h, span_runner& runner, prompt_tuning_options options, lora_adapter* adapter)
    : head_(h), runner_(runner), options_(options), cfg_(h.config()), adapter_(adapter) {
  const std::int64_t P = options_.prompt_len, D = cfg_.hidden_size;
  if (P < 0 || P >= cfg_.max_positions || (P == 0 && !adapter))
    throw model_error("prompt length " + std::to_string(P) + " must be in [" + (adapter ? "0" : "1") + ", " +
                      std::to_string(cfg_.max_positions - 1) + "] (the context is " +
                      std::to_string(cfg_.max_positions) + ")" +
                      (P == 0 && !adapter ? "; 0 only beside a LoRA adapter, with nothing else to train" : ""));
  if (adapter) {
    if (!adapter->fits(cfg_))
      throw model_error("the LoRA adapter was made for another model than this " + cfg_.hf_architecture + " of " +
                        std::to_string(cfg_.n_layers) + " layers");
    adapter->zero_grads();
    optimizer_settings settings;
    settings.adamw = options_.optimizer;
    adapter_optimizer_ = std::make_unique<adamw_optimizer>(adapter->groups(), settings, cpu_backend());
  }
  if (P == 0) return;
  prompts_ = Tensor::zeros({cfg_.n_layers, P, D});
  std::mt19937_64 rng(options_.seed);
  std::normal_distribution<float> dist(0.0f, options_.init_std);
  float* p = prompts_.data<float>();
  const std::int64_t trained = options_.deep ? prompts_.numel() : P * D;
  for (std::int64_t i = 0; i < trained; ++i) p[i] = dist(rng);
  grads_ = Tensor::zeros(prompts_.shape());
  m_ = Tensor::zeros(prompts_.shape());
  v_ = Tensor::zeros(prompts_.shape());
}

Tensor prompt_tuner::input_rows(std::span<const std::int32_t> ids, int batch, int seq) {
  const std::int64_t P = options_.prompt_len, S = P + seq, D = cfg_.hidden_size;
  // Prefix rows enter block 0 as zeros (prompt 0 is added to them there);
  // token t of each sequence sits at position P + t.
  Tensor x = Tensor::zeros({batch * S, D});
  std::vector<std::int32_t> pos(static_cast<std::size_t>(seq));
  for (int t = 0; t < seq; ++t) pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(P + t);
  const Tensor positions = Tensor::from_i32(pos, {seq});
  for (int b = 0; b < batch; ++b) {
    Tensor rows = x.slice(b * S + P, (b + 1) * S);
    head_.embed(Tensor::from_i32(ids.subspan(static_cast<std::size_t>(b) * seq, static_cast<std::size_t>(seq)), {seq}),
                positions, rows);
  }
  return x;
}

float prompt_tuner::run(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch, int seq,
                        pass what) {
  if (batch < 1 || seq < 1)
    throw model_error("a prompt-tuning batch needs B >= 1 and T >= 1, got B=" + std::to_string(batch) +
                      " T=" + std::to_string(seq));
  const std::int64_t P = options_.prompt_len, S = P + seq, D = cfg_.hidden_size;
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  if (ids.size() != n || targets.size() != n)
    throw model_error("a prompt-tuning batch of " + std::to_string(batch) + " x " + std::to_string(seq) +
                      " tokens needs " + std::to_string(n) + " ids and targets, got " + std::to_string(ids.size()) +
                      " and " + std::to_string(targets.size()));
  if (S > cfg_.max_positions)
    throw model_error("prompt (" + std::to_string(P) + ") plus sequence (" + std::to_string(seq) +
                      ") is beyond the model's context of " + std::to_string(cfg_.max_positions));
  const Tensor out = runner_.forward(input_rows(ids, batch, seq), batch, static_cast<int>(S), prompts_, adapter_);
  // The head sees the token rows only.
  Tensor tokens = Tensor::empty({batch * static_cast<std::int64_t>(seq), D});
  for (int b = 0; b < batch; ++b) tokens.slice(b * seq, (b + 1) * seq).copy_from(out.slice(b * S + P, (b + 1) * S));
  const Tensor target_rows = Tensor::from_i32({targets.begin(), targets.end()}, {static_cast<std::int64_t>(n)});
  if (what == pass::loss) return head_.loss(tokens, target_rows, nullptr, 1.0f, saved_);
  Tensor d_tokens = Tensor::empty(tokens.shape());
  const float loss = head_.loss(tokens, target_rows, &d_tokens, 1.0f, saved_, /*param_grads=*/false);
  Tensor d_out = Tensor::zeros(out.shape());
  for (int b = 0; b < batch; ++b) d_out.slice(b * S + P, (b + 1) * S).copy_from(d_tokens.slice(b * seq, (b + 1) * seq));
  span_gradients g = runner_.backward(d_out);
  if (P > 0) {
    if (!g.grad_prompts.defined() || g.grad_prompts.shape() != prompts_.shape())
      throw std::runtime_error("the blocks returned no prompt gradient of shape " + shape_str(prompts_.shape()));
    grads_.copy_from(g.grad_prompts);
    if (!options_.deep) grads_.slice(1, cfg_.n_layers).zero();  // only prompt 0 trains
  }
  if (adapter_) {
    const std::int64_t want = adapter_->block_numel() * adapter_->n_layers();
    if (!g.grad_lora.defined() || g.grad_lora.numel() != want)
      throw std::runtime_error("the blocks returned " +
                               std::to_string(g.grad_lora.defined() ? g.grad_lora.numel() : 0) +
                               " adapter gradient values, expected " + std::to_string(want));
    adapter_->set_span_values(0, adapter_->n_layers(), g.grad_lora, /*grads=*/true);
  }
  if (what == pass::gradients) return loss;
  ++step_;
  if (P > 0) cpu_backend().adamw(prompts_, grads_, m_, v_, options_.optimizer, step_);
  if (adapter_) adapter_optimizer_->step();
  return loss;
}

float prompt_tuner::step(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch,
                         int seq) {
  return run(ids, targets, batch, seq, pass::step);
}

float prompt_tuner::gradients(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch,
                              int seq) {
  return run(ids, targets, batch, seq, pass::gradients);
}

float prompt_tuner::loss(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, int batch,
                         int seq) {
  return run(ids, targets, batch, seq, pass::loss);
}

void prompt_tuner::save(const std::filesystem::path& file) const {
  if (!prompts_.defined()) throw model_error("no prompts were trained (prompt length 0): nothing to save as prompts");
  write_safetensors(file, {{"deep_prompts", prompts_}},
                    {{"corolla.tuning", options_.deep ? "deep_ptune" : "ptune"},
                     {"corolla.steps", std::to_string(step_)},
                     {"corolla.prompt_len", std::to_string(options_.prompt_len)}});
}

namespace {

/// save_state's tensors of a tuner, by name: the prompts' and each adapter
/// block's values and AdamW moments.
std::vector<std::pair<std::string, Tensor>> state_tensors(const Tensor& prompts, const Tensor& m, const Tensor& v,
                                                          lora_adapter* adapter, const adamw_optimizer* opt) {
  std::vector<std::pair<std::string, Tensor>> out;
  if (prompts.defined()) out.insert(out.end(), {{"prompts", prompts}, {"prompts.m", m}, {"prompts.v", v}});
  if (adapter)
    for (int i = 0; i < adapter->n_layers(); ++i) {
      const std::string name = "adapter." + std::to_string(i);
      const auto g = static_cast<std::size_t>(i);
      out.insert(out.end(), {{name, adapter->block(i).flat()},
                             {name + ".m", opt->m(g).flat()},  // handles: a load writes through them
                             {name + ".v", opt->v(g).flat()}});
    }
  return out;
}

}  // namespace

void prompt_tuner::save_state(const std::filesystem::path& file, const std::map<std::string, std::string>& meta) const {
  std::map<std::string, std::string> all = meta;
  all[tuning_state_step_key] = std::to_string(step_);
  write_safetensors(file, state_tensors(prompts_, m_, v_, adapter_, adapter_optimizer_.get()), all);
}

namespace {

/// Whether every value of an f32 host tensor (a state tensor, or a file's
/// checked to be f32 first) is finite.
bool all_finite(const Tensor& t) {
  const float* v = t.data<float>();
  return std::all_of(v, v + t.numel(), [](float x) { return std::isfinite(x); });
}

}  // namespace

bool prompt_tuner::state_is_finite() const {
  for (const auto& [name, t] : state_tensors(prompts_, m_, v_, adapter_, adapter_optimizer_.get()))
    if (!all_finite(t)) return false;
  return true;
}

std::map<std::string, std::string> prompt_tuner::load_state(const std::filesystem::path& file) {
  const auto f = safetensors_file::open(file);
  const auto refuse = [&](const std::string& why) { throw model_error(file.string() + ": " + why); };
  const auto tensors = state_tensors(prompts_, m_, v_, adapter_, adapter_optimizer_.get());
  // Every tensor checked before any is copied: a refused file changes nothing.
  for (const auto& [name, t] : tensors) {
    const tensor_info* info = f->find(name);
    if (!info) refuse("holds no '" + name + "': it was written by a tuner of other things (prompts, adapter)");
    if (info->shape != t.shape() || info->type != dtype::f32)
      refuse("'" + name + "' is " + dtype_name(info->type) + " " + shape_str(info->shape) + ", this run's is f32 " +
             shape_str(t.shape()));
    if (!all_finite(f->view(name))) refuse("'" + name + "' holds a value that is not finite");
  }
  if (f->tensors().size() != tensors.size())
    refuse("holds " + std::to_string(f->tensors().size()) + " tensors, this run's state " +
           std::to_string(tensors.size()) + ": it was written by a tuner of other things (prompts, adapter)");
  const auto meta = f->metadata();
  const auto step = meta.find(tuning_state_step_key);
  std::int64_t steps = -1;
  try {
    if (step != meta.end()) steps = std::stoll(step->second);
  } catch (const std::exception&) {
  }
  if (steps < 0) refuse("no step count in its metadata (" + std::string(tuning_state_step_key) + ")");
  for (const auto& [name, t] : tensors) {
    Tensor dst = t;
    dst.copy_from(f->view(name));
  }
  step_ = steps;
  if (adapter_optimizer_) adapter_optimizer_->set_steps(steps);
  return meta;
}

Tensor load_deep_prompts(const std::filesystem::path& file, const model_config& cfg) {
  const auto f = safetensors_file::open(file);
  const tensor_info* info = f->find("deep_prompts");
  if (!info) throw model_error(file.string() + " has no 'deep_prompts' tensor (write it with corolla finetune --save)");
  const shape_t& s = info->shape;
  if (s.size() != 3 || s[0] != cfg.n_layers || s[1] < 1 || s[2] != cfg.hidden_size)
    throw model_error(file.string() + ": deep_prompts is " + shape_str(s) + ", the model needs [" +
                      std::to_string(cfg.n_layers) + ", P, " + std::to_string(cfg.hidden_size) + "]");
  Tensor prompts = f->view("deep_prompts").to(dtype::f32).clone();  // owned: the mapping goes with `f`
  // A NaN here would surface as the model's logits going bad, blamed on
  // its weights; name the file instead.
  const float* v = prompts.data<float>();
  for (std::int64_t i = 0; i < prompts.numel(); ++i)
    if (!std::isfinite(v[i]))
      throw model_error(file.string() + ": deep_prompts holds a non-finite value (" + std::to_string(v[i]) +
                        " at element " + std::to_string(i) + ")");
  return prompts;
}

}  // namespace corolla
