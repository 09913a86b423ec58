// model/block_backward.cpp — a block's backward (declared in
// model/block.hpp): block_backward, with parameter gradients accumulated and
// frozen weights' products skipped (stage::set_trained_weights), and
// block_backward_input, the input gradient alone for a server's frozen
// blocks (block_backward with nothing trained).
#include <span>
#include <utility>

#include "model/block.hpp"
#include "model/block_ops.hpp"

namespace corolla {
using namespace block_ops;
namespace {

/// Sizes block_backward's scratch for N rows of activation dtype `act`.
void grow_grad_scratch(Backend& be, const model_config& cfg, std::int64_t N, dtype act,
                       block_grad_scratch& s) {
  const std::int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  const std::int64_t Q = q_width(cfg), KV = kv_width(cfg);
  ensure_tensor(be, s.dnorm, {N, D}, act);
  ensure_tensor(be, s.dh, {N, D}, act);
  ensure_tensor(be, s.dattn, {N, Q}, act);
  if (cfg.qk_norm) {  // the projections' gradients are dq_pre, dk_pre and dv
    ensure_tensor(be, s.dq, {N, Q}, act);
    ensure_tensor(be, s.dk, {N, KV}, act);
    qkv_stack(be, s.dqkv, s.dq_pre, s.dk_pre, s.dv, N, Q, KV, act);
  } else {
    qkv_stack(be, s.dqkv, s.dq, s.dk, s.dv, N, Q, KV, act);
  }
  if (!cfg.is_moe()) {  // the experts' rows have their own scratch (moe_grad_scratch)
    ensure_tensor(be, s.dact, {N, F}, act);
    if (is_llama(cfg)) row_stack(be, s.dgate_up, {&s.dgate, &s.dup}, N, F, act);  // as gate and up (block_forward)
    else ensure_tensor(be, s.dup, {N, F}, act);
  }
}

/// The gradients of the q and k projections' outputs: with Qwen3's
/// per-head norms, those before the norms (into s.dq_pre, s.dk_pre, the
/// norm weights' gradients accumulated into dwq and dwk), else s.dq and
/// s.dk themselves.
std::pair<Tensor*, Tensor*> qk_projection_grads(Backend& be, const model_config& cfg, const block_tensors& w,
                                                const block_activations& a, block_grad_scratch& s, Tensor* dwq,
                                                Tensor* dwk) {
  if (!cfg.qk_norm) return {&s.dq, &s.dk};
  head_rmsnorm_backward(be, cfg, a.q_pre, w.q_norm_w, a.rstd_q, s.dq, s.dq_pre, *dwq);
  head_rmsnorm_backward(be, cfg, a.k_pre, w.k_norm_w, a.rstd_k, s.dk, s.dk_pre, *dwk);
  return {&s.dq_pre, &s.dk_pre};
}

/// Where a frozen weight's gradient goes: block_backward's `frozen` hook
/// and layer, nothing without a hook.
struct frozen_sink {
  frozen_weight_grads* hook;
  int layer;
  void add(Backend& be, const char* weight, const Tensor& x, const Tensor& dy) const {
    if (hook) hook->add(be, layer, weight, x, dy);
  }
};

/// linear_backward where the weight may be frozen (an undefined dw, as
/// stage::set_trained_weights leaves it): then dx = dy @ w, as
/// block_backward_input forms it, and the sink gets x and dy.
void linear_backward_or_frozen(Backend& be, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                               Tensor& dw, Tensor* db, const frozen_sink& sink, const char* name) {
  if (dw.defined()) {
    be.linear_backward(x, w, dy, dx, dw, db);
    return;
  }
  if (db) throw tensor_error("block_backward: a bias gradient wanted for a frozen weight");
  if (dx) be.gemm(dy, false, w, false, *dx);
  sink.add(be, name, x, dy);
}

/// linear_same_x_backward where some weights may be frozen (undefined dws):
/// dx from every product, the weight gradients of the others, the sink's
/// for the frozen ones.
void same_x_backward_or_frozen(Backend& be, const Tensor& x, std::span<const Tensor* const> ws,
                               std::span<const Tensor* const> dys, Tensor* dx, std::span<Tensor* const> dws,
                               std::span<Tensor* const> dbs, const frozen_sink& sink,
                               std::span<const char* const> names) {
  bool all = true;
  for (Tensor* d : dws) all = all && d->defined();
  if (all) {
    be.linear_same_x_backward(x, ws, dys, dx, dws, dbs);
    return;
  }
  for (std::size_t i = 0; i < ws.size(); ++i) {
    if (dx) be.gemm(*dys[i], false, *ws[i], false, *dx, 1.0f, i == 0 ? 0.0f : 1.0f);
    Tensor* db = dbs.empty() ? nullptr : dbs[i];
    if (dws[i]->defined()) {
      be.linear_backward(x, *ws[i], *dys[i], nullptr, *dws[i], db);
    } else {
      if (db) throw tensor_error("block_backward: a bias gradient wanted for a frozen weight");
      sink.add(be, names[i], x, *dys[i]);
    }
  }
}

/// Where a norm's weight (and bias) gradients go: its views dw and db, or
/// for a frozen norm (an undefined dw) the scratch sinks (`sink_b` null for
/// a norm without a bias), which the norm kernels accumulate into and
/// nobody reads: zeroed here each call, so they stay finite however many
/// calls add to them.
std::pair<Tensor*, Tensor*> norm_grads(Backend& be, Tensor& dw, Tensor& db, Tensor& sink_w, Tensor* sink_b,
                                       std::int64_t n) {
  if (dw.defined()) return {&dw, &db};
  if (db.defined()) throw tensor_error("block_backward: a norm's bias gradient wanted for its frozen weight");
  const auto zeroed = [&](Tensor& t) {
    if (!t.defined() || t.numel() != n) {
      t = be.empty({n});
      be.copy(Tensor::zeros({n}), t);  // scaling garbage by 0 could leave NaN
    }
    be.scale(t, 0.0f);
  };
  zeroed(sink_w);
  if (!sink_b) return {&sink_w, &db};
  zeroed(*sink_b);
  return {&sink_w, sink_b};
}

}  // namespace

// ---- backward ------------------------------------------------------------------------

void block_backward(Backend& be, const model_config& cfg, const block_tensors& w,
                    const block_activations& a, const Tensor& positions, const Tensor& dy,
                    Tensor& dx, block_tensors& g, block_grad_scratch& s, frozen_weight_grads* frozen, int layer,
                    const block_lora* lora) {
  const std::int64_t N = static_cast<std::int64_t>(a.batch) * a.seq;
  const std::int64_t D = cfg.hidden_size;
  const frozen_sink sink{frozen, layer};
  expect_shape(dy, {N, D}, "block_backward dy");
  expect_shape(dx, {N, D}, "block_backward dx");
  const bool llama = is_llama(cfg);
  // Activation gradients take the activations' dtype (block_forward);
  // parameter gradients are the caller's (f32).
  const dtype act = a.x.type();
  expect_dtype(dy, act, "block_backward dy");
  expect_dtype(dx, act, "block_backward dx");
  grow_grad_scratch(be, cfg, N, act, s);
  // An adapter's terms (block_forward's lora): their input gradients.
  const auto term = [&](lora_factors block_lora::*role, const Tensor& d_out, Tensor& d_in) {
    add_lora_input_grad(be, lora_of(lora, role), d_out, d_in, s.lora_t);
  };

  // MLP half: y = h + down(act(n2)) (or the experts' mixture of n2).
  if (cfg.is_moe()) {
    // A frozen mixture (no router gradient view): its input gradient only.
    moe_backward(be, cfg, w, a.moe, a.norm2, dy, s.dnorm, g.router_w.defined() ? &g : nullptr, s.moe);
  } else if (llama) {
    linear_backward_or_frozen(be, a.act, w.down_w, dy, &s.dact, g.down_w, opt(g.down_b), sink, "down.weight");
    term(&block_lora::down, dy, s.dact);
    be.swiglu_backward(a.gate, a.up, s.dact, s.dgate, s.dup);
    // dnorm = dgate @ W_gate + dup @ W_up; the weight gradients as one batch
    // where the backend has it.
    const Tensor* ws[] = {&w.gate_w, &w.up_w};
    const Tensor* dys[] = {&s.dgate, &s.dup};
    Tensor* dws[] = {&g.gate_w, &g.up_w};
    const char* const names[] = {"gate.weight", "up.weight"};
    same_x_backward_or_frozen(be, a.norm2, ws, dys, &s.dnorm, dws, {}, sink, names);
    term(&block_lora::gate, s.dgate, s.dnorm);
    term(&block_lora::up, s.dup, s.dnorm);
  } else {
    // dup = gelu_backward(up, dy @ W_down), in the product's epilogue where
    // the backend has it (not with an adapted W_down: its term goes first).
    const bool fused = !(lora && lora->down.defined()) && be.gemm_gelu_backward(dy, w.down_w, a.up, s.dup);
    linear_backward_or_frozen(be, a.act, w.down_w, dy, fused ? nullptr : &s.dact, g.down_w, opt(g.down_b), sink,
                              "down.weight");
    if (!fused) {
      term(&block_lora::down, dy, s.dact);
      be.gelu_backward(a.up, s.dact, s.dup);
    }
    linear_backward_or_frozen(be, a.norm2, w.up_w, s.dup, &s.dnorm, g.up_w, opt(g.up_b), sink, "up.weight");
    term(&block_lora::up, s.dup, s.dnorm);
  }
  // dh = the norm's input gradient + dy, which the residual carries straight through
  Tensor* norm_sink_b = llama ? nullptr : &s.norm_db;  // LayerNorm's bias
  {
    const auto [dw, db] = norm_grads(be, g.mlp_norm_w, g.mlp_norm_b, s.norm_dw, norm_sink_b, D);
    norm_backward_add(be, cfg, a.h, w.mlp_norm_w, a.mean2, a.rstd2, s.dnorm, dy, s.dh, *dw, *db);
  }

  // Attention half: h = x + o(attn(q, k, v)).
  linear_backward_or_frozen(be, a.attn, w.o_w, s.dh, &s.dattn, g.o_w, opt(g.o_b), sink, "o.weight");
  term(&block_lora::o, s.dh, s.dattn);
  be.attention_backward(a.q, a.k, a.v, a.attn, a.lse, s.dattn, a.batch, a.seq,
                        block_attention_shape(cfg), s.dq, s.dk, s.dv);
  if (llama) {
    // RoPE is a rotation: its backward rotates the gradient back.
    be.rope(s.dq, positions, cfg.n_heads, cfg.head_dim, cfg.rope, true);
    be.rope(s.dk, positions, cfg.n_kv_heads, cfg.head_dim, cfg.rope, true);
  }
  // Gradients of the projections' outputs (before Qwen3's q/k norms).
  Tensor no_bias;
  const std::int64_t hd = cfg.head_dim;
  Tensor* dwq = cfg.qk_norm ? norm_grads(be, g.q_norm_w, no_bias, s.head_norm_dw, nullptr, hd).first : nullptr;
  Tensor* dwk = cfg.qk_norm ? norm_grads(be, g.k_norm_w, no_bias, s.head_norm_dw, nullptr, hd).first : nullptr;
  const auto [dq_p, dk_p] = qk_projection_grads(be, cfg, w, a, s, dwq, dwk);
  Tensor& dq = *dq_p;
  Tensor& dk = *dk_p;
  {
    const Tensor* ws[] = {&w.q_w, &w.k_w, &w.v_w};
    const Tensor* dys[] = {&dq, &dk, &s.dv};
    Tensor* dws[] = {&g.q_w, &g.k_w, &g.v_w};
    Tensor* dbs[] = {opt(g.q_b), opt(g.k_b), opt(g.v_b)};
    const char* const names[] = {"q.weight", "k.weight", "v.weight"};
    same_x_backward_or_frozen(be, a.norm1, ws, dys, &s.dnorm, dws, dbs, sink, names);
    term(&block_lora::q, dq, s.dnorm);
    term(&block_lora::k, dk, s.dnorm);
    term(&block_lora::v, s.dv, s.dnorm);
  }
  const auto [dw, db] = norm_grads(be, g.attn_norm_w, g.attn_norm_b, s.norm_dw, norm_sink_b, D);
  norm_backward_add(be, cfg, a.x, w.attn_norm_w, a.mean1, a.rstd1, s.dnorm, s.dh, dx, *dw, *db);
}

// ---- input-only backward (frozen weights) ------------------------------------------

void block_backward_input(Backend& be, const model_config& cfg, const block_tensors& w,
                          const block_activations& a, const Tensor& positions, const Tensor& dy,
                          Tensor& dx, block_grad_scratch& scratch, const block_lora* lora) {
  // Every gradient view undefined: each product forms its input's gradient
  // alone (a plain GEMM with the weight), each norm's weight gradient goes
  // to scratch, and a mixture of experts gives its input's gradient only.
  block_tensors none;
  block_backward(be, cfg, w, a, positions, dy, dx, none, scratch, nullptr, 0, lora);
}

}  // namespace corolla
