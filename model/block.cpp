#include "model/block.hpp"

#include <initializer_list>
#include <tuple>
#include <utility>

#include "model/block_ops.hpp"

namespace corolla {
using namespace block_ops;

std::vector<std::pair<std::string, shape_t>> block_layout(const model_config& cfg) {
  const std::int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  const std::int64_t Q = q_width(cfg), KV = kv_width(cfg);
  if (is_llama(cfg)) {
    std::vector<std::pair<std::string, shape_t>> l = {{"attn_norm.weight", {D}}, {"q.weight", {Q, D}},
                                                      {"k.weight", {KV, D}},     {"v.weight", {KV, D}},
                                                      {"o.weight", {D, Q}},      {"mlp_norm.weight", {D}}};
    if (!cfg.is_moe()) l.insert(l.end(), {{"gate.weight", {F, D}}, {"up.weight", {F, D}}, {"down.weight", {D, F}}});
    if (cfg.qkv_bias) l.insert(l.end(), {{"q.bias", {Q}}, {"k.bias", {KV}}, {"v.bias", {KV}}});
    if (cfg.o_bias) l.push_back({"o.bias", {D}});
    if (cfg.qk_norm) l.insert(l.end(), {{"q_norm.weight", {cfg.head_dim}}, {"k_norm.weight", {cfg.head_dim}}});
    if (cfg.is_moe()) {
      // The router and E experts in place of the dense MLP.
      l.push_back({"router.weight", {cfg.n_experts, D}});
      for (int e = 0; e < cfg.n_experts; ++e) {
        const std::string p = "experts." + std::to_string(e) + ".";
        l.insert(l.end(), {{p + "gate.weight", {F, D}}, {p + "up.weight", {F, D}}, {p + "down.weight", {D, F}}});
      }
      if (cfg.has_shared_expert()) {
        const std::int64_t S = cfg.shared_expert_size;
        l.insert(l.end(), {{"shared.gate.weight", {S, D}},
                           {"shared.up.weight", {S, D}},
                           {"shared.down.weight", {D, S}},
                           {"shared_gate.weight", {1, D}}});
      }
    }
    return l;
  }
  return {{"attn_norm.weight", {D}}, {"attn_norm.bias", {D}}, {"q.weight", {Q, D}},
          {"q.bias", {Q}},           {"k.weight", {KV, D}},   {"k.bias", {KV}},
          {"v.weight", {KV, D}},     {"v.bias", {KV}},        {"o.weight", {D, Q}},
          {"o.bias", {D}},           {"mlp_norm.weight", {D}}, {"mlp_norm.bias", {D}},
          {"up.weight", {F, D}},     {"up.bias", {F}},        {"down.weight", {D, F}},
          {"down.bias", {D}}};
}

bool stored_in_weight_format(const std::string& name, const shape_t& shape) {
  return shape.size() == 2 && name != "router.weight" && name != "shared_gate.weight";
}

attention_shape block_attention_shape(const model_config& cfg) {
  return attention_shape{cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, 0.0f};
}

namespace {

/// Copies `parts` (on be's device) into one tensor of `type` stacked along
/// dim 0 (converting) and points each part at its slice of the stack.
Tensor stack_rows(Backend& be, const std::vector<Tensor*>& parts, dtype type) {
  std::int64_t rows = 0;
  for (Tensor* p : parts) rows += p->dim(0);
  shape_t shape = parts.front()->shape();
  shape[0] = rows;
  Tensor all = be.empty(shape, type);
  std::int64_t at = 0;
  for (Tensor* p : parts) {
    Tensor dst = all.slice(at, at + p->dim(0));
    be.copy(*p, dst);
    *p = dst;
    at += dst.dim(0);
  }
  return all;
}

/// Quantises the f32 weights `parts` (weight, scale) as one stacked tensor
/// of format `f` (rows quantise independently, so the stack equals its parts
/// quantised apart), and points each weight and its scale at their slices.
/// Returns the stack and its scales.
std::pair<Tensor, Tensor> quantize_stack(Backend& be, weight_format f,
                                         std::initializer_list<std::pair<Tensor*, Tensor*>> parts) {
  std::vector<Tensor*> weights;
  for (const auto& [w, s] : parts) weights.push_back(w);
  const quantized_weight stack = quantize_rows(be, stack_rows(be, weights, dtype::f32), f);
  std::int64_t at = 0;
  for (const auto& [w, s] : parts) {
    const std::int64_t n = w->dim(0);
    *w = stack.q.slice(at, at + n);
    *s = stack.scale.slice(at, at + n);
    at += n;
  }
  return {stack.q, stack.scale};
}

}  // namespace

std::int64_t served_block_bytes(const model_config& cfg, weight_format f, bool with_parameters) {
  if (f == weight_format::f32) with_parameters = true;  // the parameters are the inference weights
  std::int64_t bytes = 0;
  for (const auto& [name, shape] : block_layout(cfg)) {
    std::int64_t numel = 1;
    for (std::int64_t d : shape) numel *= d;
    const bool linear = stored_in_weight_format(name, shape);
    if (with_parameters || !linear) bytes += 4 * numel;  // the f32 parameter (norms, biases, router: always)
    if (f == weight_format::f32) continue;
    if (linear) bytes += stored_weight_bytes(shape[0], shape[1], f);
    else if (name == "q.bias" || name == "k.bias" || name == "v.bias")
      bytes += 4 * numel;  // stacked into qkv_b
  }
  return bytes;
}

block_tensors inference_weights(Backend& be, const block_tensors& w, weight_format f) {
  block_tensors out = w;
  if (f == weight_format::f32) return out;
  out.format = f;
  for (expert_tensors& e : out.experts) e.format = f;
  // Biases stay f32, stacked alike (GPT-2, Qwen2).
  if (out.q_b.defined()) out.qkv_b = stack_rows(be, {&out.q_b, &out.k_b, &out.v_b}, dtype::f32);
  const bool moe = !out.experts.empty();
  if (is_quantized(f)) {
    std::tie(out.qkv_w, out.qkv_s) =
        quantize_stack(be, f, {{&out.q_w, &out.q_s}, {&out.k_w, &out.k_s}, {&out.v_w, &out.v_s}});
    if (out.gate_w.defined())
      std::tie(out.gate_up_w, out.gate_up_s) = quantize_stack(be, f, {{&out.gate_w, &out.gate_s}, {&out.up_w, &out.up_s}});
    else if (!moe)
      quantize_stack(be, f, {{&out.up_w, &out.up_s}});
    quantize_stack(be, f, {{&out.o_w, &out.o_s}});
    if (!moe) quantize_stack(be, f, {{&out.down_w, &out.down_s}});
    // Each expert's gate and up as one stack, its down apart; the router stays f32.
    for (expert_tensors& e : out.experts) {
      quantize_stack(be, f, {{&e.gate_w, &e.gate_s}, {&e.up_w, &e.up_s}});
      quantize_stack(be, f, {{&e.down_w, &e.down_s}});
    }
    return out;
  }
  const dtype t = dtype::bf16;
  out.qkv_w = stack_rows(be, {&out.q_w, &out.k_w, &out.v_w}, t);
  if (out.gate_w.defined()) out.gate_up_w = stack_rows(be, {&out.gate_w, &out.up_w}, t);
  std::vector<Tensor*> singles = {&out.o_w};
  if (!moe) singles.push_back(&out.down_w);
  if (!moe && !out.gate_w.defined()) singles.push_back(&out.up_w);
  for (expert_tensors& e : out.experts) {
    stack_rows(be, {&e.gate_w, &e.up_w}, t);
    singles.push_back(&e.down_w);
  }
  for (Tensor* m : singles) {
    Tensor converted = be.empty(m->shape(), t);
    be.copy(*m, converted);
    *m = std::move(converted);
  }
  return out;
}

namespace {

/// Every tensor role of a block, for the passes that treat them alike.
constexpr Tensor block_tensors::*all_roles[] = {
    &block_tensors::attn_norm_w, &block_tensors::attn_norm_b, &block_tensors::q_w,       &block_tensors::q_b,
    &block_tensors::k_w,         &block_tensors::k_b,         &block_tensors::v_w,       &block_tensors::v_b,
    &block_tensors::o_w,         &block_tensors::o_b,         &block_tensors::mlp_norm_w, &block_tensors::mlp_norm_b,
    &block_tensors::gate_w,      &block_tensors::up_w,        &block_tensors::up_b,      &block_tensors::down_w,
    &block_tensors::down_b,      &block_tensors::q_norm_w,    &block_tensors::k_norm_w,  &block_tensors::router_w,
    &block_tensors::shared_gate_w,
    &block_tensors::qkv_w,       &block_tensors::qkv_b,       &block_tensors::gate_up_w, &block_tensors::q_s,
    &block_tensors::k_s,         &block_tensors::v_s,         &block_tensors::o_s,       &block_tensors::gate_s,
    &block_tensors::up_s,        &block_tensors::down_s,      &block_tensors::qkv_s,     &block_tensors::gate_up_s};
constexpr Tensor expert_tensors::*expert_roles[] = {&expert_tensors::gate_w, &expert_tensors::up_w,
                                                    &expert_tensors::down_w, &expert_tensors::gate_s,
                                                    &expert_tensors::up_s,   &expert_tensors::down_s};

/// Calls f on every defined tensor of `w`, the experts' included.
template <class F>
void for_each_tensor(block_tensors& w, F&& f) {
  for (Tensor block_tensors::*role : all_roles)
    if ((w.*role).defined()) f(w.*role);
  for (expert_tensors& e : w.experts)
    for (Tensor expert_tensors::*role : expert_roles)
      if ((e.*role).defined()) f(e.*role);
}

}  // namespace

block_tensors own_shared_views(Backend& be, block_tensors w, const param_set& p) {
  const Tensor& flat = p.flat();
  const auto* lo = static_cast<const unsigned char*>(flat.raw());
  const auto* hi = lo + flat.nbytes();
  for_each_tensor(w, [&](Tensor& t) {
    const auto* at = static_cast<const unsigned char*>(t.raw());
    if (at < lo || at >= hi) return;
    Tensor own = be.empty(t.shape(), t.type());
    be.copy(t, own);
    t = std::move(own);
  });
  return w;
}

namespace {

/// to.*role = the f32 widening of from.*role (a weight of format `f` with
/// its scale from.*scale), into `own`'s tensor when its shape fits (reused);
/// the scale is dropped. Nothing when from has no such weight.
template <class T>
void widen_role(Backend& be, weight_format f, const T& from, const T& own, T& to, Tensor T::*role, Tensor T::*scale,
                const shape_t& shape) {
  if (!(from.*role).defined()) return;
  to.*role = own.*role;
  dequantize_rows(be, f, from.*role, from.*scale, ensure_tensor(be, to.*role, shape));
  to.*scale = Tensor{};
}

}  // namespace

void widen_block_weights(Backend& be, const model_config& cfg, const block_tensors& w, block_tensors& out,
                         bool experts) {
  const std::int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  const std::int64_t Q = q_width(cfg), KV = kv_width(cfg);
  // Keep out's own linear tensors (reused), take everything else from w.
  block_tensors widened = w;
  widened.format = weight_format::f32;
  widened.qkv_w = widened.qkv_s = widened.gate_up_w = widened.gate_up_s = Tensor{};
  widened.expert_scratch = out.expert_scratch;
  using B = block_tensors;
  const weight_format f = w.format;
  widen_role(be, f, w, out, widened, &B::q_w, &B::q_s, {Q, D});
  widen_role(be, f, w, out, widened, &B::k_w, &B::k_s, {KV, D});
  widen_role(be, f, w, out, widened, &B::v_w, &B::v_s, {KV, D});
  widen_role(be, f, w, out, widened, &B::o_w, &B::o_s, {D, Q});
  widen_role(be, f, w, out, widened, &B::gate_w, &B::gate_s, {F, D});
  widen_role(be, f, w, out, widened, &B::up_w, &B::up_s, {F, D});
  widen_role(be, f, w, out, widened, &B::down_w, &B::down_s, {D, F});
  if (experts)
    for (std::size_t e = 0; e < w.experts.size(); ++e) {
      widened.experts[e] = e < out.experts.size() ? out.experts[e] : expert_tensors{};
      widen_expert_weights(be, cfg, static_cast<int>(e), w.experts[e], widened.experts[e]);
    }
  out = std::move(widened);
}

void widen_expert_weights(Backend& be, const model_config& cfg, int e, const expert_tensors& from,
                          expert_tensors& out) {
  const std::int64_t D = cfg.hidden_size, W = expert_width(cfg, e);  // the shared expert's width differs
  using E = expert_tensors;
  expert_tensors widened;
  const weight_format f = from.format;
  widen_role(be, f, from, out, widened, &E::gate_w, &E::gate_s, {W, D});
  widen_role(be, f, from, out, widened, &E::up_w, &E::up_s, {W, D});
  widen_role(be, f, from, out, widened, &E::down_w, &E::down_s, {D, W});
  out = std::move(widened);
}

block_tensors block_tensors::of(const model_config& cfg, const param_set& p) {
  block_tensors t;
  t.attn_norm_w = p.get("attn_norm.weight");
  t.q_w = p.get("q.weight");
  t.k_w = p.get("k.weight");
  t.v_w = p.get("v.weight");
  t.o_w = p.get("o.weight");
  t.mlp_norm_w = p.get("mlp_norm.weight");
  if (cfg.is_moe()) {
    t.router_w = p.get("router.weight");
    auto expert = [&](const std::string& x) {
      expert_tensors ex;
      ex.gate_w = p.get(x + "gate.weight");
      ex.up_w = p.get(x + "up.weight");
      ex.down_w = p.get(x + "down.weight");
      t.experts.push_back(std::move(ex));
    };
    for (int e = 0; e < cfg.n_experts; ++e) expert("experts." + std::to_string(e) + ".");
    if (cfg.has_shared_expert()) {
      expert("shared.");
      t.shared_gate_w = p.get("shared_gate.weight");
    }
  } else {
    t.up_w = p.get("up.weight");
    t.down_w = p.get("down.weight");
  }
  if (is_llama(cfg)) {
    if (!cfg.is_moe()) t.gate_w = p.get("gate.weight");
    if (cfg.qkv_bias) {
      t.q_b = p.get("q.bias");
      t.k_b = p.get("k.bias");
      t.v_b = p.get("v.bias");
    }
    if (cfg.o_bias) t.o_b = p.get("o.bias");
    if (cfg.qk_norm) {
      t.q_norm_w = p.get("q_norm.weight");
      t.k_norm_w = p.get("k_norm.weight");
    }
  } else {
    t.attn_norm_b = p.get("attn_norm.bias");
    t.q_b = p.get("q.bias");
    t.k_b = p.get("k.bias");
    t.v_b = p.get("v.bias");
    t.o_b = p.get("o.bias");
    t.mlp_norm_b = p.get("mlp_norm.bias");
    t.up_b = p.get("up.bias");
    t.down_b = p.get("down.bias");
  }
  return t;
}

// ---- training forward ------------------------------------------------------------

void block_forward(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x,
                   const Tensor& positions, int batch, int seq, Tensor& y,
                   block_activations& a, const block_lora* lora) {
  const std::int64_t N = static_cast<std::int64_t>(batch) * seq;
  const std::int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  const std::int64_t Q = q_width(cfg), KV = kv_width(cfg);
  expect_shape(x, {N, D}, "block_forward x");
  expect_shape(y, {N, D}, "block_forward y");
  const bool llama = is_llama(cfg);

  // Activations take x's dtype (a 16-bit compute dtype, see
  // stage::set_compute_dtype); norm statistics and lse stay f32.
  const dtype act = x.type();
  expect_dtype(y, act, "block_forward y");
  if (lora)
    for (const auto role : lora_roles)
      if ((lora->*role).defined() && (lora->*role).a.type() != act)
        throw tensor_error(std::string("block_forward: a LoRA adapter's factors are ") +
                           dtype_name((lora->*role).a.type()) + ", the activations " + dtype_name(act));
  // An adapted linear's product runs unfused, its term added before the
  // epilogue's op.
  const auto adapted = [&](lora_factors block_lora::*role) { return lora && (lora->*role).defined(); };
  const auto term = [&](lora_factors block_lora::*role, const Tensor& in, Tensor& out) {
    add_lora_term(be, lora_of(lora, role), in, out, a.lora_t);
  };
  a.batch = batch;
  a.seq = seq;
  a.x = x;
  ensure_tensor(be, a.norm1, {N, D}, act);
  ensure_tensor(be, a.rstd1, {N});
  if (!llama) ensure_tensor(be, a.mean1, {N});
  if (cfg.qk_norm) {  // the projections' outputs are q_pre, k_pre and v
    ensure_tensor(be, a.q, {N, Q}, act);
    ensure_tensor(be, a.k, {N, KV}, act);
    qkv_stack(be, a.qkv, a.q_pre, a.k_pre, a.v, N, Q, KV, act);
    ensure_tensor(be, a.rstd_q, {N * cfg.n_heads});
    ensure_tensor(be, a.rstd_k, {N * cfg.n_kv_heads});
  } else {
    qkv_stack(be, a.qkv, a.q, a.k, a.v, N, Q, KV, act);
  }
  ensure_tensor(be, a.attn, {N, Q}, act);
  ensure_tensor(be, a.lse, {N * cfg.n_heads});
  ensure_tensor(be, a.h, {N, D}, act);
  ensure_tensor(be, a.norm2, {N, D}, act);
  ensure_tensor(be, a.rstd2, {N});
  if (!llama) ensure_tensor(be, a.mean2, {N});
  const bool moe = cfg.is_moe();
  if (!moe) {
    // Llama's gate and up: slices of one stack, so their products (of one
    // x, weights adjacent in the parameters) may run as one batch.
    if (llama) row_stack(be, a.gate_up, {&a.gate, &a.up}, N, F, act);
    else ensure_tensor(be, a.up, {N, F}, act);
    ensure_tensor(be, a.act, {N, F}, act);
  }

  // Attention half. y doubles as the scratch for the projection outputs.
  norm_forward(be, cfg, x, w.attn_norm_w, w.attn_norm_b, a.norm1, opt(a.mean1), &a.rstd1);
  {
    const Tensor* ws[] = {&w.q_w, &w.k_w, &w.v_w};
    const Tensor* bs[] = {opt(w.q_b), opt(w.k_b), opt(w.v_b)};
    Tensor* ys[] = {cfg.qk_norm ? &a.q_pre : &a.q, cfg.qk_norm ? &a.k_pre : &a.k, &a.v};
    be.linear_same_x(a.norm1, ws, bs, ys);
    term(&block_lora::q, a.norm1, *ys[0]);
    term(&block_lora::k, a.norm1, *ys[1]);
    term(&block_lora::v, a.norm1, *ys[2]);
  }
  if (cfg.qk_norm) {
    head_rmsnorm(be, cfg, a.q_pre, w.q_norm_w, a.q, &a.rstd_q);
    head_rmsnorm(be, cfg, a.k_pre, w.k_norm_w, a.k, &a.rstd_k);
  }
  if (llama) {
    be.rope(a.q, positions, cfg.n_heads, cfg.head_dim, cfg.rope);
    be.rope(a.k, positions, cfg.n_kv_heads, cfg.head_dim, cfg.rope);
  }
  be.attention(a.q, a.k, a.v, batch, seq, block_attention_shape(cfg), a.attn, &a.lse);
  // The residual adds and GPT-2's GELU go into the products' epilogues
  // where the backend has them (CUDA: cuBLASLt's); else two ops each.
  if (adapted(&block_lora::o) || !be.linear_fused(a.attn, w.o_w, opt(w.o_b), linear_epilogue::add, &x, a.h)) {
    be.linear(a.attn, w.o_w, opt(w.o_b), y);
    term(&block_lora::o, a.attn, y);
    be.add(x, y, a.h);
  }

  // MLP half.
  norm_forward(be, cfg, a.h, w.mlp_norm_w, w.mlp_norm_b, a.norm2, opt(a.mean2), &a.rstd2);
  if (moe) {
    moe_forward(be, cfg, w, a.norm2, y, a.moe);
  } else if (llama) {
    const Tensor* ws[] = {&w.gate_w, &w.up_w};
    Tensor* ys[] = {&a.gate, &a.up};
    be.linear_same_x(a.norm2, ws, {}, ys);
    term(&block_lora::gate, a.norm2, a.gate);
    term(&block_lora::up, a.norm2, a.up);
    be.swiglu(a.gate, a.up, a.act);
  } else if (adapted(&block_lora::up) || !be.linear_gelu(a.norm2, w.up_w, opt(w.up_b), a.up, a.act)) {
    be.linear(a.norm2, w.up_w, opt(w.up_b), a.up);
    term(&block_lora::up, a.norm2, a.up);
    be.gelu(a.up, a.act);
  }
  if (moe) {
    be.add(a.h, y, y);
  } else if (adapted(&block_lora::down) ||
             !be.linear_fused(a.act, w.down_w, opt(w.down_b), linear_epilogue::add, &a.h, y)) {
    be.linear(a.act, w.down_w, opt(w.down_b), y);
    term(&block_lora::down, a.act, y);
    be.add(a.h, y, y);
  }
}

}  // namespace corolla
