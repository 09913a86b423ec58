// kernels/cuda/cuda_ops.cpp — every op of the CUDA backend except the
// products (gemm.cpp) and attention (cuda_attention_ops.cpp): the same argument checks as the CPU backend
// (kernels/op_checks.hpp), then one launcher per op from the family
// headers. Index tensors are validated on the host (cuda_backend.hpp says
// what that costs).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/op_args.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/loss_optim.hpp"
#include "kernels/cuda/norm.hpp"
#include "kernels/cuda/nf4.hpp"
#include "kernels/cuda/quant.hpp"
#include "kernels/cuda/rope.hpp"
#include "kernels/nf4.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {

// ---- embeddings ------------------------------------------------------------------

void cuda_backend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  if (!ids.defined()) throw tensor_error("embedding ids: tensor is undefined");
  if (ids.type() != dtype::i32) expect_dtype(ids, dtype::i32, "embedding ids");
  require_condition(ids.rank() == 1, "embedding ids", "expected a 1-D [N] tensor");
  const elem t = float_elem(table, dev(), "embedding table");
  require_condition(table.rank() == 2, "embedding table", "expected a 2-D [V, D] tensor");
  const std::int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  require_on(out, dev(), table.type(), {n, d}, "embedding out");
  device_guard guard(index_);
  const index_view id = indices(ids, n, slot_indices, "embedding ids");
  for (std::int64_t i = 0; i < n; ++i)
    if (id.host[i] < 0 || id.host[i] >= vocab)
      throw tensor_error("embedding: id " + std::to_string(id.host[i]) + " at position " +
                         std::to_string(i) + " is outside the table's [0, " +
                         std::to_string(vocab) + ")");
  embedding_forward(stream_, t, id.dev, table.raw(), out.raw(), n, d);
}

void cuda_backend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  if (!ids.defined()) throw tensor_error("embedding_backward ids: tensor is undefined");
  if (ids.type() != dtype::i32) expect_dtype(ids, dtype::i32, "embedding_backward ids");
  require_condition(ids.rank() == 1, "embedding_backward ids", "expected a 1-D [N] tensor");
  require_on(dtable, dev(), dtype::f32, "embedding_backward dtable");
  require_condition(dtable.rank() == 2, "embedding_backward dtable",
                    "expected a 2-D [V, D] tensor");
  const std::int64_t n = ids.dim(0), vocab = dtable.dim(0), d = dtable.dim(1);
  require_on(dout, dev(), dtype::f32, {n, d}, "embedding_backward dout");
  device_guard guard(index_);
  const index_view id = indices(ids, n, slot_indices, "embedding_backward ids");
  for (std::int64_t i = 0; i < n; ++i)
    if (id.host[i] < 0 || id.host[i] >= vocab)
      throw tensor_error("embedding_backward: id " + std::to_string(id.host[i]) +
                         " at position " + std::to_string(i) + " is outside the table's [0, " +
                         std::to_string(vocab) + ")");
  cuda::embedding_backward(stream_, id.dev, cf(dout), f(dtable), n, d);
}

// ---- normalisation ---------------------------------------------------------------

// Norms: activations f32, bf16 or f16 (x's dtype throughout); weights,
// statistics and parameter gradients f32.

void cuda_backend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  const elem t = float_elem(x, dev(), "rmsnorm x");
  require_condition(x.rank() == 2, "rmsnorm x", "expected a 2-D [rows, features] tensor");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require_on(w, dev(), dtype::f32, {d}, "rmsnorm w");
  require_on(y, dev(), x.type(), {n, d}, "rmsnorm y");
  if (rstd) require_on(*rstd, dev(), dtype::f32, {n}, "rmsnorm rstd");
  device_guard guard(index_);
  rmsnorm_forward(stream_, t, x.raw(), cf(w), eps, y.raw(), rstd ? f(*rstd) : nullptr, n, d);
}

