// kernels/backend.hpp — the coarse compute operations every backend provides.
//
// Conventions shared by every op (every backend must honour them):
//  * Activations are 2-D row-major [rows, features]; a batch of B sequences
//    of length T is B*T rows, sequence-major (row = b*T + t).
//  * Linear weights are stored [out, in] (HuggingFace nn.Linear layout);
//    GPT-2's Conv1D weights are transposed once at load time.
//  * Outputs are overwritten. Gradients of *parameters* (dw, db, dtable) are
//    accumulated (+=) so micro-batches add up; gradients of *activations*
//    (dx, dq, ...) are overwritten.
//  * Outputs must be preallocated by the caller with the documented shape;
//    ops allocate nothing (the decode hot path is allocation-free).
//  * Shapes and dtypes are checked; a mismatch throws tensor_error.
//  * The CPU backend computes in f32 and is the numerical reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/adamw_scalars.hpp"
#include "kernels/device_group.hpp"
#include "kernels/kv_pages_view.hpp"
#include "kernels/quantized_weight.hpp"  // the weights linear_q8 and linear_nf4 take, and ops on any format
#include "kernels/rope_spec.hpp"
#include "kernels/tensor.hpp"

namespace corolla {

/// Attention geometry shared by the attention ops.
struct attention_shape {
  int n_heads = 0;     ///< query heads (Hq)
  int n_kv_heads = 0;  ///< key/value heads (Hkv); Hq % Hkv == 0 (grouped-query)
  int head_dim = 0;    ///< Dh; q rows are Hq*Dh wide, k/v rows Hkv*Dh wide
  /// Softmax scale; 0 means 1/sqrt(head_dim).
  float scale = 0.0f;
};

/// AdamW hyper-parameters (decoupled weight decay, bias-corrected moments).
struct adamw_params {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  /// The gradients are multiplied by this (in f32) before the update:
  /// unscaling a loss-scaled step and clipping's coefficient, folded into
  /// the update's one pass instead of a pass of their own. 1 changes nothing.
  float grad_scale = 1.0f;
};

/// The scalars of step `step` (counted from 1). Inline: backends link it
/// without the device registry in backend.cpp.
inline adamw_step_scalars adamw_scalars_for(const adamw_params& p, std::int64_t step) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  adamw_step_scalars k;
  k.decay = static_cast<float>(1.0 - lr * p.weight_decay);
  k.step_size = static_cast<float>(lr / bc1);
  k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  k.beta1 = p.beta1;
  k.beta2 = p.beta2;
  k.eps = p.eps;
  k.one_minus_b1 = static_cast<float>(1.0 - b1);
  k.one_minus_b2 = static_cast<float>(1.0 - b2);
  k.grad_scale = p.grad_scale;
  return k;
}

/// A point in a backend's queue of work (Backend::mark): what was queued
/// before it. Backends subclass it; callers only hold and pass it back.
struct queue_marker {
  virtual ~queue_marker() = default;
};

/// A backend's recording of one kind of step (Backend::run_step), kept by
/// the caller from one step to the next (one per generator's decode step).
/// Backends subclass it; callers only hold it and pass it back.
struct step_recording {
  virtual ~step_recording() = default;
};

/// What Backend::linear_fused does after the product.
enum class linear_epilogue {
  add,     ///< y = residual + linear(x, w, bias): linear, then add
  gelu,    ///< y = gelu(linear(x, w, bias)): linear, then gelu
  swiglu,  ///< y[N, F] = swiglu(gate, up) for a stacked w [2F, in], gate rows first, no bias
};

