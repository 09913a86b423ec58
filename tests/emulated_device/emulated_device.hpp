// tests/emulated_device/emulated_device.hpp — a Backend on a pretend CUDA
// device whose memory is host memory, so code written for a device backend
// (where tensors live, what is copied where, which thread uses which
// instance, markers and companions) runs on machines without a GPU.
//
// What it checks, as the CUDA backend would fail:
//  * every float operand of an op is on this device (index tensors: the
//    host or this device); a host tensor passed to an op, or one of another
//    device, is a tensor_error naming the operand;
//  * markers passed to copy_after and wait are this device's;
//  * device groups (join_group): members on distinct devices, every member
//    calling the same collective with the same sizes, each queued on a
//    backend of its member's device (emulated_group.cpp);
//  * a recorded step (run_step) as the CUDA backend's step graphs need it:
//    a recording's first step runs as it comes; every later one runs its
//    ops twice (a capture whose ops must be repeatable, then the rerun a
//    failed capture gets), and inside it a host read (a copy to or from
//    the host, sum_squares, a device-resident index tensor, synchronize)
//    or the tensor layer's memory hooks on device memory (Tensor::zero,
//    copy_from, clone: CUDA's run on the legacy default stream, outside
//    the capture) fail it as they fail a capture: the step then runs again
//    as it comes and counts as a failed step;
//  * two threads inside one instance's ops at once (copy_after and wait
//    excepted) is an error: a device backend's queue and scratch belong to
//    one thread, the reason companion() exists. Ops finish before they
//    return, so an overlap is caught only when it happens to occur.
// What it cannot check: ordering between queues (everything is
// synchronous here), and host code reading device memory through
// Tensor::data (the memory is readable).
//
// The arithmetic is the CPU backend's on host views of the same memory, so
// f32 results equal the CPU backend's bit for bit. 16-bit (bf16, f16)
// operands are taken where the CUDA backend takes them (its dtype rules are
// repeated here, so a plan handing an op a dtype CUDA refuses fails here
// too) and computed as the CUDA kernels do: widened to f32, computed in
// f32, each output rounded once on store. Only the summation order of
// products differs from cuBLASLt's.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <vector>

#include "kernels/backend.hpp"

namespace corolla::testing {

/// Registers host-memory operations for device_kind::cuda (allocate,
/// release, fill_zero, copy). For a process that never uses a real CUDA
/// device: this folder's test executable. Idempotent.
void install_emulated_device_memory();

class emulated_device_backend final : public Backend {
 public:
  /// Pretends to be cuda:`index` (installs the memory operations).
  explicit emulated_device_backend(int index = 0);

  /// What happened through this instance, for tests.
  struct counters {
    std::atomic<int> ops{0};           ///< ops run (copies included)
    std::atomic<int> copy_afters{0};   ///< copy_after calls
    std::atomic<int> waits{0};         ///< wait calls with a marker
    std::atomic<int> companions{0};    ///< companion() calls
    std::atomic<int> host_empties{0};  ///< host_empty calls
    std::atomic<int> collectives{0};   ///< device-group collectives queued here
    std::atomic<int> recorded_steps{0};  ///< run_step calls run as recorded steps (twice, no host read)
    std::atomic<int> failed_steps{0};    ///< run_step calls whose recording failed (then run as they come)
    /// linear_same_x and linear_same_x_backward calls whose operands CUDA
    /// would run as one batched product (kernels/same_x_batch.hpp)
    std::atomic<int> batched_products{0};
  };
  const counters& stats() const { return stats_; }