void cuda_backend::add_rmsnorm(const Tensor& a, const Tensor& b, Tensor& sum, const Tensor& w, float eps,
                               Tensor& y) {
  const elem t = float_elem(a, dev(), "add_rmsnorm a");
  require_condition(a.rank() == 2, "add_rmsnorm a", "expected a 2-D [rows, features] tensor");
  const std::int64_t n = a.dim(0), d = a.dim(1);
  require_on(b, dev(), a.type(), {n, d}, "add_rmsnorm b");
  require_on(sum, dev(), a.type(), {n, d}, "add_rmsnorm sum");
  require_on(w, dev(), dtype::f32, {d}, "add_rmsnorm w");
  require_on(y, dev(), a.type(), {n, d}, "add_rmsnorm y");
  device_guard guard(index_);
  cuda::add_rmsnorm(stream_, t, a.raw(), b.raw(), sum.raw(), cf(w), eps, y.raw(), n, d);
}

void cuda_backend::rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                                    const Tensor& dy, Tensor& dx, Tensor& dw) {
  rmsnorm_backward_into(x, w, rstd, dy, nullptr, dx, dw);
}

void cuda_backend::rmsnorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                        const Tensor& dres, Tensor& dx, Tensor& dw) {
  rmsnorm_backward_into(x, w, rstd, dy, &dres, dx, dw);
}

void cuda_backend::rmsnorm_backward_into(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                                         const Tensor* dres, Tensor& dx, Tensor& dw) {
  const elem t = float_elem(x, dev(), "rmsnorm_backward x");
  require_condition(x.rank() == 2, "rmsnorm_backward x", "expected a 2-D [rows, features] tensor");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require_on(w, dev(), dtype::f32, {d}, "rmsnorm_backward w");
  require_on(rstd, dev(), dtype::f32, {n}, "rmsnorm_backward rstd");
  require_on(dy, dev(), x.type(), {n, d}, "rmsnorm_backward dy");
  require_on(dx, dev(), x.type(), {n, d}, "rmsnorm_backward dx");
  require_on(dw, dev(), dtype::f32, {d}, "rmsnorm_backward dw");
  if (dres) require_residual_grad(*dres, dx, dev(), "rmsnorm_backward_add dres");
  device_guard guard(index_);
  cuda::rmsnorm_backward(stream_, t, x.raw(), cf(w), cf(rstd), dy.raw(), dx.raw(), f(dw), n, d,
                         column_partials(n, d, 1), dres ? dres->raw() : nullptr);
}

void cuda_backend::layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps,
                             Tensor& y, Tensor* mean, Tensor* rstd) {
  const elem t = float_elem(x, dev(), "layernorm x");
  require_condition(x.rank() == 2, "layernorm x", "expected a 2-D [rows, features] tensor");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require_on(w, dev(), dtype::f32, {d}, "layernorm w");
  require_on(b, dev(), dtype::f32, {d}, "layernorm b");
  require_on(y, dev(), x.type(), {n, d}, "layernorm y");
  if (mean) require_on(*mean, dev(), dtype::f32, {n}, "layernorm mean");
  if (rstd) require_on(*rstd, dev(), dtype::f32, {n}, "layernorm rstd");
  device_guard guard(index_);
  layernorm_forward(stream_, t, x.raw(), cf(w), cf(b), eps, y.raw(), mean ? f(*mean) : nullptr,
                    rstd ? f(*rstd) : nullptr, n, d);
}

void cuda_backend::layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dy, Tensor& dx,
                                      Tensor& dw, Tensor& db) {
  layernorm_backward_into(x, w, mean, rstd, dy, nullptr, dx, dw, db);
}

void cuda_backend::layernorm_backward_add(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                          const Tensor& dy, const Tensor& dres, Tensor& dx, Tensor& dw, Tensor& db) {
  layernorm_backward_into(x, w, mean, rstd, dy, &dres, dx, dw, db);
}

