#include "model/stage.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "model/hf_names.hpp"

namespace corolla {

dtype parse_compute_dtype(const std::string& text) {
  if (const auto t = float_dtype_named(text)) return *t;
  throw std::invalid_argument("the compute dtype is f32, bf16 or f16, not '" + text + "'");
}

stage::stage(const model_config& cfg, int first, int last, Backend& be)
    : cfg_(cfg), be_(&be), first_(first), decode_ws_(cfg) {
  if (first < 0 || last < first || last > cfg.n_layers)
    throw std::invalid_argument("stage: blocks [" + std::to_string(first) + ", " +
                                std::to_string(last) + ") outside the model's " +
                                std::to_string(cfg.n_layers) + " layers");
  const auto layout = block_layout(cfg);
  for (int i = first; i < last; ++i) params_.emplace_back(layout);
  blocks_ = last - first;
  resolve_views();
}

stage::stage(const model_config& cfg, int first, std::vector<param_set> params, Backend& be)
    : cfg_(cfg), be_(&be), first_(first), blocks_(static_cast<int>(params.size())), params_(std::move(params)),
      decode_ws_(cfg) {
  if (first < 0 || first + size() > cfg.n_layers)
    throw std::invalid_argument("stage: blocks [" + std::to_string(first) + ", " +
                                std::to_string(first + size()) + ") outside the model's " +
                                std::to_string(cfg.n_layers) + " layers");
  resolve_views();
}

stage stage::load(const checkpoint& ck, const model_config& cfg, int first, int last,
                  Backend& be, const std::function<void(int done, int total)>& on_block) {
  stage s(cfg, first, last, be);
  for (int i = 0; i < s.size(); ++i) {
    load_block_params(ck, cfg, first + i, s.params_[i]);
    place_params(s.params_[i], be);  // a device backend computes on device parameters
    if (on_block) on_block(i + 1, s.size());
  }
  s.resolve_views();
  return s;
}

stage stage::load_inference(const checkpoint& ck, const model_config& cfg, int first, int last, Backend& be,
                            weight_format f, const std::function<void(int done, int total)>& on_block) {
  if (last < first || last > cfg.n_layers)
    throw std::invalid_argument("stage: blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                                ") outside the model's " + std::to_string(cfg.n_layers) + " layers");
  const auto layout = block_layout(cfg);
  return inference_stage(cfg, first, last - first, be, f, [&](int i) {
    param_set p(layout);
    load_block_params(ck, cfg, first + i, p);
    place_params(p, be);
    return p;
  }, on_block);
}

stage stage::inference_of(const model_config& cfg, int first, const std::vector<param_set>& params, Backend& be,
                          weight_format f) {
  if (first < 0 || first + static_cast<int>(params.size()) > cfg.n_layers)
    throw std::invalid_argument("stage: blocks [" + std::to_string(first) + ", " +
                                std::to_string(first + static_cast<int>(params.size())) + ") outside the model's " +
                                std::to_string(cfg.n_layers) + " layers");
  return inference_stage(cfg, first, static_cast<int>(params.size()), be, f,
                         [&](int i) { return params[static_cast<std::size_t>(i)]; });
}

stage stage::sharing_inference_weights(const stage& other) {
  if (other.inference_format_ == weight_format::f32 || other.inference_weights_.empty())
    throw tensor_error("stage::sharing_inference_weights: the other stage holds no inference weights (f32 weights are "
                       "its parameters)");
  stage s(other.cfg_, other.first_, other.first_, *other.be_);
  s.inference_weights_ = other.inference_weights_;  // Tensor copies share storage
  s.blocks_ = other.blocks_;
  s.inference_format_ = other.inference_format_;
  return s;
}

stage stage::inference_stage(const model_config& cfg, int first, int n, Backend& be, weight_format f,
                             const std::function<param_set(int i)>& block_params,
                             const std::function<void(int done, int total)>& on_block) {
  if (f == weight_format::f32)
    throw tensor_error("stage: f32 inference weights are the parameters (use stage::load or the parameters' stage)");
  stage s(cfg, first, first, be);
  for (int i = 0; i < n; ++i) {
    const param_set p = block_params(i);
    s.inference_weights_.push_back(own_shared_views(be, inference_weights(be, block_tensors::of(cfg, p), f), p));
    if (on_block) on_block(i + 1, n);
  }  // each block's parameters are let go here, before the next is read
  s.blocks_ = n;
  s.inference_format_ = f;
#ifdef __GLIBC__
  // glibc keeps the freed f32 blocks' pages in its heap (its mmap threshold
  // rises past a block's size once one is freed): hand them back, or the
  // process goes on holding close to the f32 bytes it loaded this way to
  // save (a 2-stage QLoRA rank of a 100M model: 450 MB resident, not 300).
  malloc_trim(0);
#endif
  return s;
}

void stage::require_parameters(const char* what) const {
  if (inference_only())
    throw tensor_error(std::string("stage::") + what + ": this stage holds inference weights only (" +
                       weight_format_name(inference_format_) + "; its f32 parameters were not kept)");
}

const block_tensors& stage::frozen_weights(int i) {
  const auto k = static_cast<std::size_t>(i);
  if (!inference_only()) return weights_.at(k);
  // A mixture of experts' experts stay as served and are widened one at a
  // time when rows are routed to them (block_tensors::expert_scratch).
  widened_.expert_scratch = &widened_expert_;
  widen_block_weights(*be_, cfg_, inference_weights_.at(k), widened_, false);
  return widened_;
}

std::int64_t stage::frozen_scratch_bytes() const {
  std::int64_t n = 0;
  const block_tensors& b = widened_;
  const expert_tensors& e = widened_expert_;
  // The widened linear weights only: the rest is shared with the inference weights.
  for (const Tensor* t : {&b.q_w, &b.k_w, &b.v_w, &b.o_w, &b.gate_w, &b.up_w, &b.down_w, &e.gate_w, &e.up_w, &e.down_w})
    if (t->defined()) n += static_cast<std::int64_t>(t->nbytes());
  return n;
}

void stage::resolve_views() {
  weights_.clear();
  for (const auto& p : params_) weights_.push_back(block_tensors::of(cfg_, p));
}

void stage::use_inference_weights(weight_format f) {
  if (inference_only()) {
    if (f == inference_format_) return;
    require_parameters("use_inference_weights");
  }
  std::vector<block_tensors> converted;
  if (f != weight_format::f32)
    for (const auto& w : weights_) converted.push_back(inference_weights(*be_, w, f));
  inference_weights_ = std::move(converted);
  inference_format_ = f;
}

void stage::share_inference_weights(const stage& other) {
  if (&other == this) return;
  if (other.be_ != be_ || other.first_ != first_ || other.blocks_ != blocks_ ||
      other.cfg_.hidden_size != cfg_.hidden_size || other.cfg_.n_layers != cfg_.n_layers)
    throw tensor_error("stage::share_inference_weights: the other stage holds other blocks, another shape or "
                       "another backend");
  if (inference_only() && other.inference_format_ != inference_format_)
    require_parameters("share_inference_weights");
  inference_weights_ = other.inference_weights_;  // Tensor copies share storage
  inference_format_ = other.inference_format_;
}

std::vector<param_set>& stage::grads() {
  require_parameters("grads");
  if (grads_.empty()) {
    for (const auto& p : params_) grads_.push_back(p.like());
    resolve_grad_views();
  }
  return grads_;
}

namespace {

/// The weights stage::set_trained_weights may name, with the block_tensors
/// roles of each one's weight and bias (null: none).
struct trainable_role {
  const char* name;
  Tensor block_tensors::*weight;
  Tensor block_tensors::*bias;
};
constexpr trainable_role trainable_roles[] = {
    {"attn_norm.weight", &block_tensors::attn_norm_w, &block_tensors::attn_norm_b},
    {"q.weight", &block_tensors::q_w, &block_tensors::q_b},
    {"k.weight", &block_tensors::k_w, &block_tensors::k_b},
    {"v.weight", &block_tensors::v_w, &block_tensors::v_b},
    {"q_norm.weight", &block_tensors::q_norm_w, nullptr},
    {"k_norm.weight", &block_tensors::k_norm_w, nullptr},
    {"o.weight", &block_tensors::o_w, &block_tensors::o_b},
    {"mlp_norm.weight", &block_tensors::mlp_norm_w, &block_tensors::mlp_norm_b},
    {"gate.weight", &block_tensors::gate_w, nullptr},
    {"up.weight", &block_tensors::up_w, &block_tensors::up_b},
    {"down.weight", &block_tensors::down_w, &block_tensors::down_b}};

}  // namespace

void stage::set_trained_weights(std::optional<std::set<std::string>> names, frozen_weight_grads* frozen,
                                const span_lora* lora) {
  if (lora && static_cast<int>(lora->blocks.size()) != size())
    throw tensor_error("stage: LoRA factors of " + std::to_string(lora->blocks.size()) + " blocks for a stage of " +
                       std::to_string(size()));
  if (names && !names->empty()) require_parameters("set_trained_weights (an inference stage's weights stay frozen)");
  if (names) {
    const auto layout = block_layout(cfg_);
    for (const std::string& n : *names) {
      if (std::none_of(std::begin(trainable_roles), std::end(trainable_roles),
                       [&](const trainable_role& r) { return n == r.name; }))
        throw tensor_error("stage: '" + n + "' is not a block weight that trains alone (a linear or norm weight)");
      if (std::none_of(layout.begin(), layout.end(), [&](const auto& e) { return e.first == n; }))
        throw tensor_error("stage: this " + cfg_.hf_architecture + " has no '" + n + "' in its blocks");
    }
  }
  trained_ = std::move(names);
  frozen_grads_ = trained_ ? frozen : nullptr;
  train_lora_ = trained_ ? lora : nullptr;
  resolve_grad_views();
}

bool stage::forms_parameter_grads() const { return !trained_ || !trained_->empty(); }

void stage::resolve_grad_views() {
  grad_views_.clear();
  for (const auto& g : grads_) {
    block_tensors v = block_tensors::of(cfg_, g);
    if (trained_) {
      // A frozen weight's gradient (and its bias's) is left undefined:
      // block_backward then forms only the input's gradient through it.
      for (const trainable_role& r : trainable_roles)
        if (!trained_->count(r.name)) {
          v.*r.weight = Tensor();
          if (r.bias) v.*r.bias = Tensor();
        }
      // A mixture of experts' MLP (router, experts, shared expert) is
      // frozen whole: block_backward then forms only its input gradient.
      v.router_w = Tensor();
      v.shared_gate_w = Tensor();
      v.experts.clear();
    }
    grad_views_.push_back(std::move(v));
  }
}

void stage::zero_grads() {
  for (auto& g : grads_) g.flat().zero();
  // A step's updates come before the next step's zero_grads: the copies
  // are converted again, unless the update itself wrote them.
  if (!copies_written_) compute_stale_ = true;
  copies_written_ = false;
}

void stage::set_compute_dtype(dtype t) {
  if (!is_float_dtype(t))
    throw tensor_error(std::string("stage: the compute dtype is f32, bf16 or f16, not ") + dtype_name(t));
  if (inference_only()) {
    // Its frozen weights are widened to f32 for training passes (train_weights).
    if (t != dtype::f32)
      throw tensor_error(std::string("stage: a stage of ") + weight_format_name(inference_format_) +
                         " inference weights trains (an adapter beside them) in f32, not " + dtype_name(t));
    return;
  }
  if (t != dtype::f32 && be_->dev().kind == device_kind::cpu)
    throw tensor_error(std::string("stage: the cpu backend computes in f32; a ") + dtype_name(t) +
                       " compute dtype needs a device backend");
  compute_weights_.clear();
  compute_copies_.clear();
  if (t != dtype::f32)
    for (std::size_t b = 0; b < weights_.size(); ++b) {
      // One flat copy of the block's parameter buffer; the compute weights
      // are views of it (the norms' places in it go unused).
      compute_copies_.push_back(be_->empty({params_[b].size()}, t));
      compute_weights_.push_back(compute_weights_in(weights_[b], params_[b], compute_copies_.back()));
    }
  compute_dtype_ = t;
  params_changed();
}

const block_tensors& stage::train_weights(int i) {
  if (inference_only()) return frozen_weights(i);  // widened, one block at a time
  if (compute_weights_.empty()) return weights_[static_cast<std::size_t>(i)];
  if (compute_stale_) {
    for (std::size_t b = 0; b < weights_.size(); ++b) be_->copy(params_[b].flat(), compute_copies_[b]);
    compute_stale_ = false;
  }
  return compute_weights_[static_cast<std::size_t>(i)];
}

const Tensor& stage::in_compute_dtype(const Tensor& t, Tensor& buffer) {
  if (t.type() == compute_dtype_) return t;
  ensure_tensor(*be_, buffer, t.shape(), compute_dtype_);
  be_->copy(t, buffer);
  return buffer;
}

const Tensor& stage::train_positions(int batch, int seq) {
  if (!positions_.defined() || positions_batch_ != batch || positions_seq_ != seq) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(batch) * seq);
    for (std::size_t i = 0; i < pos.size(); ++i)
      pos[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(seq));
    // On the host whatever the backend: a device backend validates index
    // tensors on the host and uploads them with the op, where a device copy
    // would be read back (a stream synchronisation) by every op taking it.
    positions_ = Tensor::from_i32(pos, {static_cast<std::int64_t>(pos.size())});
    positions_batch_ = batch;
    positions_seq_ = seq;
  }
  return positions_;
}

