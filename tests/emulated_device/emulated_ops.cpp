// tests/emulated_device/emulated_ops.cpp — the emulated device backend's
// other ops: norms, RoPE, attention (and its paged KV cache), activations,
// elementwise ops, the loss, AdamW, quantisation and copies.
#include "emulated_device.hpp"

#include <string>
#include <utility>
#include <vector>

#include "emulated_op.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::testing {

using emulated::want;
using emulated::want_float;

void emulated_device_backend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  user u(*this);
  want_float(x, "rmsnorm x");
  want(y, x.type(), "rmsnorm y");
  want(w, dtype::f32, "rmsnorm w");
  want(rstd, dtype::f32, "rmsnorm rstd");
  operands o(*this);
  Tensor rv;
  Tensor yv = o.out(y, "rmsnorm y");
  cpu_backend().rmsnorm(o.in(x, "rmsnorm x"), o.in(w, "rmsnorm w"), eps, yv, o.out(rstd, "rmsnorm rstd", rv));
  o.finish();
}

void emulated_device_backend::add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps,
                                          Tensor& y) {
  user u(*this);
  want_float(a, "add_rmsnorm a");
  for (auto [t, what] : {std::pair{&b, "add_rmsnorm b"}, {&sum, "add_rmsnorm sum"}, {&y, "add_rmsnorm y"}})
    want(*t, a.type(), what);
  want(w, dtype::f32, "add_rmsnorm w");
  if (a.type() != dtype::f32) {  // as the CUDA kernel: the norm reads the stored (rounded) sum
    add(a, b, sum);
    rmsnorm(sum, w, eps, y, nullptr);
    return;
  }
  Tensor sv = on_device(sum, "add_rmsnorm sum");
  Tensor yv = on_device(y, "add_rmsnorm y");
  cpu_backend().add_rmsnorm(on_device(a, "add_rmsnorm a"), on_device(b, "add_rmsnorm b"), sv,
                            on_device(w, "add_rmsnorm w"), eps, yv);
}

void emulated_device_backend::norm_backward(const Tensor& x, const Tensor& w, const Tensor* mean, const Tensor& rstd,
                                            const Tensor& dy, const Tensor* dres, Tensor& dx, Tensor& dw, Tensor* db) {
  user u(*this);
  const bool layer = mean != nullptr;
  auto name = [layer](const char* rms, const char* ln) { return layer ? ln : rms; };
  want_float(x, name("rmsnorm_backward x", "layernorm_backward x"));
  want(dy, x.type(), name("rmsnorm_backward dy", "layernorm_backward dy"));
  want(dx, x.type(), name("rmsnorm_backward dx", "layernorm_backward dx"));
  if (dres) require_residual_grad(*dres, dx, dev(), name("rmsnorm_backward_add dres", "layernorm_backward_add dres"));
  want(w, dtype::f32, name("rmsnorm_backward w", "layernorm_backward w"));
  want(mean, dtype::f32, "layernorm_backward mean");
  want(rstd, dtype::f32, name("rmsnorm_backward rstd", "layernorm_backward rstd"));
  want(dw, dtype::f32, name("rmsnorm_backward dw", "layernorm_backward dw"));
  want(db, dtype::f32, "layernorm_backward db");
  operands o(*this);
  Tensor dxv = o.out(dx, name("rmsnorm_backward dx", "layernorm_backward dx"));
  Tensor dwv = o.out(dw, name("rmsnorm_backward dw", "layernorm_backward dw"));
  const Tensor xv = o.in(x, name("rmsnorm_backward x", "layernorm_backward x"));
  const Tensor wv = o.in(w, name("rmsnorm_backward w", "layernorm_backward w"));
  const Tensor rv = o.in(rstd, name("rmsnorm_backward rstd", "layernorm_backward rstd"));
  const Tensor dyv = o.in(dy, name("rmsnorm_backward dy", "layernorm_backward dy"));
  if (layer) {
    Tensor dbv = o.out(*db, "layernorm_backward db");
    cpu_backend().layernorm_backward(xv, wv, o.in(*mean, "layernorm_backward mean"), rv, dyv, dxv, dwv, dbv);
  } else {
    cpu_backend().rmsnorm_backward(xv, wv, rv, dyv, dxv, dwv);
  }
  if (dres)  // in f32, before the rounding
    cpu_backend().add(o.in(*dres, name("rmsnorm_backward_add dres", "layernorm_backward_add dres")), dxv, dxv);
  o.finish();
}

