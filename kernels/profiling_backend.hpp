// kernels/profiling_backend.hpp — a Backend that forwards every op to
// another and, while enabled, times each one: per op name, the calls and
// the seconds, each op followed by a synchronisation of the inner backend
// so a device's asynchronous work is charged to the op that queued it.
//
// What the figures mean: an op's time includes its launch and its checks;
// the overlap between consecutive ops (a GPU running one kernel while the
// host queues the next) is lost, so a profiled run is slower than a plain
// one and the table is a breakdown, not a speed. Only ops called through
// the wrapper are seen (code that takes its backend from backend_for(dev)
// bypasses it); empty() is not timed. Disabled, the wrapper
// only forwards (one more virtual call per op): `corolla bench train|decode
// --profile` builds the model on it, measures with profiling off, then runs
// once more with it on and prints the table.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace corolla {

class profiling_backend final : public Backend {
 public:
  /// Wraps `inner`, which must outlive this; starts disabled.
  explicit profiling_backend(Backend& inner) : inner_(inner) {}

  /// One op's totals.
  struct op_time {
    std::string op;
    long long calls = 0;
    double seconds = 0.0;
  };
  /// Starts (or stops) timing; totals are kept until reset().
  void enable(bool on) { enabled_ = on; }
  void reset() { totals_.clear(); }
  /// The totals, the most expensive op first.
  std::vector<op_time> totals() const {
    std::vector<op_time> out;
    for (const auto& [op, t] : totals_) out.push_back({op, t.calls, t.seconds});
    std::sort(out.begin(), out.end(), [](const op_time& a, const op_time& b) { return a.seconds > b.seconds; });
    return out;
  }

