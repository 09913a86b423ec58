// tests/emulated_device/emulated_device.cpp — the emulated device backend
// (emulated_device.hpp says what it checks).
#include "emulated_device.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/op_checks.hpp"
#include "kernels/same_x_batch.hpp"

namespace corolla::testing {
namespace {

void* emulated_allocate(std::size_t bytes, int) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void emulated_release(void* p, int) noexcept { std::free(p); }
/// Whether this thread runs a recorded step's ops (run_step; ops run on
/// their caller's thread). The memory hooks below are the tensor layer's
/// (Tensor::zero, copy_from, clone), which on CUDA run on the legacy
/// default stream, outside any capture.
thread_local bool in_recorded_step = false;

void no_hook_in_step(const char* what) {
  if (in_recorded_step)
    throw tensor_error(std::string(what) + " of device memory inside a recorded step: on CUDA it runs on the legacy "
                                           "default stream, not in the captured graph");
}

void emulated_fill_zero(void* p, std::size_t bytes, int) {
  no_hook_in_step("Tensor::zero");
  std::memset(p, 0, bytes);
}
void emulated_copy(void* dst, device, const void* src, device, std::size_t bytes) {
  no_hook_in_step("a tensor copy (copy_from, clone)");
  if (bytes > 0) std::memmove(dst, src, bytes);
}

struct emulated_marker final : queue_marker {
  int device = -1;
};

}  // namespace

void install_emulated_device_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    device_memory_ops ops;
    ops.allocate = emulated_allocate;
    ops.release = emulated_release;
    ops.fill_zero = emulated_fill_zero;
    ops.copy = emulated_copy;
    register_device_memory(device_kind::cuda, ops);
  });
}

/// Held for the length of an op: a second thread entering meanwhile throws.
class emulated_device_backend::user {
 public:
  explicit user(emulated_device_backend& b) : b_(b) {
    const std::thread::id me = std::this_thread::get_id();
    std::thread::id none{};
    if (!b_.owner_.compare_exchange_strong(none, me) && none != me)
      throw std::logic_error("two threads used " + b_.name() + " at once (a device backend's queue belongs to one "
                             "thread; another thread needs its companion())");
    ++b_.depth_;
    ++b_.stats_.ops;
  }
  ~user() {
    if (--b_.depth_ == 0) b_.owner_.store(std::thread::id{});
  }
  user(const user&) = delete;
  user& operator=(const user&) = delete;

 private:
  emulated_device_backend& b_;
};

emulated_device_backend::emulated_device_backend(int index) : index_(index) { install_emulated_device_memory(); }

Tensor emulated_device_backend::empty(shape_t shape, dtype t) { return Tensor::empty(std::move(shape), t, dev()); }

Tensor emulated_device_backend::host_empty(shape_t shape, dtype t) {
  ++stats_.host_empties;
  return Tensor::empty(std::move(shape), t);
}

Tensor emulated_device_backend::on_device(const Tensor& t, const char* what) const {
  if (!t.defined()) return t;
  if (t.dev() != dev())
    throw tensor_error(std::string(what) + ": tensor is on " + t.dev().str() + ", expected " + dev().str());
  const std::shared_ptr<storage>& s = t.storage_ptr();
  return Tensor::wrap(storage::borrow(s->data(), s->bytes(), s), t.offset(), t.shape(), t.type());
}

Tensor emulated_device_backend::index_tensor(const Tensor& t, const char* what) const {
  if (t.dev().kind == device_kind::cpu) return t;
  no_host_read(what);  // CUDA reads a device-resident index tensor back to check it
  return on_device(t, what);
}

void emulated_device_backend::no_host_read(const char* what) const {
  if (in_recorded_step)
    throw tensor_error(std::string(what) + ": a host read inside a recorded step (a captured CUDA graph cannot make it)");
}

void emulated_device_backend::check_marker(const queue_marker* m, const char* op) const {
  const auto* e = dynamic_cast<const emulated_marker*>(m);
  if (m != nullptr && (e == nullptr || e->device != index_))
    throw tensor_error(std::string(op) + ": the marker is not one of " + name() + "'s");
}

