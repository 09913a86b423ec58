// tests/emulated_device/emulated_products.cpp — the emulated device
// backend's products: gemm, linear (f32, 16-bit, int8 and nf4 weights),
// their fused epilogues, the batched products of one x, the embedding and
// the mixture-of-experts gathers.
#include "emulated_device.hpp"

#include <string>
#include <utility>
#include <vector>

#include "emulated_op.hpp"
#include "kernels/op_checks.hpp"
#include "kernels/same_x_batch.hpp"

namespace corolla::testing {

using emulated::want;
using emulated::want_float;

void emulated_device_backend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                                   float alpha, float beta) {
  user u(*this);
  want_float(a, "gemm a");
  want_float(c, "gemm c");
  require_product_types(a, "gemm a", b, "gemm b", c, "gemm c");
  operands o(*this);
  Tensor cv = o.out(c, "gemm c");
  cpu_backend().gemm(o.in(a, "gemm a"), trans_a, o.in(b, "gemm b"), trans_b, cv, alpha, beta);
  o.finish();
}

void emulated_device_backend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  user u(*this);
  want_float(x, "linear x");
  if (x.type() == dtype::f32 && w.type() == dtype::bf16) {  // an inference weight: the CPU takes it as it is
    want(y, dtype::f32, "linear y");
    want(bias, dtype::f32, "linear bias");
  } else {
    want_float(y, "linear y");
    require_product_types(x, "linear x", w, "linear w", y, "linear y");
    if (bias) want_float(*bias, "linear bias");
  }
  operands o(*this);
  Tensor yv = o.out(y, "linear y");
  const Tensor wv = x.type() == dtype::f32 ? on_device(w, "linear w") : o.in(w, "linear w");
  const Tensor bv = bias ? o.in(*bias, "linear bias") : Tensor{};
  cpu_backend().linear(o.in(x, "linear x"), wv, bias ? &bv : nullptr, yv);
  o.finish();
}

void emulated_device_backend::linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias,
                                        Tensor& y) {
  user u(*this);
  want(x, dtype::f32, "linear_q8 x");
  want(q, dtype::i8, "linear_q8 q");
  want(scale, dtype::f32, "linear_q8 scale");
  want(bias, dtype::f32, "linear_q8 bias");
  want(y, dtype::f32, "linear_q8 y");
  operands o(*this);
  Tensor yv = o.out(y, "linear_q8 y");
  const Tensor bv = bias ? o.in(*bias, "linear_q8 bias") : Tensor{};
  cpu_backend().linear_q8(o.in(x, "linear_q8 x"), on_device(q, "linear_q8 q"), o.in(scale, "linear_q8 scale"),
                          bias ? &bv : nullptr, yv);
  o.finish();
}

void emulated_device_backend::linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias,
                                         Tensor& y) {
  user u(*this);
  want(x, dtype::f32, "linear_nf4 x");
  want(q, dtype::i8, "linear_nf4 q");
  want(absmax, dtype::f32, "linear_nf4 absmax");
  want(bias, dtype::f32, "linear_nf4 bias");
  want(y, dtype::f32, "linear_nf4 y");
  operands o(*this);
  Tensor yv = o.out(y, "linear_nf4 y");
  const Tensor bv = bias ? o.in(*bias, "linear_nf4 bias") : Tensor{};
  cpu_backend().linear_nf4(o.in(x, "linear_nf4 x"), on_device(q, "linear_nf4 q"), o.in(absmax, "linear_nf4 absmax"),
                           bias ? &bv : nullptr, yv);
  o.finish();
}

bool emulated_device_backend::linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
                                           const Tensor* residual, Tensor& y) {
  if (!check_linear_fused(x, w, bias, e, residual, y, dev())) {  // CUDA's rules
    if (e != linear_epilogue::add || !residual || !check_linear_add_product(x, w, bias, *residual, y, dev()))
      return false;
    // cuBLASLt's add (gemm_epilogues.cpp): the residual may be y itself
    Tensor t = empty({x.dim(0), w.dim(0)}, y.type());
    linear(x, w, bias, t);
    add(*residual, t, y);
    return true;
  }
  const std::int64_t rows = x.dim(0), rows_w = w.dim(0);
  Tensor t = empty({rows, rows_w});
  linear(x, w, bias, t);
  switch (e) {
    case linear_epilogue::add:
      add(*residual, t, y);
      break;
    case linear_epilogue::gelu:
      gelu(t, y);
      break;
    case linear_epilogue::swiglu: {
      const std::int64_t F = rows_w / 2;
      for (std::int64_t r = 0; r < rows; ++r) {
        const Tensor both = t.slice(r, r + 1).view({rows_w});
        Tensor yr = y.slice(r, r + 1);
        swiglu(both.slice(0, F).view({1, F}), both.slice(F, 2 * F).view({1, F}), yr);
      }
      break;
    }
  }
  return true;
}

bool emulated_device_backend::linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre,
                                          Tensor& y) {
  if (!check_linear_gelu(x, w, bias, pre, y, dev())) return false;  // CUDA's rules
  linear(x, w, bias, pre);
  gelu(pre, y);
  return true;
}

bool emulated_device_backend::gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) {
  if (!check_gemm_gelu_backward(dy, w, pre, dpre, dev())) return false;  // CUDA's rules
  Tensor t = empty({dy.dim(0), w.dim(1)}, dpre.type());
  gemm(dy, false, w, false, t);
  gelu_backward(pre, t, dpre);
  return true;
}

