// kernels/cpu/cpu_backend.hpp — the host (f32) implementation of Backend.
//
// Internal to kernels/: the rest of the tree reaches this backend through
// cpu_backend() in kernels/backend.hpp. The op families live in one source
// file each (cpu_gemm.cpp, cpu_embedding.cpp, cpu_norm.cpp, cpu_rope.cpp,
// cpu_attention.cpp, cpu_elementwise.cpp, cpu_loss_optim.cpp, cpu_moe.cpp,
// cpu_quant.cpp); registry, thread count, tensor creation and copies in
// cpu_backend.cpp. Helpers shared by those files (shape checks that do not
// allocate, the serial/parallel loop policy, per-thread scratch) are in
// cpu_common.hpp.
//
// Layout decisions that the interface leaves open and this backend fixes:
//  * attention's lse is ordered [b][h][t] (index (b*Hq + h)*T + t) and holds
//    the log-sum-exp of the *scaled* scores scale * q.k.
//  * OpenBLAS runs single-threaded inside OpenMP-split products, so the
//    backend has exactly one thread pool (set_cpu_threads sizes it).
//  * rope caches cos/sin tables per (rope_spec, head_dim); a table grows (one
//    allocation) the first time a larger position is seen, never otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/backend.hpp"

namespace corolla::cpu {

/// scale * cos/sin of pos * inv_freq(i) for pos < positions, i <
/// head_dim/2, row-major [positions][head_dim/2]. Immutable once published.
struct rope_table {
  rope_spec spec;
  int head_dim = 0;
  std::int64_t positions = 0;
  std::vector<float> cos;
  std::vector<float> sin;
};

/// The CPU backend. Thread-compatible like every Backend; the only shared
/// mutable state (rope tables) is guarded so concurrent callers stay safe.
class cpu_backend_impl final : public Backend {
 public:
  /// Sets OpenBLAS to one thread: products are split over this backend's
  /// OpenMP threads instead (cpu_gemm.cpp says why).
  cpu_backend_impl();

  // Every op below implements the contract documented on Backend
  // (kernels/backend.hpp); what is specific to this backend is in the file
  // comment above and in each op family's source file.
  std::string name() const override { return "cpu"; }
  device dev() const override { return {}; }
  Tensor empty(shape_t shape, dtype t = dtype::f32) override;

  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  /// One pass over the int8 rows per output channel, for every row of x
  /// (cpu_linear_q8.cpp): decode reads each weight byte once.
  void linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) override;
  /// NF4 weights (cpu_nf4.cpp): decode reads each packed byte once.
  void linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias, Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                       Tensor& dw, Tensor* db) override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override;
  void moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) override;
  void moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                   Tensor& out) override;
  void moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots, Tensor& dweights) override;

  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) override;
  void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                        Tensor& dx, Tensor& dw) override;
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                 Tensor* mean, Tensor* rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                          Tensor& db) override;

  void rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& spec,
            bool inverse = false) override;
  /// rope, then the rows copied (or converted) into the cache: allocates
  /// nothing (the decode hot path), unlike the default's tensor views.
  void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv, int head_dim,
                     const rope_spec& spec, bool rotate, void* k_out, void* v_out, dtype cache_type) override;

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq,
                 const attention_shape& s, Tensor& out, Tensor* lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, int batch, int seq,
                          const attention_shape& s, Tensor& dq, Tensor& dk,
                          Tensor& dv) override;
  void attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos,
                        const attention_shape& s, Tensor& out) override;

  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate,
                       Tensor& dup) override;
  void gelu(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(Tensor& y, float alpha) override;
  double sum_squares(const Tensor& x) override;

  void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                     Tensor* dlogits, float grad_scale) override;

  void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
             std::int64_t step) override;

  void quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) override;
  void dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) override;
  void quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) override;
  void dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) override;

  void copy(const Tensor& src, Tensor& dst) override;

 private:
  /// The table for (spec, head_dim) covering at least `positions`
  /// positions; builds or grows it on first need (the only allocation rope
  /// ever makes).
  std::shared_ptr<const rope_table> rope_table_for(const rope_spec& spec, int head_dim,
                                                   std::int64_t positions);

  std::mutex rope_mutex_;
  std::vector<std::shared_ptr<const rope_table>> rope_tables_;
};

}  // namespace corolla::cpu
