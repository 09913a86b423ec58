// tests/emulated_device/emulated_device.cpp — the emulated device backend
// (emulated_device.hpp says what it checks).
#include "emulated_device.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace corolla::testing {
namespace {

void* emulated_allocate(std::size_t bytes, int) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void emulated_release(void* p, int) noexcept { std::free(p); }
void emulated_fill_zero(void* p, std::size_t bytes, int) { std::memset(p, 0, bytes); }
void emulated_copy(void* dst, device, const void* src, device, std::size_t bytes) {
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
  return t.dev().kind == device_kind::cpu ? t : on_device(t, what);
}

void emulated_device_backend::check_marker(const queue_marker* m, const char* op) const {
  const auto* e = dynamic_cast<const emulated_marker*>(m);
  if (m != nullptr && (e == nullptr || e->device != index_))
    throw tensor_error(std::string(op) + ": the marker is not one of " + name() + "'s");
}

void emulated_device_backend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                                   float alpha, float beta) {
  user u(*this);
  Tensor cv = on_device(c, "gemm c");
  cpu_backend().gemm(on_device(a, "gemm a"), trans_a, on_device(b, "gemm b"), trans_b, cv, alpha, beta);
}

void emulated_device_backend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  user u(*this);
  Tensor yv = on_device(y, "linear y");
  const Tensor bv = bias ? on_device(*bias, "linear bias") : Tensor{};
  cpu_backend().linear(on_device(x, "linear x"), on_device(w, "linear w"), bias ? &bv : nullptr, yv);
}

void emulated_device_backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                              Tensor& dw, Tensor* db) {
  user u(*this);
  Tensor dxv = dx ? on_device(*dx, "linear_backward dx") : Tensor{};
  Tensor dbv = db ? on_device(*db, "linear_backward db") : Tensor{};
  Tensor dwv = on_device(dw, "linear_backward dw");
  cpu_backend().linear_backward(on_device(x, "linear_backward x"), on_device(w, "linear_backward w"),
                                on_device(dy, "linear_backward dy"), dx ? &dxv : nullptr, dwv, db ? &dbv : nullptr);
}

void emulated_device_backend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  user u(*this);
  Tensor ov = on_device(out, "embedding out");
  cpu_backend().embedding(index_tensor(ids, "embedding ids"), on_device(table, "embedding table"), ov);
}

void emulated_device_backend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  user u(*this);
  Tensor tv = on_device(dtable, "embedding_backward dtable");
  cpu_backend().embedding_backward(index_tensor(ids, "embedding_backward ids"),
                                   on_device(dout, "embedding_backward dout"), tv);
}

void emulated_device_backend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  user u(*this);
  Tensor yv = on_device(y, "rmsnorm y");
  Tensor rv = rstd ? on_device(*rstd, "rmsnorm rstd") : Tensor{};
  cpu_backend().rmsnorm(on_device(x, "rmsnorm x"), on_device(w, "rmsnorm w"), eps, yv, rstd ? &rv : nullptr);
}

void emulated_device_backend::add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps,
                                          Tensor& y) {
  user u(*this);
  Tensor sv = on_device(sum, "add_rmsnorm sum");
  Tensor yv = on_device(y, "add_rmsnorm y");
  cpu_backend().add_rmsnorm(on_device(a, "add_rmsnorm a"), on_device(b, "add_rmsnorm b"), sv,
                            on_device(w, "add_rmsnorm w"), eps, yv);
}

void emulated_device_backend::rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                               Tensor& dx, Tensor& dw) {
  user u(*this);
  Tensor dxv = on_device(dx, "rmsnorm_backward dx");
  Tensor dwv = on_device(dw, "rmsnorm_backward dw");
  cpu_backend().rmsnorm_backward(on_device(x, "rmsnorm_backward x"), on_device(w, "rmsnorm_backward w"),
                                 on_device(rstd, "rmsnorm_backward rstd"), on_device(dy, "rmsnorm_backward dy"), dxv,
                                 dwv);
}

void emulated_device_backend::layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                                        Tensor* mean, Tensor* rstd) {
  user u(*this);
  Tensor yv = on_device(y, "layernorm y");
  Tensor mv = mean ? on_device(*mean, "layernorm mean") : Tensor{};
  Tensor rv = rstd ? on_device(*rstd, "layernorm rstd") : Tensor{};
  cpu_backend().layernorm(on_device(x, "layernorm x"), on_device(w, "layernorm w"), on_device(b, "layernorm b"), eps,
                          yv, mean ? &mv : nullptr, rstd ? &rv : nullptr);
}

void emulated_device_backend::layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                                                 Tensor& db) {
  user u(*this);
  Tensor dxv = on_device(dx, "layernorm_backward dx");
  Tensor dwv = on_device(dw, "layernorm_backward dw");
  Tensor dbv = on_device(db, "layernorm_backward db");
  cpu_backend().layernorm_backward(on_device(x, "layernorm_backward x"), on_device(w, "layernorm_backward w"),
                                   on_device(mean, "layernorm_backward mean"),
                                   on_device(rstd, "layernorm_backward rstd"), on_device(dy, "layernorm_backward dy"),
                                   dxv, dwv, dbv);
}