/// The operation set. One instance per device; thread-compatible (callers
/// serialise use of one instance), ops are internally parallel. The one
/// exception is copy_after, which a second thread may call while another
/// queues ops.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  virtual device dev() const = 0;
  /// Allocates an uninitialised tensor on this backend's device.
  virtual Tensor empty(shape_t shape, dtype t = dtype::f32) = 0;
  /// An uninitialised tensor in host memory this backend copies to and from
  /// fastest (CUDA: page-locked, so copies run at full bus speed and
  /// asynchronously; ordinary host memory where that cannot be had). For
  /// long-lived staging buffers: allocating page-locked memory is slow.
  /// (Inline, as add_rmsnorm.)
  virtual Tensor host_empty(shape_t shape, dtype t = dtype::f32) { return Tensor::empty(std::move(shape), t); }

  // ---- dense algebra ---------------------------------------------------------
  /// c = alpha * op(a) @ op(b) + beta * c, with op(x) = x or x^T. a, b, c are
  /// viewed as 2-D (leading dims folded). a: [M,K] ([K,M] if trans_a),
  /// b: [K,N] ([N,K] if trans_b), c: [M,N].
  virtual void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                    float alpha = 1.0f, float beta = 0.0f) = 0;
  /// y[N,out] = x[N,in] @ w[out,in]^T (+ bias[out] if given).
  /// With an f32 x, w may be bf16 (an inference weight: decode is bound by
  /// reading the weights, and bf16 halves the bytes). x, bias and y stay f32;
  /// the products of x with the exact bf16 values are summed in f32, so the
  /// result is f32 linear on the bf16-rounded weight up to summation order.
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;
  /// y[N,out] = (x[N,in] @ q[out,in]^T) * scale[out] (+ bias[out] if given):
  /// an int8 inference weight quantised per output channel
  /// (kernels/quantize.hpp), read one byte per weight. x, scale, bias and y
  /// are f32; each dot product of x with the exact int8 values is summed in
  /// f32, then scaled (a backend may instead widen many rows' worth of
  /// weight to the f32 values q * scale and multiply those: prefill).
  virtual void linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) = 0;
  /// y[N,out] = x[N,in] @ w'^T (+ bias[out] if given), w' the NF4 weight
  /// (q, absmax) of quantize_nf4 dequantised (kernels/nf4.hpp), read half a
  /// byte per weight: q i8 [out, nf4_row_bytes(in)], absmax f32
  /// [out, nf4_row_blocks(in)]. Each w' value is the f32 product code *
  /// absmax, so the result is linear on dequantize_nf4's weight up to
  /// summation order.
  virtual void linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias, Tensor& y) = 0;
  /// Backward of linear: dx = dy @ w (if dx given, overwritten);
  /// dw += dy^T @ x; db += column sums of dy (if db given). A bf16 weight
  /// with f32 activations is refused (tensor_error "bf16 weights are for
  /// inference; training keeps f32 weights").
  virtual void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                               Tensor& dw, Tensor* db) = 0;
  /// Products of one x (a block's q, k and v; Llama's gate and up): ys[i] = x @ ws[i]^T (+
  /// *bs[i]); bs empty or one entry (or null) per w. This default runs
  /// `linear` for each; CUDA runs them as one strided batched product where
  /// the ws, the ys and the biases are each of one shape and dtype and
  /// equally spaced in memory (one product's waves, not a tail each).
  virtual void linear_same_x(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> bs,
                             std::span<Tensor* const> ys);
  /// Their backward: dx = the sum of dys[i] @ ws[i] (if dx given,
  /// overwritten); dws[i] += dys[i]^T @ x; *dbs[i] += column sums of dys[i]
  /// (dbs empty or entries null: none). Default: linear_backward and gemm.
  virtual void linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws,
                                      std::span<const Tensor* const> dys, Tensor* dx, std::span<Tensor* const> dws,
                                      std::span<Tensor* const> dbs);
  /// linear and the op after it in one pass over the weight, where this
  /// backend has a fused form for these operands (CUDA: an f32 x of 1 to 16
  /// rows with a bf16 weight, as decode has, any epilogue; and add for a
  /// product of more than 16 rows with x, w, y and the residual of one
  /// dtype, as training and prefill with f32 weights have: cuBLASLt with
  /// the residual as its C, beta 1).
  /// Returns false, having done nothing, where it has none: the caller then
  /// runs the two ops. When it returns true, y is what the two ops give (on
  /// CUDA's GEMV, the same bits; through cuBLASLt, the sum rounded once).
  /// Operands it takes but finds malformed (shapes, dtypes, a bias with
  /// swiglu, a residual without add) are a tensor_error, as for linear.
  /// residual is for linear_epilogue::add only, and may be y itself (not a
  /// partial overlap); y may not overlap x. (Inline, as add_rmsnorm.)
  virtual bool linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
                            const Tensor* residual, Tensor& y) {
    (void)x, (void)w, (void)bias, (void)e, (void)residual, (void)y;
    return false;
  }

  /// Training's GELU layer and the product before it in one pass where this
  /// backend has it (CUDA: cuBLASLt's GELU_AUX(_BIAS) epilogue, for x, w,
  /// pre, y and the bias of one float dtype and out % 8 == 0): pre = x @
  /// w^T (+ bias), kept for gelu_backward, and y = gelu(pre), the tanh form
  /// of Backend::gelu (on CUDA of the product before pre is rounded to a
  /// 16-bit dtype, so not bit for bit gelu of the stored pre). Returns false, having done nothing, where it has
  /// none: the caller runs linear, then gelu. Malformed operands of a form
  /// it takes are a tensor_error. pre and y may not overlap each other or x.
  virtual bool linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& pre, Tensor& y) {
    (void)x, (void)w, (void)bias, (void)pre, (void)y;
    return false;
  }
  /// The gradient through that GELU layer into the product after it, in
  /// one pass where this backend has it (CUDA: cuBLASLt's DGELU epilogue,
  /// for dy, w, pre and dpre of one float dtype and in % 8 == 0): for y =
  /// gelu(pre) feeding a linear with weight w [out, in], dpre =
  /// gelu_backward(pre, dy @ w), dy [rows, out], pre and dpre [rows, in].
  /// The product is not rounded to dpre's dtype before the multiply.
  /// Returns false, having done nothing, where it has none: the caller runs
  /// gemm, then gelu_backward. dpre may not overlap dy or pre.
  virtual bool gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) {
    (void)dy, (void)w, (void)pre, (void)dpre;
    return false;
  }

  // ---- embeddings --------------------------------------------------------------
  /// out[i,:] = table[ids[i],:]. ids i32 [N], table [V,D], out [N,D].
  /// Throws tensor_error for an id outside [0,V).
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  /// dtable[ids[i],:] += dout[i,:].
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) = 0;

  // ---- mixture of experts -------------------------------------------------------
  // The rows of a mixture-of-experts MLP (model/moe.hpp) are routed on the
  // host; these move them to and from the experts' contiguous row ranges.
  // Index tensors are i32 on the host or this backend's device; rows are f32
  // on the device (bf16 or f16 too on a backend that computes in them:
  // mixed-precision training), all of an op's rows one dtype; weights and
  // dweights are f32.
  /// out[r,:] = src[rows[r],:] * (weights ? weights[r] : 1). src [N,D], rows
  /// [M] in [0,N), weights [M], out [M,D]. Throws tensor_error for a row
  /// outside [0,N).
  virtual void moe_gather(const Tensor& src, const Tensor& rows, const Tensor* weights, Tensor& out) = 0;
  /// out[t,:] = (accumulate ? out[t,:] : 0) + sum over j of weights[t,j] *
  /// src[slots[t,j],:], the k slots of each row summed in order j
  /// (deterministic). src [M,D], slots [N,K] in [0,M), weights [N,K] (null:
  /// all 1), out [N,D] (must not alias src).
  virtual void moe_combine(const Tensor& src, const Tensor& slots, const Tensor* weights, bool accumulate,
                           Tensor& out) = 0;
  /// The gradient of moe_combine's weights: dweights[t,j] = dot(dy[t,:],
  /// src[slots[t,j],:]). dy [N,D], src [M,D], slots [N,K], dweights [N,K].
  virtual void moe_combine_weight_grad(const Tensor& dy, const Tensor& src, const Tensor& slots,
                                       Tensor& dweights) = 0;

  // ---- normalisation -----------------------------------------------------------
  /// y = x / rms(x) * w, per row. x,y [N,D], w [D], rstd [N] (saved for backward).
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) = 0;
  /// sum = a + b (the residual stream) and y = rmsnorm(sum) in one pass. The
  /// default runs add, then rmsnorm; a device backend fuses them.
  virtual void add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps, Tensor& y) {
    add(a, b, sum);
    rmsnorm(sum, w, eps, y, nullptr);
  }
  /// dx overwritten, dw accumulated.
  virtual void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& dy, Tensor& dx, Tensor& dw) = 0;
  /// rmsnorm_backward with the residual stream's gradient added in the same
  /// pass: dx = the norm's input gradient + dres (a pre-norm block's input
  /// feeds the norm and the residual connection). The default runs
  /// rmsnorm_backward, then add (dres + dx); a device backend fuses them
  /// (the same bits in f32, one rounding in 16 bits). dres is of dx's
  /// dtype and shape; dx may not be dres, dy or x.
  virtual void rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                    const Tensor& dres, Tensor& dx, Tensor& dw) {
    if (dres.raw() == dx.raw()) throw tensor_error("rmsnorm_backward_add dres: dx must be a tensor of its own (not dres)");
    rmsnorm_backward(x, w, rstd, dy, dx, dw);
    add(dres, dx, dx);
  }
  /// y = (x - mean) * rstd * w + b, per row. mean, rstd [N] saved if given.
  virtual void layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                         Tensor* mean, Tensor* rstd) = 0;
  /// dx overwritten, dw and db accumulated.
  virtual void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                                  Tensor& db) = 0;
  /// layernorm_backward with the residual stream's gradient added, as
  /// rmsnorm_backward_add.
  virtual void layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw, Tensor& db) {
    if (dres.raw() == dx.raw())
      throw tensor_error("layernorm_backward_add dres: dx must be a tensor of its own (not dres)");
    layernorm_backward(x, w, mean, rstd, dy, dx, dw, db);
    add(dres, dx, dx);
  }

  // ---- rotary position embedding (HuggingFace rotate-half convention) ---------
  /// In place on x [N, H*Dh]: for each head, element i < Dh/2 pairs with
  /// i + Dh/2, rotated by angle positions[row] * rope.inv_freq(i, Dh) and
  /// scaled by rope.scale() (kernels/rope_spec.hpp; a float is a plain
  /// theta). inverse = true rotates by the negative angle, same scale (this
  /// is the backward).
  virtual void rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim, const rope_spec& rope,
                    bool inverse = false) = 0;
  /// A decode step's RoPE and KV-cache append in one pass: with `rotate`,
  /// q [rows, hq*head_dim] is rotated in place and k [rows, hkv*head_dim]
  /// is written rotated to k_out; without, k is copied; v is copied to
  /// v_out. k_out and v_out point at rows * hkv*head_dim elements of
  /// `cache_type` (f32, or bf16/f16: rounded once on store) in this
  /// backend's device memory (the cache rows of these positions). k may be
  /// left rotated (the default rotates it in place, then copies; a device
  /// backend fuses everything into one launch and leaves k as it is).
  /// (Defined inline, as add_rmsnorm: an out-of-line virtual would make
  /// backend.cpp, with the CUDA registry, the home of Backend's vtable.)
  virtual void rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                             int head_dim, const rope_spec& spec, bool rotate, void* k_out, void* v_out,
                             dtype cache_type) {
    if (rotate) {
      rope(q, positions, hq, head_dim, spec);
      rope(k, positions, hkv, head_dim, spec);
    }
    for (auto [src, dst] : {std::pair<const Tensor*, void*>{&k, k_out}, {&v, v_out}}) {
      const std::size_t bytes = static_cast<std::size_t>(src->numel()) * dtype_size(cache_type);
      Tensor to = Tensor::wrap(storage::borrow(dst, bytes, nullptr, dev()), 0, src->shape(), cache_type);
      copy(*src, to);  // converts to the cache's type
    }
  }
  /// A decode step's q/k/v product and rope_store_kv in one pass: x [1, in]
  /// f32, w [hq*head_dim + 2*hkv*head_dim, in] the q, k and v weights
  /// stacked (block_tensors::qkv_w), bias [as many] f32 or null; q [1,
  /// hq*head_dim] f32 receives the query (rotated by positions[0] with
  /// `rotate`), k_out and v_out the cache rows as rope_store_kv writes them.
  /// Returns false, having done nothing, where this backend has no fused
  /// form for these operands (CUDA: a bf16 w, in % 8 == 0, 16-byte aligned
  /// x and w, as decode's stacked weights are); the caller then runs linear
  /// and rope_store_kv. When it returns true, q and the rows hold what those
  /// two give (on CUDA, the same bits). Operands it takes but finds
  /// malformed are a tensor_error. (Inline, as add_rmsnorm.)
  virtual bool linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& positions,
                                    int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, Tensor& q,
                                    void* k_out, void* v_out, dtype cache_type) {
    (void)x, (void)w, (void)bias, (void)positions, (void)hq, (void)hkv, (void)head_dim, (void)spec, (void)rotate,
        (void)q, (void)k_out, (void)v_out, (void)cache_type;
    return false;
  }
  /// rope_store_kv for rows of different sequences (a server's decode
  /// batch): row i's key (rotated with `rotate`) and value go to position
  /// start_pos[i] of caches[i] (whose length already counts it:
  /// kv_sequence::claim_row; every cache of one element type), hkv*head_dim
  /// elements each; q is rotated in place. A device backend does it in one
  /// launch, finding the rows through the caches' device page tables; this
  /// default runs rope_store_kv row by row into kv_page_row's rows.
  virtual void rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq, int hkv,
                                   int head_dim, std::span<const kv_pages_view> caches,
                                   std::span<const std::int64_t> start_pos, const rope_spec& spec, bool rotate) {
    const auto n = static_cast<std::int64_t>(caches.size());
    if (start_pos.size() != caches.size() || k.rank() != 2 || k.dim(0) != n || v.rank() != 2 || v.dim(0) != n)
      throw tensor_error("rope_store_kv_pages: k and v need one row per cache, and one position each (" +
                         std::to_string(n) + " caches, " + std::to_string(start_pos.size()) + " positions, k " +
                         shape_str(k.shape()) + ", v " + shape_str(v.shape()) + ")");
    const std::int64_t width = std::int64_t{hkv} * head_dim;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      const auto [k_row, v_row] = kv_page_row(caches[u], start_pos[u], width, "rope_store_kv_pages");
      Tensor q_row = q.slice(i, i + 1), k_one = k.slice(i, i + 1);
      rope_store_kv(q_row, k_one, v.slice(i, i + 1), rotate ? positions.slice(i, i + 1) : positions, hq, hkv,
                    head_dim, spec, rotate, k_row, v_row, caches[u].type);
    }
  }

  // ---- attention -----------------------------------------------------------------
  /// Causal self-attention over B sequences of length T.
  /// q [B*T, Hq*Dh], k,v [B*T, Hkv*Dh], out [B*T, Hq*Dh], lse [B*Hq*T]
  /// (log-sum-exp of each softmax row, saved for backward; may be null).
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, int batch, int seq,
                         const attention_shape& s, Tensor& out, Tensor* lse) = 0;
  /// Backward of attention; dq, dk, dv overwritten.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  int batch, int seq, const attention_shape& s, Tensor& dq,
                                  Tensor& dk, Tensor& dv) = 0;
  /// Attention of Tq new query rows (positions start_pos .. start_pos+Tq-1)
  /// against one sequence's paged cache, which must already hold keys and
  /// values up to start_pos+Tq. Causal within the new rows. Covers decode
  /// (Tq = 1) and chunked prefill. q,out [Tq, Hq*Dh].
  virtual void attention_cached(const Tensor& q, const kv_pages_view& cache,
                                std::int64_t start_pos, const attention_shape& s,
                                Tensor& out) = 0;
  /// Decode attention of several sequences at once (a server's decode
  /// batch): row i of q, at position start_pos[i], against caches[i], which
  /// must hold keys and values up to start_pos[i] + 1, into row i of out.
  /// q, out [n, Hq*Dh] with n = caches.size() = start_pos.size(). A device
  /// backend runs it as one launch (and one upload of the page tables); this
  /// default runs attention_cached row by row.
  virtual void attention_cached_batch(const Tensor& q, std::span<const kv_pages_view> caches,
                                      std::span<const std::int64_t> start_pos, const attention_shape& s,
                                      Tensor& out) {
    const auto n = static_cast<std::int64_t>(caches.size());
    if (start_pos.size() != caches.size() || q.rank() != 2 || q.dim(0) != n || out.rank() != 2 || out.dim(0) != n)
      throw tensor_error("attention_cached_batch: q and out need one row per cache, and one start position each (" +
                         std::to_string(caches.size()) + " caches, " + std::to_string(start_pos.size()) +
                         " positions, q " + shape_str(q.shape()) + ", out " + shape_str(out.shape()) + ")");
    for (std::int64_t i = 0; i < n; ++i) {
      Tensor row = out.slice(i, i + 1);
      attention_cached(q.slice(i, i + 1), caches[static_cast<std::size_t>(i)],
                       start_pos[static_cast<std::size_t>(i)], s, row);
    }
  }

  // ---- activations and elementwise ---------------------------------------------
  /// out = silu(gate) * up. All [N,F].
  virtual void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                               Tensor& dgate, Tensor& dup) = 0;
  /// GELU, tanh approximation (GPT-2's "gelu_new").
  virtual void gelu(const Tensor& x, Tensor& y) = 0;
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  /// out = a + b (out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  /// y *= alpha.
  virtual void scale(Tensor& y, float alpha) = 0;
  /// Sum of squares of all elements (for gradient norms), accumulated in f64.
  virtual double sum_squares(const Tensor& x) = 0;

  // ---- loss ----------------------------------------------------------------------
  /// Softmax cross-entropy per row. logits [N,V], targets i32 [N] (-1 =
  /// ignored row: loss 0, zero gradient), losses [N]. If dlogits is given it
  /// receives (softmax - onehot(target)) * grad_scale (may alias logits).
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                             Tensor* dlogits, float grad_scale) = 0;

  // ---- optimiser -----------------------------------------------------------------
  /// One AdamW step on flat f32 buffers of equal size (a shard or a whole
  /// model): m, v updated in place; step counts from 1 (bias correction).
  virtual void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                     const adamw_params& p, std::int64_t step) = 0;
  /// adamw, then `compute_copy` (bf16 or f16, params' number of elements,
  /// on this backend's device) = the updated parameters rounded once: the
  /// 16-bit compute weights of mixed precision (stage::set_compute_dtype)
  /// written in the update's own pass. This default runs adamw and copy; a
  /// device backend fuses them (CUDA: one kernel, the same bits).
  /// (Inline, as add_rmsnorm.)
  virtual void adamw_with_copy(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
                               std::int64_t step, Tensor& compute_copy) {
    if (compute_copy.type() != dtype::bf16 && compute_copy.type() != dtype::f16)
      throw tensor_error(std::string("adamw_with_copy: the copy is bf16 or f16, not ") +
                         dtype_name(compute_copy.type()));
    if (compute_copy.numel() != params.numel())
      throw tensor_error("adamw_with_copy: a copy of " + std::to_string(compute_copy.numel()) + " elements for " +
                         std::to_string(params.numel()) + " parameters");
    adamw(params, grads, m, v, p, step);
    copy(params, compute_copy);
  }

  // ---- wire compression ------------------------------------------------------------
  /// Blockwise absmax 8-bit: for each block of `block` values,
  /// scale = max|x| / 127, q = round(x / scale). x f32 [n], q i8 [n],
  /// scales f32 [ceil(n/block)].
  virtual void quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) = 0;
  virtual void dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) = 0;

  // ---- 4-bit inference weights ---------------------------------------------------
  /// w f32 [out, in] as NF4 (kernels/nf4.hpp): q i8 [out, nf4_row_bytes(in)],
  /// absmax f32 [out, nf4_row_blocks(in)], bit for bit bitsandbytes' codes
  /// when in % 64 == 0.
  virtual void quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) = 0;
  /// w f32 [out, in] = the NF4 weight (q, absmax) dequantised.
  virtual void dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) = 0;

  // ---- transfers -----------------------------------------------------------------
  /// Copies (and converts dtype) src into dst; either may be on the host.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  /// Waits until all queued work on this backend has finished.
  virtual void synchronize() {}
  /// A marker of the work queued so far (CUDA: an event recorded on the
  /// stream), for copy_after. Null where ops finish before they return (the
  /// cpu). (Inline, as add_rmsnorm.)
  virtual std::shared_ptr<queue_marker> mark() { return nullptr; }
  /// copy() of same-dtype tensors, one of them on this backend's device,
  /// ordered after the work queued before `after` (a mark() of this
  /// backend; null: no wait) but not after what was queued since: a device
  /// backend runs it on a transfer queue of its own, so a gradient bucket
  /// can leave the device while later layers' backward still runs. Returns
  /// once dst holds the values. It may be called from one thread other than
  /// the one queuing ops (the data-parallel group's), concurrently with
  /// them. The caller keeps ops off the device operand while it runs: none
  /// queued before `after` may still use it, and none may be queued until it
  /// returns. So the device operand must be long-lived (a parameter or
  /// gradient buffer), not one allocated since the last mark() or
  /// synchronize(): the caching allocator may hand out a block that ops
  /// queued earlier still use.
  virtual void copy_after(const queue_marker* after, const Tensor& src, Tensor& dst) {
    (void)after;
    copy(src, dst);
  }
  /// Returns once the work queued before `after` (a mark() of this backend;
  /// null: nothing to wait for) has finished. Thread-safe like copy_after:
  /// another thread then works on what that work produced. The default is
  /// for backends whose ops finish before they return (mark() gives null):
  /// a marker given to it is an error, so a queued backend must override.
  virtual void wait(const queue_marker* after) {
    if (after != nullptr) throw tensor_error("wait: the " + name() + " backend has no queue markers");
  }
  /// A second instance on the same device with a queue and scratch of its
  /// own, for a thread that computes beside the one using this instance
  /// (the data-parallel group's optimiser step): ops of the two are not
  /// ordered with each other, so the caller orders them (wait, synchronize)
  /// and keeps them off each other's operands. Null where this instance
  /// may itself be used from a second thread (the cpu backend, which is
  /// safe for concurrent callers).
  virtual std::unique_ptr<Backend> companion() { return nullptr; }
  /// Gives the device memory this backend's allocator keeps cached for
  /// reuse back to the device (a process that stops computing but lives on,
  /// such as an elastic rank holding its snapshots, keeps none). A no-op
  /// where nothing is cached.
  virtual void release_cached_memory() {}
  /// Issues the ops `ops` calls on this backend as one step. A backend that
  /// can replay a recorded sequence of launches in one submission (CUDA with
  /// step graphs on: the step captured into a graph whose executable `rec`
  /// keeps and updates in place from step to step) records and submits it;
  /// the default runs `ops` as it comes. `ops` must only queue this
  /// backend's ops (nothing read back to the host, no synchronisation) and
  /// must give the same result when run twice: a recording that fails is
  /// run again without one. Its ops may still be queued when this returns,
  /// like any op's.
  virtual void run_step(std::unique_ptr<step_recording>& rec, const std::function<void()>& ops) {
    (void)rec;
    ops();
  }

  // ---- device collectives (kernels/device_group.hpp) ----------------------------
  /// Whether join_group works here (CUDA built with NCCL). (Inline, as
  /// add_rmsnorm.)
  virtual bool has_device_groups() const { return false; }
  /// A fresh group id (NCCL: ncclGetUniqueId) for one member to send to the
  /// others. Throws tensor_error where has_device_groups() is false.
  virtual device_group_id new_group_id() {
    throw tensor_error("the " + name() + " backend has no device collectives");
  }
  /// Joins group `id` as member `rank` of `size`, on this backend's device
  /// (one device per member). Blocks until every member has joined, asking
  /// `give_up` meanwhile (and later in device_group::synchronize). Throws
  /// tensor_error where has_device_groups() is false, std::runtime_error
  /// when joining fails or is given up.
  virtual std::unique_ptr<device_group> join_group(const device_group_id& id, int rank, int size,
                                                   const group_give_up& give_up) {
    (void)id;
    (void)rank;
    (void)size;
    (void)give_up;
    throw tensor_error("the " + name() + " backend has no device collectives");
  }
};

