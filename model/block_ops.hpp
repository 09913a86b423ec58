// model/block_ops.hpp — the small steps model/block.cpp (training forward),
// model/block_backward.cpp and model/block_cached.cpp (the cached inference
// forwards) share: family checks, widths, the row stacks batched products
// write into, the norms of each family, Qwen3's per-head q/k norm and RoPE
// of q and k. Internal to model/.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/workspace.hpp"

namespace corolla::block_ops {

inline bool is_llama(const model_config& cfg) { return cfg.arch == architecture::llama; }

inline std::int64_t q_width(const model_config& cfg) {
  return static_cast<std::int64_t>(cfg.n_heads) * cfg.head_dim;
}
inline std::int64_t kv_width(const model_config& cfg) {
  return static_cast<std::int64_t>(cfg.n_kv_heads) * cfg.head_dim;
}

/// Makes each of ts an [N, width] slice of one [ts.size() * N, width]
/// tensor `stack` of dtype `act`, in order: products of one x into them are
/// then equally spaced, and a backend may run them as one batched product
/// (Backend::linear_same_x and its backward).
inline void row_stack(Backend& be, Tensor& stack, std::initializer_list<Tensor*> ts, std::int64_t N, std::int64_t width,
               dtype act) {
  ensure_tensor(be, stack, {static_cast<std::int64_t>(ts.size()) * N, width}, act);
  std::int64_t row = 0;
  for (Tensor* t : ts) {
    *t = stack.slice(row, row + N);
    row += N;
  }
}

/// Makes q, k and v [N, Q], [N, KV], [N, KV] of dtype `act`: when Q == KV,
/// slices of one [3N, Q] tensor `stack` (row_stack); else (grouped-query
/// attention) q its own and k and v slices of one [2N, KV] `stack`, so
/// theirs may batch.
inline void qkv_stack(Backend& be, Tensor& stack, Tensor& q, Tensor& k, Tensor& v, std::int64_t N, std::int64_t Q,
               std::int64_t KV, dtype act) {
  if (Q != KV) {
    ensure_tensor(be, q, {N, Q}, act);
    row_stack(be, stack, {&k, &v}, N, KV, act);
  } else {
    row_stack(be, stack, {&q, &k, &v}, N, Q, act);
  }
}

/// Pointer to an optional tensor: null when the family has no such tensor.
inline const Tensor* opt(const Tensor& t) { return t.defined() ? &t : nullptr; }
inline Tensor* opt(Tensor& t) { return t.defined() ? &t : nullptr; }

/// The block's first or second norm: RMSNorm for Llama, LayerNorm for GPT-2.
inline void norm_forward(Backend& be, const model_config& cfg, const Tensor& x, const Tensor& w,
                  const Tensor& b, Tensor& y, Tensor* mean, Tensor* rstd) {
  if (is_llama(cfg))
    be.rmsnorm(x, w, cfg.norm_eps, y, rstd);
  else
    be.layernorm(x, w, b, cfg.norm_eps, y, mean, rstd);
}

/// Qwen3's per-head RMSNorm of the rows of x [N, heads*Dh] into y (as
/// [N*heads, Dh] rows sharing one [Dh] weight), 1/rms per head row into
/// rstd when given.
inline void head_rmsnorm(Backend& be, const model_config& cfg, const Tensor& x, const Tensor& w, Tensor& y,
                  Tensor* rstd) {
  const std::int64_t rows = x.numel() / cfg.head_dim;
  Tensor xv = x.view({rows, cfg.head_dim}), yv = y.view({rows, cfg.head_dim});
  if (rstd) {
    Tensor rv = rstd->view({rows});
    be.rmsnorm(xv, w, cfg.norm_eps, yv, &rv);
  } else {
    be.rmsnorm(xv, w, cfg.norm_eps, yv, nullptr);
  }
}

/// The backward of head_rmsnorm: dx from dy, dw accumulated.
inline void head_rmsnorm_backward(Backend& be, const model_config& cfg, const Tensor& x, const Tensor& w,
                           const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const std::int64_t rows = x.numel() / cfg.head_dim;
  Tensor dxv = dx.view({rows, cfg.head_dim});
  be.rmsnorm_backward(x.view({rows, cfg.head_dim}), w, rstd.view({rows}), dy.view({rows, cfg.head_dim}), dxv, dw);
}

/// RoPE on the cached forward's q and k rows (Llama).
inline void rope_qk(Backend& be, const model_config& cfg, Tensor& q, Tensor& k, const Tensor& positions) {
  be.rope(q, positions, cfg.n_heads, cfg.head_dim, cfg.rope);
  be.rope(k, positions, cfg.n_kv_heads, cfg.head_dim, cfg.rope);
}

/// The backward of a pre-norm block half's norm, with the gradient the
/// residual connection carries to the same input added: dx = the norm's
/// input gradient + dres (one pass where the backend fuses it).
inline void norm_backward_add(Backend& be, const model_config& cfg, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, const Tensor& dy, const Tensor& dres, Tensor& dx,
                              Tensor& dw, Tensor& db) {
  if (is_llama(cfg))
    be.rmsnorm_backward_add(x, w, rstd, dy, dres, dx, dw);
  else
    be.layernorm_backward_add(x, w, mean, rstd, dy, dres, dx, dw, db);
}

/// An [N, r] view of `scratch` in f's dtype for a LoRA term's rank-r
/// product (grows only; made again when the factors' dtype changes).
inline Tensor lora_rank_rows(Backend& be, const lora_factors& f, std::int64_t N, Tensor& scratch) {
  const std::int64_t r = f.a.dim(0);
  if (!scratch.defined() || scratch.type() != f.a.type() || scratch.numel() < N * r)
    scratch = be.empty({N * r}, f.a.type());
  return scratch.slice(0, N * r).view({N, r});
}

/// A LoRA term beside a frozen linear weight (model/lora_factors.hpp):
/// y += s (x A^T) B^T for f (nothing when f is null or undefined); x [N,
/// in], y [N, out]. `scratch` holds x A^T (lora_rank_rows).
inline void add_lora_term(Backend& be, const lora_factors* f, const Tensor& x, Tensor& y, Tensor& scratch) {
  if (!f || !f->defined() || x.dim(0) == 0) return;
  Tensor t = lora_rank_rows(be, *f, x.dim(0), scratch);
  be.gemm(x, false, f->a, true, t);                  // x A^T [N, r]
  be.gemm(t, false, f->b, true, y, f->scale, 1.0f);  // += s t B^T
}

/// The input gradient of add_lora_term's term: dx += s (dy B) A (nothing
/// when f is null or undefined); dy [N, out], dx [N, in]. `scratch` holds
/// dy B (lora_rank_rows).
inline void add_lora_input_grad(Backend& be, const lora_factors* f, const Tensor& dy, Tensor& dx, Tensor& scratch) {
  if (!f || !f->defined() || dy.dim(0) == 0) return;
  Tensor t = lora_rank_rows(be, *f, dy.dim(0), scratch);
  be.gemm(dy, false, f->b, false, t);                 // dy B [N, r]
  be.gemm(t, false, f->a, false, dx, f->scale, 1.0f);  // += s t A
}

/// The factors of `role` in `lora`, or null without an adapter.
inline const lora_factors* lora_of(const block_lora* lora, lora_factors block_lora::*role) {
  return lora ? &(lora->*role) : nullptr;
}

}  // namespace corolla::block_ops