void emulated_device_backend::rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, float theta,
                                   bool inverse) {
  user u(*this);
  Tensor xv = on_device(x, "rope x");
  cpu_backend().rope(xv, index_tensor(positions, "rope positions"), n_heads, head_dim, theta, inverse);
}

void emulated_device_backend::attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq,
                                        const attention_shape& s, Tensor& out, Tensor* lse) {
  user u(*this);
  Tensor ov = on_device(out, "attention out");
  Tensor lv = lse ? on_device(*lse, "attention lse") : Tensor{};
  cpu_backend().attention(on_device(q, "attention q"), on_device(k, "attention k"), on_device(v, "attention v"), batch,
                          seq, s, ov, lse ? &lv : nullptr);
}

void emulated_device_backend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                 const Tensor& lse, const Tensor& dout, int batch, int seq,
                                                 const attention_shape& s, Tensor& dq, Tensor& dk, Tensor& dv) {
  user u(*this);
  Tensor dqv = on_device(dq, "attention_backward dq");
  Tensor dkv = on_device(dk, "attention_backward dk");
  Tensor dvv = on_device(dv, "attention_backward dv");
  cpu_backend().attention_backward(on_device(q, "attention_backward q"), on_device(k, "attention_backward k"),
                                   on_device(v, "attention_backward v"), on_device(out, "attention_backward out"),
                                   on_device(lse, "attention_backward lse"),
                                   on_device(dout, "attention_backward dout"), batch, seq, s, dqv, dkv, dvv);
}

void emulated_device_backend::attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos,
                                               const attention_shape& s, Tensor& out) {
  user u(*this);
  Tensor ov = on_device(out, "attention_cached out");
  cpu_backend().attention_cached(on_device(q, "attention_cached q"), cache, start_pos, s, ov);
}

void emulated_device_backend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  user u(*this);
  Tensor ov = on_device(out, "swiglu out");
  cpu_backend().swiglu(on_device(gate, "swiglu gate"), on_device(up, "swiglu up"), ov);
}

void emulated_device_backend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                                              Tensor& dup) {
  user u(*this);
  Tensor gv = on_device(dgate, "swiglu_backward dgate");
  Tensor uv = on_device(dup, "swiglu_backward dup");
  cpu_backend().swiglu_backward(on_device(gate, "swiglu_backward gate"), on_device(up, "swiglu_backward up"),
                                on_device(dout, "swiglu_backward dout"), gv, uv);
}

void emulated_device_backend::gelu(const Tensor& x, Tensor& y) {
  user u(*this);
  Tensor yv = on_device(y, "gelu y");
  cpu_backend().gelu(on_device(x, "gelu x"), yv);
}

void emulated_device_backend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  user u(*this);
  Tensor dxv = on_device(dx, "gelu_backward dx");
  cpu_backend().gelu_backward(on_device(x, "gelu_backward x"), on_device(dy, "gelu_backward dy"), dxv);
}

void emulated_device_backend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  user u(*this);
  Tensor ov = on_device(out, "add out");
  cpu_backend().add(on_device(a, "add a"), on_device(b, "add b"), ov);
}

void emulated_device_backend::scale(Tensor& y, float alpha) {
  user u(*this);
  Tensor yv = on_device(y, "scale y");
  cpu_backend().scale(yv, alpha);
}

double emulated_device_backend::sum_squares(const Tensor& x) {
  user u(*this);
  return cpu_backend().sum_squares(on_device(x, "sum_squares x"));
}

void emulated_device_backend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                                            Tensor* dlogits, float grad_scale) {
  user u(*this);
  Tensor lv = on_device(losses, "cross_entropy losses");
  Tensor dv = dlogits ? on_device(*dlogits, "cross_entropy dlogits") : Tensor{};
  cpu_backend().cross_entropy(on_device(logits, "cross_entropy logits"), index_tensor(targets, "cross_entropy targets"),
                              lv, dlogits ? &dv : nullptr, grad_scale);
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

void emulated_device_backend::copy(const Tensor& src, Tensor& dst) {
  user u(*this);
  Tensor dv = index_tensor(dst, "copy dst");
  cpu_backend().copy(index_tensor(src, "copy src"), dv);
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
  Tensor dv = index_tensor(dst, "copy_after dst");
  cpu_backend().copy(index_tensor(src, "copy_after src"), dv);
}

void emulated_device_backend::wait(const queue_marker* after) {
  check_marker(after, "wait");
  if (after) ++stats_.waits;
}

std::unique_ptr<Backend> emulated_device_backend::companion() {
  ++stats_.companions;
  return std::make_unique<emulated_device_backend>(index_);
}

}  // namespace corolla::testing
