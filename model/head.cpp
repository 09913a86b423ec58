#include "model/head.hpp"

#include <algorithm>

#include "model/hf_names.hpp"

namespace corolla {
namespace {

bool is_llama(const model_config& cfg) { return cfg.arch == architecture::llama; }

}  // namespace

std::vector<std::pair<std::string, shape_t>> head_layout(const model_config& cfg) {
  const std::int64_t V = cfg.vocab_size, D = cfg.hidden_size;
  std::vector<std::pair<std::string, shape_t>> layout{{"embed.weight", {V, D}}};
  if (!is_llama(cfg)) layout.push_back({"pos_embed.weight", {cfg.max_positions, D}});
  layout.push_back({"final_norm.weight", {D}});
  if (!is_llama(cfg)) layout.push_back({"final_norm.bias", {D}});
  if (!cfg.tie_embeddings) layout.push_back({"lm_head.weight", {V, D}});
  return layout;
}

head::head(const model_config& cfg, Backend& be) : head(cfg, param_set(head_layout(cfg)), be) {}

head::head(const model_config& cfg, param_set params, Backend& be)
    : cfg_(cfg),
      be_(&be),
      params_(std::move(params)),
      pos_rows_(cfg.hidden_size),
      norm_rows_(cfg.hidden_size),
      mean_rows_(0),
      rstd_rows_(0) {
  resolve_views();
}

head head::load(const checkpoint& ck, const model_config& cfg, Backend& be) {
  head h(cfg, be);
  load_head_params(ck, cfg, h.params_);
  place_params(h.params_, be);  // a device backend computes on device parameters
  h.resolve_views();
  return h;
}

void head::resolve_views() {
  embed_w_ = params_.get("embed.weight");
  norm_w_ = params_.get("final_norm.weight");
  lm_head_w_ = cfg_.tie_embeddings ? embed_w_ : params_.get("lm_head.weight");
  if (!is_llama(cfg_)) {
    pos_w_ = params_.get("pos_embed.weight");
    norm_b_ = params_.get("final_norm.bias");
  }
}

param_set& head::grads() {
  if (!has_grads()) {
    grads_ = params_.like();
    g_embed_ = grads_.get("embed.weight");
    g_norm_w_ = grads_.get("final_norm.weight");
    g_lm_head_ = cfg_.tie_embeddings ? g_embed_ : grads_.get("lm_head.weight");
    if (!is_llama(cfg_)) {
      g_pos_ = grads_.get("pos_embed.weight");
      g_norm_b_ = grads_.get("final_norm.bias");
    }
  }
  return grads_;
}

void head::zero_grads() {
  if (has_grads()) grads_.flat().zero();
}

void head::embed(const Tensor& ids, const Tensor& positions, Tensor& x) {
  be_->embedding(ids, embed_w_, x);
  if (!is_llama(cfg_)) {
    Tensor& pos = pos_rows_.rows(*be_, x.dim(0));
    be_->embedding(positions, pos_w_, pos);
    be_->add(x, pos, x);
  }
}

void head::embed_backward(const Tensor& ids, const Tensor& positions, const Tensor& dx) {
  grads();
  be_->embedding_backward(ids, dx, g_embed_);
  if (!is_llama(cfg_)) be_->embedding_backward(positions, dx, g_pos_);
}

Tensor& head::final_norm(const Tensor& x, head_activations* saved) {
  const std::int64_t N = x.dim(0), D = cfg_.hidden_size;
  Tensor* norm;
  Tensor* mean = nullptr;
  Tensor* rstd;
  if (saved) {
    saved->x = x;
    norm = &ensure_tensor(*be_, saved->norm, {N, D});
    rstd = &ensure_tensor(*be_, saved->rstd, {N});
    if (!is_llama(cfg_)) mean = &ensure_tensor(*be_, saved->mean, {N});
  } else {
    norm = &norm_rows_.rows(*be_, N);
    rstd = &rstd_rows_.rows(*be_, N);
    mean = &mean_rows_.rows(*be_, N);
  }
  if (is_llama(cfg_))
    be_->rmsnorm(x, norm_w_, cfg_.norm_eps, *norm, rstd);
  else
    be_->layernorm(x, norm_w_, norm_b_, cfg_.norm_eps, *norm, mean, rstd);
  return *norm;
}

void head::logits(const Tensor& x, Tensor& logits, head_activations* saved) {
  const std::int64_t N = x.dim(0), D = cfg_.hidden_size;
  expect_rows(x, N, D, "head::logits x");
  expect_rows(logits, N, cfg_.vocab_size, "head::logits logits");
  const Tensor& norm = final_norm(x, saved);
  const bool inference = !saved && lm_head_inference_.defined();
  if (inference)
    linear_as(*be_, lm_head_format(), norm, lm_head_inference_, lm_head_scale_, nullptr, logits);
  else
    be_->linear(norm, lm_head_w_, nullptr, logits);
}

void head::use_inference_weights(weight_format f) {
  lm_head_inference_ = Tensor();
  lm_head_scale_ = Tensor();
  inference_format_ = f;
  if (f == weight_format::f32) return;
  if (is_quantized(f)) {  // int8 per output channel (a vocabulary row), also for nf4 blocks
    quantized_weight q = quantize_rows(*be_, lm_head_w_, weight_format::int8);
    lm_head_inference_ = std::move(q.q);
    lm_head_scale_ = std::move(q.scale);
    return;
  }
  lm_head_inference_ = be_->empty(lm_head_w_.shape(), dtype::bf16);
  be_->copy(lm_head_w_, lm_head_inference_);
}

void head::share_inference_weights(const head& other) {
  if (&other == this) return;
  if (other.be_ != be_ || other.lm_head_w_.shape() != lm_head_w_.shape())
    throw tensor_error("head::share_inference_weights: the other head has another shape or backend");
  lm_head_inference_ = other.lm_head_inference_;
  lm_head_scale_ = other.lm_head_scale_;
  inference_format_ = other.inference_format_;
}

void head::lm_head_backward(const Tensor& norm, const Tensor& dlogits, Tensor& dnorm, bool param_grads) {
  if (param_grads)
    be_->linear_backward(norm, lm_head_w_, dlogits, &dnorm, g_lm_head_, nullptr);
  else
    be_->gemm(dlogits, false, lm_head_w_, false, dnorm);  // dnorm = dlogits [N,V] @ W [V,D]; no weight gradient
}

void head::norm_backward(const head_activations& saved, const Tensor& dnorm, Tensor& dx, bool param_grads) {
  Tensor* g_norm_w = &g_norm_w_;
  Tensor* g_norm_b = &g_norm_b_;
  if (!param_grads) {
    ensure_tensor(*be_, discard_norm_w_, norm_w_.shape()).zero();  // accumulated into, never read
    g_norm_w = &discard_norm_w_;
    g_norm_b = nullptr;
    if (norm_b_.defined()) {
      ensure_tensor(*be_, discard_norm_b_, norm_b_.shape()).zero();
      g_norm_b = &discard_norm_b_;
    }
  }
  if (is_llama(cfg_))
    be_->rmsnorm_backward(saved.x, norm_w_, saved.rstd, dnorm, dx, *g_norm_w);
  else
    be_->layernorm_backward(saved.x, norm_w_, saved.mean, saved.rstd, dnorm, dx, *g_norm_w, *g_norm_b);
}

void head::logits_backward(const head_activations& saved, const Tensor& dlogits, Tensor& dx,
                           bool param_grads) {
  const std::int64_t N = saved.x.dim(0);
  expect_shape(dx, {N, cfg_.hidden_size}, "head::logits_backward dx");
  if (param_grads) grads();
  Tensor& dnorm = norm_rows_.rows(*be_, N);  // free here: only the no-save path uses it
  lm_head_backward(saved.norm, dlogits, dnorm, param_grads);
  norm_backward(saved, dnorm, dx, param_grads);
}

void head::set_loss_chunk_rows(std::int64_t rows) {
  if (rows < 0) throw tensor_error("head: loss chunk rows must be >= 0 (0 = by the memory budget)");
  loss_chunk_rows_ = rows;
}

std::int64_t head::loss_chunk_rows(std::int64_t rows) const {
  std::int64_t chunk = loss_chunk_rows_;
  if (chunk == 0) chunk = std::max<std::int64_t>(1, loss_logits_budget / (std::int64_t{cfg_.vocab_size} * 4));
  return std::min(chunk, rows);
}

float head::loss(const Tensor& x, const Tensor& targets, Tensor* dx, float grad_scale,
                 head_activations& saved, bool param_grads) {
  const std::int64_t N = x.dim(0), D = cfg_.hidden_size, V = cfg_.vocab_size;
  expect_rows(x, N, D, "head::loss x");
  expect_shape(targets, {N}, "head::loss targets");
  if (dx) expect_shape(*dx, {N, D}, "head::loss dx");
  // Every chunk's cross_entropy checks its own targets; checked here first
  // (host targets, the usual), a bad one fails before any chunk has added
  // into the gradients, and names its row in the batch.
  if (targets.dev().kind == device_kind::cpu && targets.type() == dtype::i32) {
    const std::int32_t* t = targets.data<std::int32_t>();
    for (std::int64_t r = 0; r < N; ++r)
      if (t[r] != -1 && (t[r] < 0 || t[r] >= V))
        throw tensor_error("head::loss: target " + std::to_string(t[r]) + " at row " + std::to_string(r) +
                           " is outside the vocabulary [0, " + std::to_string(V) + ") and is not -1 (ignored)");
  }
  ensure_tensor(*be_, saved.losses, {N});
  const Tensor& norm = final_norm(x, &saved);
  // Logits of one chunk of rows at a time: [chunk, V] instead of [N, V].
  // Each chunk's dlogits are formed in place and folded into dnorm (and the
  // LM-head gradient) before the next chunk overwrites them.
  const std::int64_t chunk = loss_chunk_rows(N);
  Tensor& logits = ensure_tensor(*be_, saved.logits, {chunk, V});
  Tensor* dnorm = nullptr;
  if (dx) {
    if (param_grads) grads();
    dnorm = &norm_rows_.rows(*be_, N);  // free here: only the no-save path uses it
  }
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t r1 = std::min(N, r0 + chunk);
    Tensor lg = r1 - r0 == chunk ? logits : logits.slice(0, r1 - r0);
    const Tensor norm_c = chunk == N ? norm : norm.slice(r0, r1);
    be_->linear(norm_c, lm_head_w_, nullptr, lg);
    // d(mean * grad_scale)/dlogits = (softmax - onehot) * grad_scale / N.
    Tensor losses_c = chunk == N ? saved.losses : saved.losses.slice(r0, r1);
    be_->cross_entropy(lg, chunk == N ? targets : targets.slice(r0, r1), losses_c, dx ? &lg : nullptr,
                       grad_scale / static_cast<float>(N));
    if (dx) {
      Tensor dnorm_c = chunk == N ? *dnorm : dnorm->slice(r0, r1);
      lm_head_backward(norm_c, lg, dnorm_c, param_grads);
    }
  }
  const Tensor* host = &saved.losses;
  if (saved.losses.dev().kind != device_kind::cpu) {
    ensure_tensor(cpu_backend(), host_losses_, {N});
    be_->copy(saved.losses, host_losses_);
    be_->synchronize();
    host = &host_losses_;
  }
  const float* l = host->data<float>();
  double sum = 0.0;
  for (std::int64_t i = 0; i < N; ++i) sum += l[i];
  if (dx) norm_backward(saved, *dnorm, *dx, param_grads);
  return static_cast<float>(sum / static_cast<double>(N));
}

}  // namespace corolla