void cuda_backend::layernorm_backward_into(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                           const Tensor& dy, const Tensor* dres, Tensor& dx, Tensor& dw,
                                           Tensor& db) {
  const elem t = float_elem(x, dev(), "layernorm_backward x");
  require_condition(x.rank() == 2, "layernorm_backward x",
                    "expected a 2-D [rows, features] tensor");
  const std::int64_t n = x.dim(0), d = x.dim(1);
  require_on(w, dev(), dtype::f32, {d}, "layernorm_backward w");
  require_on(mean, dev(), dtype::f32, {n}, "layernorm_backward mean");
  require_on(rstd, dev(), dtype::f32, {n}, "layernorm_backward rstd");
  require_on(dy, dev(), x.type(), {n, d}, "layernorm_backward dy");
  require_on(dx, dev(), x.type(), {n, d}, "layernorm_backward dx");
  require_on(dw, dev(), dtype::f32, {d}, "layernorm_backward dw");
  require_on(db, dev(), dtype::f32, {d}, "layernorm_backward db");
  if (dres) require_residual_grad(*dres, dx, dev(), "layernorm_backward_add dres");
  device_guard guard(index_);
  cuda::layernorm_backward(stream_, t, x.raw(), cf(w), cf(mean), cf(rstd), dy.raw(), dx.raw(), f(dw),
                           f(db), n, d, column_partials(n, d, 2), dres ? dres->raw() : nullptr);
}

// ---- rope ------------------------------------------------------------------------

void cuda_backend::rope(Tensor& x, const Tensor& positions, int n_heads, int head_dim,
                        const rope_spec& spec, bool inverse) {
  require_condition(n_heads > 0, "rope", "n_heads must be positive");
  require_condition(head_dim > 0 && head_dim % 2 == 0, "rope",
                    "head_dim must be positive and even");
  require_condition(spec.valid(), "rope", "theta and the scaling factors must be positive");
  const elem t = float_elem(x, dev(), "rope x");
  require_condition(x.rank() == 2, "rope x", "expected a 2-D [rows, heads * head_dim] tensor");
  const std::int64_t n = x.dim(0), width = std::int64_t{n_heads} * head_dim;
  require_on(x, dev(), x.type(), {n, width}, "rope x");
  device_guard guard(index_);
  const std::int32_t* pos = rope_positions(positions, n, "rope");
  if (n == 0) return;
  cuda::rope(stream_, t, x.raw(), pos, n, n_heads, head_dim, spec, inverse);
}

const std::int32_t* cuda_backend::rope_positions(const Tensor& positions, std::int64_t n, const char* what) {
  const std::string name(what);
  if (!positions.defined()) throw tensor_error(name + " positions: tensor is undefined");
  if (positions.type() != dtype::i32) expect_dtype(positions, dtype::i32, (name + " positions").c_str());
  const index_view p = indices(positions, n, slot_indices, (name + " positions").c_str());
  for (std::int64_t r = 0; r < n; ++r)
    if (p.host[r] < 0)
      throw tensor_error(name + ": negative position " + std::to_string(p.host[r]) + " at row " +
                         std::to_string(r));
  return p.dev;
}

void cuda_backend::rope_store_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq,
                                 int hkv, int head_dim, const rope_spec& spec, bool rotate, void* k_out, void* v_out,
                                 dtype cache_type) {
  require_condition(hq > 0 && hkv > 0, "rope_store_kv", "head counts must be positive");
  require_condition(head_dim > 0 && head_dim % 2 == 0, "rope_store_kv", "head_dim must be positive and even");
  require_condition(!rotate || spec.valid(), "rope_store_kv", "theta and the scaling factors must be positive");
  require_on(q, dev(), dtype::f32, "rope_store_kv q");
  require_condition(q.rank() == 2, "rope_store_kv q", "expected a 2-D [rows, heads * head_dim] tensor");
  const std::int64_t n = q.dim(0), qw = std::int64_t{hq} * head_dim, kw = std::int64_t{hkv} * head_dim;
  require_on(q, dev(), dtype::f32, {n, qw}, "rope_store_kv q");
  require_on(k, dev(), dtype::f32, {n, kw}, "rope_store_kv k");
  require_on(v, dev(), dtype::f32, {n, kw}, "rope_store_kv v");
  if (n > 0 && (k_out == nullptr || v_out == nullptr)) throw tensor_error("rope_store_kv: no destination rows");
  const cuda::elem cache = elem_of(cache_type, "rope_store_kv cache rows");
  device_guard guard(index_);
  const std::int32_t* pos = rotate ? rope_positions(positions, n, "rope_store_kv") : nullptr;
  cuda::rope_store_kv(stream_, f(q), cf(k), cf(v), pos, n, hq, hkv, head_dim, spec, rotate, cache, k_out, v_out);
}