/// The process-wide CPU backend (OpenBLAS GEMM, OpenMP loops).
Backend& cpu_backend();

/// Backends compiled into this binary ("cpu", "cuda").
std::vector<std::string> compiled_backends();

/// Number of CUDA devices visible (0 without the CUDA backend or a GPU).
int cuda_device_count();

/// The backend for `dev`; throws std::runtime_error with a clear message
/// when that backend is not compiled in or the device does not exist.
Backend& backend_for(device dev);

/// The error for CUDA device `dev` asked of a binary built without CUDA
/// (saying how to configure one with it).
std::runtime_error cuda_not_built(device dev);

/// How CUDA products of f32 operands use the tensor cores: f32 (full f32
/// arithmetic: the default, equal to the CPU reference at f32 tolerance),
/// tf32 (operands rounded to TF32's 10-bit significand) or bf16 (rounded to
/// bf16's 7-bit one); every variant accumulates in f32. Process-wide; 16-bit
/// operands and the CPU backend (always f32) ignore it.
enum class matmul_precision { f32, tf32, bf16 };
void set_matmul_precision(matmul_precision p);
matmul_precision get_matmul_precision();
/// "f32", "tf32", "bf16"; throws std::invalid_argument otherwise.
matmul_precision parse_matmul_precision(const std::string& text);
const char* matmul_precision_name(matmul_precision p);

/// Parses "cpu", "cuda", "cuda:N", or "auto" (cuda:0 when a CUDA device is
/// visible, else cpu); throws std::invalid_argument otherwise.
device parse_device(const std::string& text);

/// Threads the CPU backend uses (OpenMP), default = hardware concurrency.
int cpu_threads();
void set_cpu_threads(int n);

}  // namespace corolla