void stage::forward(const Tensor& x, int batch, int seq, Tensor& y, stage_activations* saved) {
  const std::int64_t N = static_cast<std::int64_t>(batch) * seq;
  const std::int64_t D = cfg_.hidden_size;
  expect_shape(x, {N, D}, "stage::forward x");
  expect_shape(y, {N, D}, "stage::forward y");
  if (size() == 0) {
    be_->copy(x, y);
    return;
  }
  const Tensor& pos = train_positions(batch, seq);
  // The blocks compute in the compute dtype; x and y are converted at the
  // ends when theirs differs (saved->input keeps block 0's input).
  const dtype act = compute_dtype_;
  const Tensor* in = saved ? &in_compute_dtype(x, saved->input) : &in_compute_dtype(x, boundary_in_);
  if (saved && in == &x) saved->input = Tensor{};
  Tensor* last_out = y.type() == act ? &y : &ensure_tensor(*be_, boundary_out_, {N, D}, act);
  if (saved) {
    saved->blocks.resize(static_cast<std::size_t>(size()));
    saved->inputs.resize(static_cast<std::size_t>(size()));
    for (int i = 0; i < size(); ++i) {
      const auto b = static_cast<std::size_t>(i);
      Tensor* out = last_out;
      if (i + 1 < size()) out = &ensure_tensor(*be_, saved->inputs[b + 1], {N, D}, act);
      block_forward(*be_, cfg_, train_weights(i), *in, pos, batch, seq, *out, saved->blocks[b], train_lora(i));
      in = out;
    }
  } else {
    // No backward to come: ping-pong between two scratch buffers.
    ensure_tensor(*be_, ping_, {N, D}, act);
    ensure_tensor(*be_, pong_, {N, D}, act);
    for (int i = 0; i < size(); ++i) {
      Tensor* out = (i + 1 == size()) ? last_out : (i % 2 == 0 ? &ping_ : &pong_);
      block_forward(*be_, cfg_, train_weights(i), *in, pos, batch, seq, *out, scratch_acts_, train_lora(i));
      in = out;
    }
  }
  if (last_out != &y) be_->copy(*last_out, y);
}