void cuda_backend::rope_store_kv_pages(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, int hq,
                                       int hkv, int head_dim, std::span<const kv_pages_view> caches,
                                       std::span<const std::int64_t> start_pos, const rope_spec& spec, bool rotate) {
  const char* what = "rope_store_kv_pages";
  require_condition(hq > 0 && hkv > 0, what, "head counts must be positive");
  require_condition(head_dim > 0 && head_dim % 2 == 0, what, "head_dim must be positive and even");
  require_condition(!rotate || spec.valid(), what, "theta and the scaling factors must be positive");
  require_condition(start_pos.size() == caches.size(), what, "one position per cache");
  const auto n = static_cast<std::int64_t>(caches.size());
  const std::int64_t qw = std::int64_t{hq} * head_dim, kw = std::int64_t{hkv} * head_dim;
  require_on(q, dev(), dtype::f32, {n, qw}, "rope_store_kv_pages q");
  require_on(k, dev(), dtype::f32, {n, kw}, "rope_store_kv_pages k");
  require_on(v, dev(), dtype::f32, {n, kw}, "rope_store_kv_pages v");
  if (n == 0) return;
  for (std::size_t i = 0; i < caches.size(); ++i) {
    kv_page_row(caches[i], start_pos[i], kw, what);  // throws for a position the cache does not hold
    require_condition(caches[i].type == caches[0].type && caches[i].page_tokens == caches[0].page_tokens, what,
                      "every cache of a batch has the same element type and page size");
  }
  const cuda::elem cache = elem_of(caches[0].type, "rope_store_kv_pages cache rows");
  device_guard guard(index_);
  const std::int32_t* pos = rotate ? rope_positions(positions, n, what) : nullptr;
  cuda::batch_page_tables t;
  if (device_page_rows(caches, start_pos, what, t)) {
    cuda::rope_store_kv_pages(stream_, f(q), cf(k), cf(v), pos, n, hq, hkv, head_dim, spec, rotate, cache, t,
                              caches[0].page_tokens);
    return;
  }
  require_device_page(caches[0].k_pages[0], what);
  // One upload of the destinations: the key rows, then the value rows.
  host_batch_.resize(static_cast<std::size_t>(2 * n) * sizeof(void*));
  auto* rows = reinterpret_cast<void**>(host_batch_.data());
  for (std::int64_t i = 0; i < n; ++i)
    std::tie(rows[i], rows[n + i]) =
        kv_page_row(caches[static_cast<std::size_t>(i)], start_pos[static_cast<std::size_t>(i)], kw, what);
  auto* table = static_cast<void**>(scratch(slot_rows, host_batch_.size()));
  upload(table, host_batch_.data(), host_batch_.size());
  cuda::rope_store_kv_rows(stream_, f(q), cf(k), cf(v), pos, n, hq, hkv, head_dim, spec, rotate, cache, table,
                           table + n);
}

// ---- activations and elementwise -------------------------------------------------

void cuda_backend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const elem t = float_elem(gate, dev(), "swiglu gate");
  require_like_on(up, dev(), gate.type(), gate, "swiglu up");
  require_like_on(out, dev(), gate.type(), gate, "swiglu out");
  device_guard guard(index_);
  swiglu_forward(stream_, t, gate.raw(), up.raw(), out.raw(), gate.numel());
}

void cuda_backend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                   Tensor& dgate, Tensor& dup) {
  const elem t = float_elem(gate, dev(), "swiglu_backward gate");
  require_like_on(up, dev(), gate.type(), gate, "swiglu_backward up");
  require_like_on(dout, dev(), gate.type(), gate, "swiglu_backward dout");
  require_like_on(dgate, dev(), gate.type(), gate, "swiglu_backward dgate");
  require_like_on(dup, dev(), gate.type(), gate, "swiglu_backward dup");
  device_guard guard(index_);
  cuda::swiglu_backward(stream_, t, gate.raw(), up.raw(), dout.raw(), dgate.raw(), dup.raw(),
                        gate.numel());
}