void emulated_device_backend::rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                               Tensor& dx, Tensor& dw) {
  norm_backward(x, w, nullptr, rstd, dy, nullptr, dx, dw, nullptr);
}

void emulated_device_backend::rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd,
                                                   const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw) {
  norm_backward(x, w, nullptr, rstd, dy, &dres, dx, dw, nullptr);
}

void emulated_device_backend::layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                                                 Tensor& db) {
  norm_backward(x, w, &mean, rstd, dy, nullptr, dx, dw, &db);
}

void emulated_device_backend::layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean,
                                                     const Tensor& rstd, const Tensor& dy, const Tensor& dres,
                                                     Tensor& dx, Tensor& dw, Tensor& db) {
  norm_backward(x, w, &mean, rstd, dy, &dres, dx, dw, &db);
}

void emulated_device_backend::layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                                        Tensor* mean, Tensor* rstd) {
  user u(*this);
  want_float(x, "layernorm x");
  want(y, x.type(), "layernorm y");
  want(w, dtype::f32, "layernorm w");
  want(b, dtype::f32, "layernorm b");
  want(mean, dtype::f32, "layernorm mean");
  want(rstd, dtype::f32, "layernorm rstd");
  operands o(*this);
  Tensor mv, rv;
  Tensor yv = o.out(y, "layernorm y");
  cpu_backend().layernorm(o.in(x, "layernorm x"), o.in(w, "layernorm w"), o.in(b, "layernorm b"), eps, yv,
                          o.out(mean, "layernorm mean", mv), o.out(rstd, "layernorm rstd", rv));
  o.finish();
}

void emulated_device_backend::rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& theta,
                                   bool inverse) {
  user u(*this);
  want_float(x, "rope x");
  operands o(*this);
  Tensor xv = o.out(x, "rope x");
  cpu_backend().rope(xv, o.index(positions, "rope positions"), n_heads, head_dim, theta, inverse);
  o.finish();
}

void emulated_device_backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq,
                                        const attention_shape& s, Tensor& out, Tensor* lse) {
  user u(*this);
  want_float(q, "attention q");
  for (auto [t, what] : {std::pair{&k, "attention k"}, {&v, "attention v"}, {static_cast<const Tensor*>(&out),
                                                                                "attention out"}})
    want(*t, q.type(), what);
  want(lse, dtype::f32, "attention lse");
  operands o(*this);
  Tensor lv;
  Tensor ov = o.out(out, "attention out");
  cpu_backend().attention(o.in(q, "attention q"), o.in(k, "attention k"), o.in(v, "attention v"), batch, seq, s, ov,
                          o.out(lse, "attention lse", lv));
  o.finish();
}

void emulated_device_backend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                 const Tensor& lse, const Tensor& dout, int batch, int seq,
                                                 const attention_shape& s, Tensor& dq, Tensor& dk, Tensor& dv) {
  user u(*this);
  want_float(q, "attention_backward q");
  for (auto [t, what] : {std::pair{&k, "attention_backward k"}, {&v, "attention_backward v"},
                         {&out, "attention_backward out"}, {&dout, "attention_backward dout"},
                         {static_cast<const Tensor*>(&dq), "attention_backward dq"},
                         {static_cast<const Tensor*>(&dk), "attention_backward dk"},
                         {static_cast<const Tensor*>(&dv), "attention_backward dv"}})
    want(*t, q.type(), what);
  want(lse, dtype::f32, "attention_backward lse");
  operands o(*this);
  Tensor dqv = o.out(dq, "attention_backward dq");
  Tensor dkv = o.out(dk, "attention_backward dk");
  Tensor dvv = o.out(dv, "attention_backward dv");
  cpu_backend().attention_backward(o.in(q, "attention_backward q"), o.in(k, "attention_backward k"),
                                   o.in(v, "attention_backward v"), o.in(out, "attention_backward out"),
                                   o.in(lse, "attention_backward lse"), o.in(dout, "attention_backward dout"), batch,
                                   seq, s, dqv, dkv, dvv);
  o.finish();
}