void stage::backward(const stage_activations& saved, const Tensor& dy, Tensor& dx,
                     const std::function<void(int)>& on_block_done) {
  if (static_cast<int>(saved.blocks.size()) != size())
    throw tensor_error("stage::backward: activations of " + std::to_string(saved.blocks.size()) +
                       " blocks for a stage of " + std::to_string(size()));
  // Inference weights (no parameters) train nothing of their own: an
  // adapter beside them (set_trained_weights with none named) can.
  const bool forms = forms_parameter_grads();
  if (forms) require_parameters("backward (with weights trained: set_trained_weights names none to train beside them)");
  if (size() == 0) {
    be_->copy(dy, dx);
    return;
  }
  // With nothing trained (LoRA) no gradient buffer is made: every view is
  // undefined and block_backward forms input gradients only.
  if (forms) grads();
  block_tensors none;
  const int batch = saved.blocks[0].batch, seq = saved.blocks[0].seq;
  const std::int64_t N = static_cast<std::int64_t>(batch) * seq;
  const Tensor& pos = train_positions(batch, seq);
  // Gradients flow in the activations' dtype, converted at the ends as in forward.
  const dtype act = saved.blocks[0].x.type();
  if (act != compute_dtype_)
    throw tensor_error(std::string("stage::backward: activations of a ") + dtype_name(act) +
                       " forward, but the stage now computes in " + dtype_name(compute_dtype_));
  ensure_tensor(*be_, ping_, {N, cfg_.hidden_size}, act);
  ensure_tensor(*be_, pong_, {N, cfg_.hidden_size}, act);
  const Tensor* g_out = &in_compute_dtype(dy, boundary_in_);
  Tensor* first_in = dx.type() == act ? &dx : &ensure_tensor(*be_, boundary_out_, dx.shape(), act);
  for (int i = size() - 1; i >= 0; --i) {
    const auto b = static_cast<std::size_t>(i);
    Tensor* g_in = (i == 0) ? first_in : (i % 2 == 0 ? &ping_ : &pong_);
    block_backward(*be_, cfg_, train_weights(i), saved.blocks[b], pos, *g_out, *g_in, forms ? grad_views_[b] : none,
                   grad_scratch_, frozen_grads_, first_ + i, train_lora(i));
    g_out = g_in;
    if (on_block_done) on_block_done(i);
  }
  if (first_in != &dx) be_->copy(*first_in, dx);
}