void cuda_backend::gelu(const Tensor& x, Tensor& y) {
  const elem t = float_elem(x, dev(), "gelu x");
  require_like_on(y, dev(), x.type(), x, "gelu y");
  device_guard guard(index_);
  gelu_forward(stream_, t, x.raw(), y.raw(), x.numel());
}

void cuda_backend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const elem t = float_elem(x, dev(), "gelu_backward x");
  require_like_on(dy, dev(), x.type(), x, "gelu_backward dy");
  require_like_on(dx, dev(), x.type(), x, "gelu_backward dx");
  device_guard guard(index_);
  cuda::gelu_backward(stream_, t, x.raw(), dy.raw(), dx.raw(), x.numel());
}

void cuda_backend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const elem t = float_elem(a, dev(), "add a");
  require_like_on(b, dev(), a.type(), a, "add b");
  require_like_on(out, dev(), a.type(), a, "add out");
  device_guard guard(index_);
  cuda::add(stream_, t, a.raw(), b.raw(), out.raw(), a.numel());
}

void cuda_backend::scale(Tensor& y, float alpha) {
  const elem t = float_elem(y, dev(), "scale y");
  device_guard guard(index_);
  cuda::scale(stream_, t, y.raw(), alpha, y.numel());
}

double cuda_backend::sum_squares(const Tensor& x) {
  const elem t = float_elem(x, dev(), "sum_squares x");
  device_guard guard(index_);
  const std::int64_t blocks = sum_squares_blocks(x.numel());
  auto* partials = static_cast<double*>(
      scratch(slot_reduce, static_cast<std::size_t>(blocks + 1) * sizeof(double)));
  double* result = partials + blocks;
  cuda::sum_squares(stream_, t, x.raw(), x.numel(), partials, result);
  double host = 0.0;
  COROLLA_CUDA_CHECK(
      cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, stream_));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host;
}

// ---- loss ------------------------------------------------------------------------

void cuda_backend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                                 Tensor* dlogits, float grad_scale) {
  const elem t = float_elem(logits, dev(), "cross_entropy logits");
  require_condition(logits.rank() == 2, "cross_entropy logits", "expected a 2-D [N, V] tensor");
  const std::int64_t n = logits.dim(0), vocab = logits.dim(1);
  if (!targets.defined()) throw tensor_error("cross_entropy targets: tensor is undefined");
  if (targets.type() != dtype::i32) expect_dtype(targets, dtype::i32, "cross_entropy targets");
  require_on(losses, dev(), dtype::f32, {n}, "cross_entropy losses");
  if (dlogits) require_on(*dlogits, dev(), logits.type(), {n, vocab}, "cross_entropy dlogits");
  device_guard guard(index_);
  const index_view tp = indices(targets, n, slot_indices, "cross_entropy targets");
  for (std::int64_t r = 0; r < n; ++r)
    if (tp.host[r] != -1 && (tp.host[r] < 0 || tp.host[r] >= vocab))
      throw tensor_error("cross_entropy: target " + std::to_string(tp.host[r]) + " at row " +
                         std::to_string(r) + " is outside [0, " + std::to_string(vocab) +
                         ") and is not -1 (ignored)");
  cuda::cross_entropy(stream_, t, logits.raw(), tp.dev, f(losses), dlogits ? dlogits->raw() : nullptr,
                      grad_scale, n, vocab);
}

// ---- optimiser -------------------------------------------------------------------

namespace {

/// adamw's and adamw_with_copy's operands: f32 on `where`, of one size.
void require_adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v, std::int64_t step,
                   device where) {
  require_on(params, where, dtype::f32, "adamw params");
  require_on(grads, where, dtype::f32, "adamw grads");
  require_on(m, where, dtype::f32, "adamw m");
  require_on(v, where, dtype::f32, "adamw v");
  const std::int64_t n = params.numel();
  require_condition(grads.numel() == n && m.numel() == n && v.numel() == n, "adamw",
                    "params, grads, m and v must have the same number of elements");
  require_condition(step >= 1, "adamw", "step counts from 1");
}

}  // namespace