  std::string name() const override { return "emulated " + dev().str(); }
  device dev() const override { return {device_kind::cuda, index_}; }
  Tensor empty(shape_t shape, dtype t = dtype::f32) override;
  Tensor host_empty(shape_t shape, dtype t = dtype::f32) override;

  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
            float beta = 0.0f) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  void linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) override;
  void linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias, Tensor& y) override;
  /// Takes what the CUDA backend takes (f32 x of 1 to 16 rows, a bf16 w;
  /// add for the products check_linear_add_product takes) and runs the two
  /// ops (its own linear, then add, gelu or swiglu), so the model's fused
  /// decode and training paths run here with the cpu's arithmetic.
  bool linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e, const Tensor* residual,
                    Tensor& y) override;
  /// Takes what the CUDA backend takes (check_linear_gelu) and runs linear,
  /// then gelu.
  bool linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre, Tensor& y) override;
  /// Takes what the CUDA backend takes (check_gemm_gelu_backward) and runs
  /// gemm, then gelu_backward: the product is rounded to dpre's dtype in
  /// between, where cuBLASLt's epilogue keeps it in f32, so 16-bit results
  /// are the unfused ops' bits, not CUDA's.
  bool gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) override;
  /// Takes what the CUDA backend takes (one f32 row, a bf16 stacked q/k/v
  /// weight, in % 8 == 0) and runs linear then rope_store_kv.
  bool linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& positions, int hq,
                            int hkv, int head_dim, const rope_spec& spec, bool rotate, Tensor& q, void* k_out,
                            void* v_out, dtype cache_type) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       Tensor* db) override;
  /// Count the calls CUDA would batch (stats().batched_products), then
  /// run the Backend's default, one product each.
  void linear_same_x(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> bs,
                     std::span<Tensor* const> ys) override;
  void linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> dys,
                              Tensor* dx, std::span<Tensor* const> dws, std::span<Tensor* const> dbs) override;
  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) override;
  void moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                   Tensor& out) override;
  void moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots, Tensor& dweights) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) override;
  void add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps, Tensor& y) override;
  void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw) override;
  /// dres added to the f32 dx before the one rounding, as CUDA's kernel.
  void rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, const Tensor& dres,
                            Tensor& dx, Tensor& dw) override;
  void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor* mean,
                 Tensor* rstd) override;
  void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                          Tensor& dx, Tensor& dw, Tensor& db) override;
  /// dres added to the f32 dx before the one rounding, as CUDA's kernel.
  void layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw, Tensor& db) override;
  void rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& theta, bool inverse = false) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq, const attention_shape& s,
                 Tensor& out, Tensor* lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, int batch, int seq, const attention_shape& s, Tensor& dq, Tensor& dk,
                          Tensor& dv) override;
  /// The cache's pages are this device's memory, read in place.
  void attention_cached(const Tensor& q, const kv_pages_view& cache, std::int64_t start_pos, const attention_shape& s,
                        Tensor& out) override;
  void rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                           int head_dim, std::span<const kv_pages_view> caches, std::span<const std::int64_t> start_pos,
                           const rope_spec& spec, bool rotate) override;
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate, Tensor& dup) override;
  void gelu(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void scale(Tensor& y, float alpha) override;
  double sum_squares(const Tensor& x) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor* dlogits,
                     float grad_scale) override;
  void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
             std::int64_t step) override;
  void quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) override;
  void dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) override;
  void quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) override;
  void dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) override;

  /// Host <-> this device, or within it (converting dtypes like the CUDA
  /// backend); another device's tensor is refused.
  void copy(const Tensor& src, Tensor& dst) override;
  std::shared_ptr<queue_marker> mark() override;
  /// Same dtype only, like the CUDA backend's; callable beside the ops.
  void copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) override;
  void wait(const queue_marker* after) override;
  /// A new instance on the same device.
  std::unique_ptr<Backend> companion() override;
  /// The CUDA backend's step graphs, emulated (see the top of this file).
  void run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) override;
  /// Nothing is queued; inside a recorded step it fails the step.
  void synchronize() override;

  /// Groups of emulated devices in this process (emulated_group.cpp): ids
  /// are unique per process; join_group blocks until every member joined
  /// (60 s at most, then std::runtime_error).
  bool has_device_groups() const override { return true; }
  device_group_id new_group_id() override;
  std::unique_ptr<device_group> join_group(const device_group_id& id, int rank, int size,
                                           const group_give_up& give_up) override;

 private:
  friend class emulated_group;
  /// Runs `body` as one op of this instance (the one-thread check, counted
  /// as a collective).
  void run_collective(const std::function<void()>& body);

  class user;      ///< marks the calling thread as inside an op (emulated_op.hpp)
  class operands;  ///< one op's operands on the host, 16-bit ones widened (emulated_op.hpp)
  /// The four norm backwards: LayerNorm with a mean (and db), RMSNorm
  /// without; dres (the _add forms) added in f32 before the one rounding.
  void norm_backward(const Tensor& x, const Tensor& w, const Tensor* mean, const Tensor& rstd, const Tensor& dy,
                     const Tensor* dres, Tensor& dx, Tensor& dw, Tensor* db);
  /// `t` (on this device, or undefined) as a host tensor over the same
  /// memory; `what` names it in the error.
  Tensor on_device(const Tensor& t, const char* what) const;
  /// An index tensor: the host, or this device.
  Tensor index_tensor(const Tensor& t, const char* what) const;
  /// A tensor_error naming `what` while the calling thread runs a recorded
  /// step (a host read that a captured CUDA graph could not make).
  void no_host_read(const char* what) const;
  /// A marker of this device, or a tensor_error naming `op`.
  void check_marker(const queue_marker* m, const char* op) const;
  /// `cache` with its first pages for `keys` keys read from its device
  /// tables (into k and v), as a device kernel finds them; `cache` itself
  /// when it has none. Throws naming `what` for another device's tables.
  kv_pages_view through_device_tables(const kv_pages_view& cache, std::int64_t keys, std::vector<const void*>& k,
                                      std::vector<const void*>& v, const char* what) const;

  int index_ = 0;
  std::atomic<std::thread::id> owner_{};  ///< the thread inside an op
  int depth_ = 0;                         ///< nesting of that thread's ops (add_rmsnorm's default and the like)
  std::mutex transfer_mu_;
  counters stats_;
};

}  // namespace corolla::testing