void stage::reserve_rows(std::int64_t rows) {
  decode_ws_.reserve(*be_, rows);
  decode_positions_.reserve(cpu_backend(), rows);  // host, as train_positions
}

void stage::forward_cached(const Tensor& x, kv_sequence& kv, std::int64_t start_pos, Tensor& y, int from,
                           int to, const span_lora* lora) {
  const std::int64_t T = x.dim(0);
  expect_rows(x, T, cfg_.hidden_size, "stage::forward_cached x");
  expect_rows(y, T, cfg_.hidden_size, "stage::forward_cached y");
  if (kv.n_layers() != size())
    throw tensor_error("stage::forward_cached: a KV cache of " + std::to_string(kv.n_layers()) +
                       " layers for a stage of " + std::to_string(size()) + " blocks");
  if (start_pos + T > kv.capacity())
    throw tensor_error("stage::forward_cached: positions up to " + std::to_string(start_pos + T) +
                       " exceed the KV capacity of " + std::to_string(kv.capacity()) +
                       " (reserve first)");
  if (to < 0) to = size();
  if (from < 0 || from > to || to > size())
    throw tensor_error("stage::forward_cached: blocks [" + std::to_string(from) + ", " + std::to_string(to) +
                       ") are not a range of this stage's " + std::to_string(size()));
  if (lora && lora->blocks.size() != static_cast<std::size_t>(size()))
    throw tensor_error("stage::forward_cached: an adapter of " + std::to_string(lora->blocks.size()) +
                       " blocks for a stage of " + std::to_string(size()));
  if (from == to) {
    if (&x != &y) be_->copy(x, y);
    return;
  }
  Tensor& pos = decode_positions_.rows(cpu_backend(), T);  // host, as train_positions
  fill_positions(pos, start_pos);
  const Tensor* in = &x;
  for (int i = from; i < to; ++i) {
    block_forward_cached(*be_, cfg_, cached_weights(i), *in, pos, kv, i, start_pos, decode_ws_, y,
                         lora ? &lora->blocks[static_cast<std::size_t>(i)] : nullptr);
    in = &y;
  }
}

}  // namespace corolla