void emulated_device_backend::attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos,
                                               const attention_shape& s, Tensor& out) {
  user u(*this);
  want(q, dtype::f32, "attention_cached q");
  want(out, dtype::f32, "attention_cached out");
  Tensor ov = on_device(out, "attention_cached out");
  if (cache.device_pages == nullptr) {
    cpu_backend().attention_cached(on_device(q, "attention_cached q"), cache, start_pos, s, ov);
    return;
  }
  // The pages as a device kernel finds them: from the device tables, not
  // from the host arrays.
  check_kv_pages(cache, start_pos, q.dim(0), "attention_cached");
  std::vector<const void*> k, v;
  cpu_backend().attention_cached(on_device(q, "attention_cached q"),
                                 through_device_tables(cache, start_pos + q.dim(0), k, v, "attention_cached"),
                                 start_pos, s, ov);
}

kv_pages_view emulated_device_backend::through_device_tables(const kv_pages_view& cache, std::int64_t keys,
                                                             std::vector<const void*>& k, std::vector<const void*>& v,
                                                             const char* what) const {
  if (cache.device_pages == nullptr) return cache;
  if (cache.pages_device != dev())
    throw tensor_error(std::string(what) + ": the cache's page tables are memory of " + cache.pages_device.str() +
                       ", not of " + name());
  const std::int64_t pages = (keys + cache.page_tokens - 1) / cache.page_tokens;
  k.clear();
  v.clear();
  for (std::int64_t p = 0; p < pages; ++p) {
    k.push_back(cache.device_pages[cache.key_entry + p * cache.page_stride]);
    v.push_back(cache.device_pages[cache.key_entry + 1 + p * cache.page_stride]);
  }
  kv_pages_view from_device = cache;
  from_device.k_pages = k;
  from_device.v_pages = v;
  from_device.device_pages = nullptr;
  return from_device;
}

void emulated_device_backend::rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions,
                                                  int hq, int hkv, int head_dim, std::span<const kv_pages_view> caches,
                                                  std::span<const std::int64_t> start_pos, const rope_spec& spec,
                                                  bool rotate) {
  // Each row's destination as a device kernel finds it (through_device_tables).
  std::vector<std::vector<const void*>> ks(caches.size()), vs(caches.size());
  std::vector<kv_pages_view> views;
  for (std::size_t i = 0; i < caches.size(); ++i)
    views.push_back(through_device_tables(caches[i], caches[i].length, ks[i], vs[i], "rope_store_kv_pages"));
  Backend::rope_store_kv_pages(q, k, v, positions, hq, hkv, head_dim, views, start_pos, spec, rotate);
}

void emulated_device_backend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  user u(*this);
  want_float(gate, "swiglu gate");
  want(up, gate.type(), "swiglu up");
  want(out, gate.type(), "swiglu out");
  operands o(*this);
  Tensor ov = o.out(out, "swiglu out");
  cpu_backend().swiglu(o.in(gate, "swiglu gate"), o.in(up, "swiglu up"), ov);
  o.finish();
}

void emulated_device_backend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                                              Tensor& dup) {
  user u(*this);
  want_float(gate, "swiglu_backward gate");
  for (auto [t, what] : {std::pair{&up, "swiglu_backward up"}, {&dout, "swiglu_backward dout"},
                         {static_cast<const Tensor*>(&dgate), "swiglu_backward dgate"},
                         {static_cast<const Tensor*>(&dup), "swiglu_backward dup"}})
    want(*t, gate.type(), what);
  operands o(*this);
  Tensor gv = o.out(dgate, "swiglu_backward dgate");
  Tensor uv = o.out(dup, "swiglu_backward dup");
  cpu_backend().swiglu_backward(o.in(gate, "swiglu_backward gate"), o.in(up, "swiglu_backward up"),
                                o.in(dout, "swiglu_backward dout"), gv, uv);
  o.finish();
}

void emulated_device_backend::gelu(const Tensor& x, Tensor& y) {
  user u(*this);
  want_float(x, "gelu x");
  want(y, x.type(), "gelu y");
  operands o(*this);
  Tensor yv = o.out(y, "gelu y");
  cpu_backend().gelu(o.in(x, "gelu x"), yv);
  o.finish();
}