bool emulated_device_backend::linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias,
                                                   const Tensor& positions, int hq, int hkv, int head_dim,
                                                   const rope_spec& spec, bool rotate, Tensor& q, void* k_out,
                                                   void* v_out, dtype cache_type) {
  if (!check_linear_rope_kv(x, w, bias, hq, hkv, head_dim, spec, rotate, q, k_out, v_out, dev()))
    return false;  // CUDA's rules
  const std::int64_t qw = std::int64_t{hq} * head_dim, kw = std::int64_t{hkv} * head_dim;
  Tensor t = empty({1, qw + 2 * kw});
  linear(x, w, bias, t);
  const Tensor all = t.view({qw + 2 * kw});
  copy(all.slice(0, qw).view({1, qw}), q);
  Tensor k = all.slice(qw, qw + kw).view({1, kw});
  rope_store_kv(q, k, all.slice(qw + kw, qw + 2 * kw).view({1, kw}), positions, hq, hkv, head_dim, spec, rotate,
                k_out, v_out, cache_type);
  return true;
}

void emulated_device_backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                              Tensor& dw, Tensor* db) {
  user u(*this);
  want_float(x, "linear_backward x");
  refuse_inference_weight(w, x.type(), "linear_backward w");
  want(w, x.type(), "linear_backward w");
  want(dy, x.type(), "linear_backward dy");
  if (dx) {
    want_float(*dx, "linear_backward dx");
    require_product_types(dy, "linear_backward dy", w, "linear_backward w", *dx, "linear_backward dx");
  }
  want_float(dw, "linear_backward dw");
  require_product_types(dy, "linear_backward dy", x, "linear_backward x", dw, "linear_backward dw");
  if (db) want_float(*db, "linear_backward db");
  operands o(*this);
  Tensor dxv, dbv;
  Tensor dwv = o.out(dw, "linear_backward dw");
  Tensor* dxp = o.out(dx, "linear_backward dx", dxv);
  Tensor* dbp = o.out(db, "linear_backward db", dbv);
  cpu_backend().linear_backward(o.in(x, "linear_backward x"), o.in(w, "linear_backward w"),
                                o.in(dy, "linear_backward dy"), dxp, dwv, dbp);
  o.finish();
}

void emulated_device_backend::linear_same_x(const Tensor& x, std::span<const Tensor* const> ws,
                                            std::span<const Tensor* const> bs, std::span<Tensor* const> ys) {
  if (linear_same_x_plan(x, ws, bs, ys)) ++stats_.batched_products;
  Backend::linear_same_x(x, ws, bs, ys);
}

void emulated_device_backend::linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws,
                                                     std::span<const Tensor* const> dys, Tensor* dx,
                                                     std::span<Tensor* const> dws, std::span<Tensor* const> dbs) {
  if (linear_same_x_backward_plan(x, ws, dys, dws, dbs)) ++stats_.batched_products;
  Backend::linear_same_x_backward(x, ws, dys, dx, dws, dbs);
}

void emulated_device_backend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  user u(*this);
  want_float(table, "embedding table");
  want(out, table.type(), "embedding out");
  operands o(*this);
  Tensor ov = o.out(out, "embedding out");
  cpu_backend().embedding(o.index(ids, "embedding ids"), o.in(table, "embedding table"), ov);
  o.finish();
}

void emulated_device_backend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  user u(*this);
  want(dout, dtype::f32, "embedding_backward dout");
  want(dtable, dtype::f32, "embedding_backward dtable");
  Tensor tv = on_device(dtable, "embedding_backward dtable");
  cpu_backend().embedding_backward(index_tensor(ids, "embedding_backward ids"),
                                   on_device(dout, "embedding_backward dout"), tv);
}

// The MoE row moves take rows of one float dtype (f32, or bf16 / f16 under
// mixed precision), weights and their gradient f32, as on CUDA; indices on
// the host or here. 16-bit rows are widened, moved in f32 and rounded once.
void emulated_device_backend::moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) {
  user u(*this);
  want_float(src, "moe_gather src");
  want(out, src.type(), "moe_gather out");
  if (weights) want(*weights, dtype::f32, "moe_gather weights");
  operands o(*this);
  Tensor ov = o.out(out, "moe_gather out");
  Tensor wv = weights ? on_device(*weights, "moe_gather weights") : Tensor();
  cpu_backend().moe_gather(o.in(src, "moe_gather src"), index_tensor(rows, "moe_gather rows"), weights ? &wv : nullptr,
                           ov);
  o.finish();
}

void emulated_device_backend::moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights,
                                          bool accumulate, Tensor& out) {
  user u(*this);
  want_float(src, "moe_combine src");
  want(out, src.type(), "moe_combine out");
  if (weights) want(*weights, dtype::f32, "moe_combine weights");
  operands o(*this);
  Tensor ov = o.out(out, "moe_combine out");
  Tensor wv = weights ? on_device(*weights, "moe_combine weights") : Tensor();
  cpu_backend().moe_combine(o.in(src, "moe_combine src"), index_tensor(slots, "moe_combine slots"),
                            weights ? &wv : nullptr, accumulate, ov);
  o.finish();
}

void emulated_device_backend::moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots,
                                                      Tensor& dweights) {
  user u(*this);
  want_float(src, "moe_combine_weight_grad src");
  want(dy, src.type(), "moe_combine_weight_grad dy");
  want(dweights, dtype::f32, "moe_combine_weight_grad dweights");
  operands o(*this);
  Tensor wv = on_device(dweights, "moe_combine_weight_grad dweights");
  cpu_backend().moe_combine_weight_grad(o.in(dy, "moe_combine_weight_grad dy"), o.in(src, "moe_combine_weight_grad src"),
                                        index_tensor(slots, "moe_combine_weight_grad slots"), wv);
}

}  // namespace corolla::testing