// ---- dtype rules --------------------------------------------------------------
// The CUDA backend's (kernels/cuda/cuda_ops.cpp, gemm.cpp), so a plan that
// hands an op a dtype CUDA refuses fails here too.
namespace {

/// `t` (when defined) has dtype `type`.
void want(const Tensor& t, dtype type, const char* what) {
  if (t.defined() && t.type() != type)
    throw tensor_error(std::string(what) + ": expected " + dtype_name(type) + ", got " + dtype_name(t.type()));
}
void want(const Tensor* t, dtype type, const char* what) {
  if (t != nullptr) want(*t, type, what);
}
/// `t` (when defined) is f32, bf16 or f16.
void want_float(const Tensor& t, const char* what) {
  if (t.defined() && !is_float_dtype(t.type()))
    throw tensor_error(std::string(what) + ": expected a float tensor, got " + dtype_name(t.type()));
}

}  // namespace

// ---- the ops ------------------------------------------------------------------------

/// One op's operands as the CPU backend takes them: host views of this
/// device's memory, where 16-bit tensors are widened into f32 copies (the
/// CUDA kernels compute in f32 on the widened values) and the outputs among
/// them are rounded back once by finish() (the kernels' one rounding on
/// store). An output is widened with its current values, so ops that
/// accumulate into it or work in place see them.
class emulated_device_backend::operands {
 public:
  explicit operands(const emulated_device_backend& b) : b_(b) {}
  /// An input (read only); undefined stays undefined.
  Tensor in(const Tensor& t, const char* what) const { return widened(b_.on_device(t, what)); }
  /// An output (read too when the op accumulates or works in place).
  Tensor out(const Tensor& t, const char* what) {
    Tensor view = b_.on_device(t, what);
    Tensor wide = widened(view);
    if (wide.defined() && wide.type() != view.type()) written_.emplace_back(wide, view);
    return wide;
  }
  /// An optional output: null stays null, else `slot` holds its view.
  Tensor* out(Tensor* t, const char* what, Tensor& slot) {
    if (t == nullptr) return nullptr;
    slot = out(*t, what);
    return &slot;
  }
  /// An index tensor: the host, or this device (never widened).
  Tensor index(const Tensor& t, const char* what) const { return b_.index_tensor(t, what); }
  /// Rounds the widened outputs into their 16-bit storage.
  void finish() {
    for (auto& [wide, view] : written_) view.copy_from(wide.to(view.type()));
  }

 private:
  static Tensor widened(const Tensor& v) {
    return v.defined() && (v.type() == dtype::bf16 || v.type() == dtype::f16) ? v.to(dtype::f32) : v;
  }
  const emulated_device_backend& b_;
  std::vector<std::pair<Tensor, Tensor>> written_;  ///< (f32 copy, 16-bit view)
};

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

void emulated_device_backend::synchronize() { no_host_read("synchronize"); }

namespace {
struct emulated_recording final : step_recording {};
}  // namespace

void emulated_device_backend::run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) {
  if (in_recorded_step) {  // a step inside a step joins it, as in a capture
    ops();
    return;
  }
  if (!rec) {  // a recording's first step runs as it comes (CUDA's warm-up)
    rec = std::make_unique<emulated_recording>();
    ops();
    return;
  }
  in_recorded_step = true;
  bool recorded = true;
  try {
    ops();  // the capture
  } catch (...) {
    recorded = false;
  }
  in_recorded_step = false;
  if (!recorded) {
    ops();  // as it comes: a real error throws here, and is the step's, not the recording's
    ++stats_.failed_steps;
    return;
  }
  ops();  // the ops must be repeatable: running them again changes nothing
  ++stats_.recorded_steps;
}

std::shared_ptr<queue_marker> emulated_device_backend::mark() {
  user u(*this);
  auto m = std::make_shared<emulated_marker>();
  m->device = index_;
  return m;
}

void emulated_device_backend::copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) {
  check_marker(after, "copy_after");
  if (src.type() != dst.type())
    throw tensor_error("copy_after: " + std::string(dtype_name(src.type())) + " into " + dtype_name(dst.type()) +
                       " (it copies one dtype; copy() converts)");
  std::lock_guard lock(transfer_mu_);
  ++stats_.copy_afters;
  Tensor dv = dst.dev().kind == device_kind::cpu ? dst : on_device(dst, "copy_after dst");
  cpu_backend().copy(src.dev().kind == device_kind::cpu ? src : on_device(src, "copy_after src"), dv);
}

void emulated_device_backend::wait(const queue_marker* after) {
  check_marker(after, "wait");
  if (after) ++stats_.waits;
}

std::unique_ptr<Backend> emulated_device_backend::companion() {
  ++stats_.companions;
  return std::make_unique<emulated_device_backend>(index_);
}

void emulated_device_backend::run_collective(const std::function<void()>& body) {
  user u(*this);
  ++stats_.collectives;
  body();
}

}  // namespace corolla::testing