void emulated_device_backend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  user u(*this);
  want_float(x, "gelu_backward x");
  want(dy, x.type(), "gelu_backward dy");
  want(dx, x.type(), "gelu_backward dx");
  operands o(*this);
  Tensor dxv = o.out(dx, "gelu_backward dx");
  cpu_backend().gelu_backward(o.in(x, "gelu_backward x"), o.in(dy, "gelu_backward dy"), dxv);
  o.finish();
}

void emulated_device_backend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  user u(*this);
  want_float(a, "add a");
  want(b, a.type(), "add b");
  want(out, a.type(), "add out");
  operands o(*this);
  Tensor ov = o.out(out, "add out");
  cpu_backend().add(o.in(a, "add a"), o.in(b, "add b"), ov);
  o.finish();
}

void emulated_device_backend::scale(Tensor& y, float alpha) {
  user u(*this);
  want_float(y, "scale y");
  operands o(*this);
  Tensor yv = o.out(y, "scale y");
  cpu_backend().scale(yv, alpha);
  o.finish();
}

double emulated_device_backend::sum_squares(const Tensor& x) {
  user u(*this);
  no_host_read("sum_squares");
  want_float(x, "sum_squares x");
  return cpu_backend().sum_squares(operands(*this).in(x, "sum_squares x"));
}

void emulated_device_backend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                                            Tensor* dlogits, float grad_scale) {
  user u(*this);
  want_float(logits, "cross_entropy logits");
  want(losses, dtype::f32, "cross_entropy losses");
  want(dlogits, logits.type(), "cross_entropy dlogits");
  operands o(*this);
  Tensor dv;
  Tensor lv = o.out(losses, "cross_entropy losses");
  // The logits are widened before dlogits is written (they may alias).
  const Tensor lg = o.in(logits, "cross_entropy logits");
  cpu_backend().cross_entropy(lg, o.index(targets, "cross_entropy targets"), lv,
                              o.out(dlogits, "cross_entropy dlogits", dv), grad_scale);
  o.finish();
}

void emulated_device_backend::adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
                                    std::int64_t step) {
  user u(*this);
  Tensor pv = on_device(params, "adamw params");
  Tensor mv = on_device(m, "adamw m");
  Tensor vv = on_device(v, "adamw v");
  cpu_backend().adamw(pv, on_device(grads, "adamw grads"), mv, vv, p, step);
}

void emulated_device_backend::quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) {
  user u(*this);
  Tensor qv = on_device(q, "quantize_int8 q");
  Tensor sv = on_device(scales, "quantize_int8 scales");
  cpu_backend().quantize_int8(on_device(x, "quantize_int8 x"), block, qv, sv);
}

void emulated_device_backend::dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) {
  user u(*this);
  Tensor xv = on_device(x, "dequantize_int8 x");
  cpu_backend().dequantize_int8(on_device(q, "dequantize_int8 q"), on_device(scales, "dequantize_int8 scales"), block,
                                xv);
}

void emulated_device_backend::quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) {
  user u(*this);
  Tensor qv = on_device(q, "quantize_nf4 q");
  Tensor av = on_device(absmax, "quantize_nf4 absmax");
  cpu_backend().quantize_nf4(on_device(w, "quantize_nf4 w"), qv, av);
}

void emulated_device_backend::dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) {
  user u(*this);
  Tensor wv = on_device(w, "dequantize_nf4 w");
  cpu_backend().dequantize_nf4(on_device(q, "dequantize_nf4 q"), on_device(absmax, "dequantize_nf4 absmax"), wv);
}

void emulated_device_backend::copy(const Tensor& src, Tensor& dst) {
  user u(*this);
  // A captured copy would write the host memory when the graph runs, not
  // now. (One from the host is staged while the step is captured: CUDA's
  // copy takes it then, as upload() does.)
  if (dst.dev().kind == device_kind::cpu) no_host_read("copy to the host");
  Tensor dv = dst.dev().kind == device_kind::cpu ? dst : on_device(dst, "copy dst");
  cpu_backend().copy(src.dev().kind == device_kind::cpu ? src : on_device(src, "copy src"), dv);
}

}  // namespace corolla::testing