void cuda_backend::adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                         const adamw_params& p, std::int64_t step) {
  require_adamw(params, grads, m, v, step, dev());
  const adamw_step_scalars k = adamw_scalars_for(p, step);  // the CPU backend's scalars
  device_guard guard(index_);
  cuda::adamw(stream_, f(params), cf(grads), f(m), f(v), k, params.numel());
}

void cuda_backend::adamw_with_copy(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, const adamw_params& p,
                                   std::int64_t step, Tensor& compute_copy) {
  require_adamw(params, grads, m, v, step, dev());
  require_on_device(compute_copy, dev(), "adamw_with_copy copy");
  require_condition(compute_copy.type() == dtype::bf16 || compute_copy.type() == dtype::f16, "adamw_with_copy",
                    "the copy is bf16 or f16");
  require_condition(compute_copy.numel() == params.numel(), "adamw_with_copy",
                    "the copy has as many elements as the parameters");
  const adamw_step_scalars k = adamw_scalars_for(p, step);
  device_guard guard(index_);
  cuda::adamw_with_copy(stream_, f(params), cf(grads), f(m), f(v), elem_of(compute_copy.type(), "adamw_with_copy"),
                        compute_copy.raw(), k, params.numel());
}

// ---- wire compression ------------------------------------------------------------

void cuda_backend::quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) {
  require_condition(block > 0, "quantize_int8", "block must be positive");
  require_on(x, dev(), dtype::f32, "quantize_int8 x");
  require_like_on(q, dev(), dtype::i8, x, "quantize_int8 q");
  const std::int64_t n = x.numel(), blocks = (n + block - 1) / block;
  require_on(scales, dev(), dtype::f32, {blocks}, "quantize_int8 scales");
  device_guard guard(index_);
  cuda::quantize_int8(stream_, cf(x), n, block, static_cast<std::int8_t*>(q.raw()), f(scales));
}

void cuda_backend::dequantize_int8(const Tensor& q, const Tensor& scales, int block, Tensor& x) {
  require_condition(block > 0, "dequantize_int8", "block must be positive");
  require_on(q, dev(), dtype::i8, "dequantize_int8 q");
  require_like_on(x, dev(), dtype::f32, q, "dequantize_int8 x");
  const std::int64_t n = q.numel(), blocks = (n + block - 1) / block;
  require_on(scales, dev(), dtype::f32, {blocks}, "dequantize_int8 scales");
  device_guard guard(index_);
  cuda::dequantize_int8(stream_, static_cast<const std::int8_t*>(q.raw()), cf(scales), n, block,
                        f(x));
}

// ---- 4-bit inference weights -----------------------------------------------------

void cuda_backend::quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) {
  require_on(w, dev(), dtype::f32, "quantize_nf4 w");
  require_condition(w.rank() == 2, "quantize_nf4 w", "expected a 2-D [out, in] tensor");
  const std::int64_t out = w.dim(0), in = w.dim(1);
  require_on(q, dev(), dtype::i8, {out, nf4_row_bytes(in)}, "quantize_nf4 q");
  require_on(absmax, dev(), dtype::f32, {out, nf4_row_blocks(in)}, "quantize_nf4 absmax");
  if (out == 0 || in == 0) return;
  device_guard guard(index_);
  cuda::quantize_nf4(stream_, cf(w), out, in, static_cast<std::uint8_t*>(q.raw()), f(absmax));
}

void cuda_backend::dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) {
  require_on(w, dev(), dtype::f32, "dequantize_nf4 w");
  require_condition(w.rank() == 2, "dequantize_nf4 w", "expected a 2-D [out, in] tensor");
  const std::int64_t out = w.dim(0), in = w.dim(1);
  require_on(q, dev(), dtype::i8, {out, nf4_row_bytes(in)}, "dequantize_nf4 q");
  require_on(absmax, dev(), dtype::f32, {out, nf4_row_blocks(in)}, "dequantize_nf4 absmax");
  if (out == 0 || in == 0) return;
  device_guard guard(index_);
  cuda::dequantize_nf4(stream_, static_cast<const std::uint8_t*>(q.raw()), cf(absmax), out, in, f(w));
}

}  // namespace corolla::cuda