namespace corolla {

void stage::forward_cached_batch(const Tensor& x, std::span<const cached_rows> seqs, Tensor& y) {
  const std::int64_t R = x.dim(0);
  expect_rows(x, R, cfg_.hidden_size, "stage::forward_cached_batch x");
  expect_rows(y, R, cfg_.hidden_size, "stage::forward_cached_batch y");
  std::int64_t rows = 0;
  for (const cached_rows& s : seqs) {
    if (s.kv == nullptr || s.rows < 0 || s.start_pos < 0)
      throw tensor_error("stage::forward_cached_batch: a sequence without a cache or with "
                         "negative rows or position");
    if (s.kv->n_layers() != size())
      throw tensor_error("stage::forward_cached_batch: a KV cache of " +
                         std::to_string(s.kv->n_layers()) + " layers for a stage of " +
                         std::to_string(size()) + " blocks");
    if (s.lora && s.lora->blocks.size() != static_cast<std::size_t>(size()))
      throw tensor_error("stage::forward_cached_batch: an adapter of " + std::to_string(s.lora->blocks.size()) +
                         " blocks for a stage of " + std::to_string(size()));
    if (s.start_pos + s.rows > s.kv->capacity())
      throw tensor_error("stage::forward_cached_batch: positions up to " +
                         std::to_string(s.start_pos + s.rows) + " exceed the KV capacity of " +
                         std::to_string(s.kv->capacity()) + " (reserve first)");
    rows += s.rows;
  }
  if (rows != R)
    throw tensor_error("stage::forward_cached_batch: the sequences cover " +
                       std::to_string(rows) + " rows of a batch of " + std::to_string(R));
  if (size() == 0) {
    if (&x != &y) be_->copy(x, y);
    return;
  }
  // Each row's own position (RoPE), on the host as train_positions.
  Tensor& pos = decode_positions_.rows(cpu_backend(), R);
  auto* p = pos.data<std::int32_t>();
  for (const cached_rows& s : seqs)
    for (std::int64_t i = 0; i < s.rows; ++i) *p++ = static_cast<std::int32_t>(s.start_pos + i);

  const Tensor* in = &x;
  for (int i = 0; i < size(); ++i) {
    block_forward_cached_batch(*be_, cfg_, cached_weights(i), *in, pos, seqs,
                               i, decode_ws_, y);
    in = &y;
  }
}

}  // namespace corolla