  std::string name() const override { return inner_.name(); }
  device dev() const override { return inner_.dev(); }
  Tensor empty(shape_t shape, dtype t = dtype::f32) override { return inner_.empty(std::move(shape), t); }
  Tensor host_empty(shape_t shape, dtype t = dtype::f32) override { return inner_.host_empty(std::move(shape), t); }

  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
            float beta = 0.0f) override {
    timed("gemm", [&] { inner_.gemm(a, trans_a, b, trans_b, c, alpha, beta); });
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    timed(w.type() == x.type() ? "linear" : "linear (inference weight)", [&] { inner_.linear(x, w, bias, y); });
  }
  void linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) override {
    timed("linear_q8", [&] { inner_.linear_q8(x, q, scale, bias, y); });
  }
  void linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias, Tensor& y) override {
    timed("linear_nf4", [&] { inner_.linear_nf4(x, q, absmax, bias, y); });
  }
  bool linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e, const Tensor* residual,
                    Tensor& y) override {
    return fused(e == linear_epilogue::add    ? "linear + add (fused)"
                 : e == linear_epilogue::gelu ? "linear + gelu (fused)"
                                              : "linear + swiglu (fused)",
                 [&] { return inner_.linear_fused(x, w, bias, e, residual, y); });
  }
  bool linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre, Tensor& y) override {
    return fused("linear + gelu, pre kept (fused)", [&] { return inner_.linear_gelu(x, w, bias, pre, y); });
  }
  bool gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) override {
    return fused("gemm + gelu_backward (fused)", [&] { return inner_.gemm_gelu_backward(dy, w, pre, dpre); });
  }
  bool linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& positions, int hq,
                            int hkv, int head_dim, const rope_spec& spec, bool rotate, Tensor& q, void* k_out,
                            void* v_out, dtype cache_type) override {
    return fused("linear + rope + kv store (fused)", [&] {
      return inner_.linear_rope_store_kv(x, w, bias, positions, hq, hkv, head_dim, spec, rotate, q, k_out, v_out,
                                         cache_type);
    });
  }
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db) override {
    timed("linear_backward", [&] { inner_.linear_backward(x, w, dy, dx, dw, db); });
  }
  void linear_same_x(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> bs,
                     std::span<Tensor* const> ys) override {
    timed("linear_same_x", [&] { inner_.linear_same_x(x, ws, bs, ys); });
  }
  void linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> dys,
                              Tensor* dx, std::span<Tensor* const> dws, std::span<Tensor* const> dbs) override {
    timed("linear_same_x_backward", [&] { inner_.linear_same_x_backward(x, ws, dys, dx, dws, dbs); });
  }
  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override {
    timed("embedding", [&] { inner_.embedding(ids, table, out); });
  }
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override {
    timed("embedding_backward", [&] { inner_.embedding_backward(ids, dout, dtable); });
  }
  void moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) override {
    timed("moe_gather", [&] { inner_.moe_gather(src, rows, weights, out); });
  }
  void moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                   Tensor& out) override {
    timed("moe_combine", [&] { inner_.moe_combine(src, slots, weights, accumulate, out); });
  }
  void moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots, Tensor& dweights) override {
    timed("moe_combine_weight_grad", [&] { inner_.moe_combine_weight_grad(dy, src, slots, dweights); });
  }
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) override {
    timed("rmsnorm", [&] { inner_.rmsnorm(x, w, eps, y, rstd); });
  }
  void add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps, Tensor& y) override {
    timed("add_rmsnorm", [&] { inner_.add_rmsnorm(a, b, sum, w, eps, y); });
  }
  void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw) override {
    timed("rmsnorm_backward", [&] { inner_.rmsnorm_backward(x, w, rstd, dy, dx, dw); });
  }
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor* mean,
                 Tensor* rstd) override {
    timed("layernorm", [&] { inner_.layernorm(x, w, b, eps, y, mean, rstd); });
  }
  void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                          Tensor& dx, Tensor& dw, Tensor& db) override {
    timed("layernorm_backward", [&] { inner_.layernorm_backward(x, w, mean, rstd, dy, dx, dw, db); });
  }
  void rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dres,
                            Tensor& dx, Tensor& dw) override {
    timed("rmsnorm_backward + add", [&] { inner_.rmsnorm_backward_add(x, w, rstd, dy, dres, dx, dw); });
  }
  void layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw, Tensor& db) override {
    timed("layernorm_backward + add", [&] { inner_.layernorm_backward_add(x, w, mean, rstd, dy, dres, dx, dw, db); });
  }

  void rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& spec,
            bool inverse = false) override {
    timed(inverse ? "rope_backward" : "rope", [&] { inner_.rope(x, positions, n_heads, head_dim, spec, inverse); });
  }
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv, int head_dim,
                     const rope_spec& spec, bool rotate, void* k_out, void* v_out, dtype cache_type) override {
    timed("rope_store_kv", [&] {
      inner_.rope_store_kv(q, k, v, positions, hq, hkv, head_dim, spec, rotate, k_out, v_out, cache_type);
    });
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq, const attention_shape& s,
                 Tensor& out, Tensor* lse) override {
    timed("attention", [&] { inner_.attention(q, k, v, batch, seq, s, out, lse); });
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, int batch, int seq, const attention_shape& s, Tensor& dq, Tensor& dk,
                          Tensor& dv) override {
    timed("attention_backward",
          [&] { inner_.attention_backward(q, k, v, out, lse, dout, batch, seq, s, dq, dk, dv); });
  }
  void attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos, const attention_shape& s,
                        Tensor& out) override {
    timed("attention_cached", [&] { inner_.attention_cached(q, cache, start_pos, s, out); });
  }
  void rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                           int head_dim, std::span<const kv_pages_view> caches, std::span<const std::int64_t> start_pos,
                           const rope_spec& spec, bool rotate) override {
    timed("rope_store_kv_pages", [&] {
      inner_.rope_store_kv_pages(q, k, v, positions, hq, hkv, head_dim, caches, start_pos, spec, rotate);
    });
  }
  void attention_cached_batch(const Tensor& q, std::span<const kv_pages_view> caches,
                              std::span<const std::int64_t> start_pos, const attention_shape& s,
                              Tensor& out) override {
    timed("attention_cached_batch", [&] { inner_.attention_cached_batch(q, caches, start_pos, s, out); });
  }
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override {
    timed("swiglu", [&] { inner_.swiglu(gate, up, out); });
  }
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate, Tensor& dup) override {
    timed("swiglu_backward", [&] { inner_.swiglu_backward(gate, up, dout, dgate, dup); });
  }
  void gelu(const Tensor& x, Tensor& y) override {
    timed("gelu", [&] { inner_.gelu(x, y); });
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    timed("gelu_backward", [&] { inner_.gelu_backward(x, dy, dx); });
  }
  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    timed("add", [&] { inner_.add(a, b, out); });
  }
  void scale(Tensor& y, float alpha) override {
    timed("scale", [&] { inner_.scale(y, alpha); });
  }
  double sum_squares(const Tensor& x) override {
    double r = 0.0;
    timed("sum_squares", [&] { r = inner_.sum_squares(x); });
    return r;
  }
  void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor* dlogits,
                     float grad_scale) override {
    timed("cross_entropy", [&] { inner_.cross_entropy(logits, targets, losses, dlogits, grad_scale); });
  }
  void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
             std::int64_t step) override {
    timed("adamw", [&] { inner_.adamw(params, grads, m, v, p, step); });
  }
  void adamw_with_copy(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
                       std::int64_t step, Tensor& compute_copy) override {
    timed("adamw + 16-bit copy", [&] { inner_.adamw_with_copy(params, grads, m, v, p, step, compute_copy); });
  }
  void quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) override {
    timed("quantize_int8", [&] { inner_.quantize_int8(x, block, q, scales); });
  }
  void dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) override {
    timed("dequantize_int8", [&] { inner_.dequantize_int8(q, scales, block, x); });
  }
  void quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) override {
    timed("quantize_nf4", [&] { inner_.quantize_nf4(w, q, absmax); });
  }
  void dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) override {
    timed("dequantize_nf4", [&] { inner_.dequantize_nf4(q, absmax, w); });
  }
  void copy(const Tensor& src, Tensor& dst) override {
    timed("copy", [&] { inner_.copy(src, dst); });
  }
  void synchronize() override { inner_.synchronize(); }
  std::shared_ptr<queue_marker> mark() override { return inner_.mark(); }
  /// Forwarded untimed: it runs on another thread than the ops.
  void copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) override {
    inner_.copy_after(after, src, dst);
  }
  void wait(const queue_marker* after) override { inner_.wait(after); }
  /// The inner backend's companion, unwrapped: its ops are not timed.
  std::unique_ptr<Backend> companion() override { return inner_.companion(); }
  void release_cached_memory() override { inner_.release_cached_memory(); }
  /// While timing, the step's ops run one by one (each is timed); else the
  /// inner backend records and replays them as it would unwrapped.
  void run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) override {
    if (enabled_)
      ops();
    else
      inner_.run_step(rec, ops);
  }

 private:
  template <class F>
  void timed(const char* op, F&& f) {
    if (!enabled_) {
      f();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    f();
    inner_.synchronize();
    record(op, t0);
  }

  /// Runs a fused op f (which says whether the inner backend took it) and
  /// records `op` only when it did: otherwise the caller's two ops are.
  template <class F>
  bool fused(const char* op, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool done = f();
    if (done && enabled_) {
      inner_.synchronize();
      record(op, t0);
    }
    return done;
  }

  /// Adds one call of `op`, begun at t0 and finished now, to the totals.
  void record(const char* op, std::chrono::steady_clock::time_point t0) {
    auto& t = totals_[op];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  Backend& inner_;
  bool enabled_ = false;
  std::map<std::string, op_time> totals_;
};

}  // namespace corolla
