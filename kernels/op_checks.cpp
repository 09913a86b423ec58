// kernels/op_checks.cpp — the argument checks shared by the backends.
#include "kernels/op_checks.hpp"

#include <cmath>
#include <string>

namespace corolla {

bool check_linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
                        const Tensor* residual, const Tensor& y, device where) {
  if (x.type() != dtype::f32 || w.type() != dtype::bf16 || x.rank() != 2 || w.rank() != 2) return false;
  const std::int64_t rows = x.dim(0), in = x.dim(1), rows_w = w.dim(0);
  if (rows < 1 || rows > 16 || in == 0) return false;
  const bool swiglu = e == linear_epilogue::swiglu;
  const char* what = e == linear_epilogue::add ? "linear_fused (add)"
                     : swiglu                  ? "linear_fused (swiglu)"
                                               : "linear_fused (gelu)";
  require_on(x, where, dtype::f32, {rows, in}, what);
  require_on(w, where, dtype::bf16, {rows_w, in}, what);
  require_condition(!swiglu || rows_w % 2 == 0, what, "a stacked gate/up weight has an even number of rows");
  require_condition(!swiglu || bias == nullptr, what, "swiglu takes no bias");
  require_condition((e == linear_epilogue::add) == (residual != nullptr), what,
                    "a residual is given with the add epilogue, and only then");
  const std::int64_t out = swiglu ? rows_w / 2 : rows_w;
  if (bias) require_on(*bias, where, dtype::f32, {out}, what);
  if (residual) require_on(*residual, where, dtype::f32, {rows, out}, what);
  require_on(y, where, dtype::f32, {rows, out}, what);
  return true;
}

namespace {

/// x [rows, in] and w [out, in], 2-D, of one float dtype shared by `out`
/// (the product's output), with no empty dimension.
bool same_dtype_product(const Tensor& x, const Tensor& w, const Tensor& out) {
  return x.defined() && w.defined() && out.defined() && x.rank() == 2 && w.rank() == 2 && is_float_dtype(x.type()) &&
         w.type() == x.type() && out.type() == x.type() && x.dim(0) > 0 && x.dim(1) > 0 && w.dim(0) > 0;
}

}  // namespace

bool check_linear_add_product(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual,
                              const Tensor& y, device where) {
  if (!same_dtype_product(x, w, y) || x.dim(0) <= 16 || (bias && bias->type() != x.type())) return false;
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  const char* what = "linear_fused (add)";
  require_on(x, where, x.type(), {rows, in}, what);
  require_on(w, where, x.type(), {out, in}, what);
  if (bias) require_on(*bias, where, x.type(), {out}, what);
  require_on(residual, where, x.type(), {rows, out}, what);
  require_on(y, where, x.type(), {rows, out}, what);
  return true;
}

bool check_linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& pre, const Tensor& y,
                       device where) {
  if (!same_dtype_product(x, w, y) || w.dim(0) % 8 != 0 || (bias && bias->type() != x.type())) return false;
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  const char* what = "linear_gelu";
  require_on(x, where, x.type(), {rows, in}, what);
  require_on(w, where, x.type(), {out, in}, what);
  if (bias) require_on(*bias, where, x.type(), {out}, what);
  require_on(pre, where, x.type(), {rows, out}, what);
  require_on(y, where, x.type(), {rows, out}, what);
  require_condition(pre.raw() != y.raw(), what, "pre and y must be separate tensors");
  return true;
}

bool check_gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dpre,
                              device where) {
  if (!same_dtype_product(dy, w, dpre) || w.dim(1) == 0 || w.dim(1) % 8 != 0) return false;
  const std::int64_t rows = dy.dim(0), out = dy.dim(1), in = w.dim(1);
  const char* what = "gemm_gelu_backward";
  require_on(dy, where, dy.type(), {rows, out}, what);
  require_on(w, where, dy.type(), {out, in}, what);
  require_on(pre, where, dy.type(), {rows, in}, what);
  require_on(dpre, where, dy.type(), {rows, in}, what);
  require_condition(dpre.raw() != pre.raw() && dpre.raw() != dy.raw(), what,
                    "dpre must be a tensor of its own (not dy or pre)");
  return true;
}

void require_residual_grad(const Tensor& dres, const Tensor& dx, device where, const char* what) {
  require_like_on(dres, where, dx.type(), dx, what);
  require_condition(dres.raw() != dx.raw(), what, "dx must be a tensor of its own (not dres)");
}

bool check_linear_rope_kv(const Tensor& x, const Tensor& w, const Tensor* bias, int hq, int hkv, int head_dim,
                          const rope_spec& spec, bool rotate, const Tensor& q, const void* k_out, const void* v_out,
                          device where) {
  if (x.type() != dtype::f32 || w.type() != dtype::bf16 || x.rank() != 2 || w.rank() != 2) return false;
  const std::int64_t in = x.dim(1);
  if (x.dim(0) != 1 || in == 0 || in % 8 != 0) return false;
  const char* what = "linear_rope_store_kv";
  require_condition(hq > 0 && hkv > 0, what, "head counts must be positive");
  require_condition(head_dim > 0 && head_dim % 2 == 0, what, "head_dim must be positive and even");
  require_condition(!rotate || spec.valid(), what, "theta and the scaling factors must be positive");
  const std::int64_t qw = std::int64_t{hq} * head_dim, kw = std::int64_t{hkv} * head_dim;
  require_on(x, where, dtype::f32, {1, in}, "linear_rope_store_kv x");
  require_on(w, where, dtype::bf16, {qw + 2 * kw, in}, "linear_rope_store_kv w");
  if (bias) require_on(*bias, where, dtype::f32, {qw + 2 * kw}, "linear_rope_store_kv bias");
  require_on(q, where, dtype::f32, {1, qw}, "linear_rope_store_kv q");
  if (k_out == nullptr || v_out == nullptr) throw tensor_error("linear_rope_store_kv: no destination rows");
  return true;
}

namespace {

[[noreturn]] void throw_shape(const Tensor& t, std::initializer_list<std::int64_t> dims,
                              const char* what) {
  expect_shape(t, shape_t(dims), what);  // throws: the shapes differ
  throw tensor_error(std::string(what) + ": shape mismatch");
}

}  // namespace

void require_on_device(const Tensor& t, device where, const char* what) {
  if (!t.defined()) throw tensor_error(std::string(what) + ": tensor is undefined");
  if (t.dev() == where) return;
  if (where.kind == device_kind::cpu)
    throw tensor_error(std::string(what) + ": the cpu backend needs a host tensor, got one on " +
                       t.dev().str());
  throw tensor_error(std::string(what) + ": the " + where.str() + " backend needs a tensor on " +
                     where.str() + ", got one on " + t.dev().str());
}

void require_on(const Tensor& t, device where, dtype type, const char* what) {
  require_on_device(t, where, what);
  if (t.type() != type) expect_dtype(t, type, what);
}

void require_on(const Tensor& t, device where, dtype type,
                std::initializer_list<std::int64_t> dims, const char* what) {
  require_on(t, where, type, what);
  const shape_t& s = t.shape();
  bool same = s.size() == dims.size();
  if (same) {
    std::size_t i = 0;
    for (std::int64_t d : dims) same = same && s[i++] == d;
  }
  if (!same) throw_shape(t, dims, what);
}

void require_like_on(const Tensor& t, device where, dtype type, const Tensor& like,
                     const char* what) {
  require_on(t, where, type, what);
  if (t.shape() != like.shape()) expect_shape(t, like.shape(), what);
}

void require_condition(bool ok, const char* what, const char* detail) {
  if (!ok) throw tensor_error(std::string(what) + ": " + detail);
}

void require_linear_weight(const Tensor& w, device where, dtype x_type, const char* what) {
  require_on_device(w, where, what);
  const bool ok = w.type() == x_type || (x_type == dtype::f32 && w.type() == dtype::bf16);
  if (!ok) {
    if (x_type == dtype::f32)
      throw tensor_error(std::string(what) + ": expected an f32 or bf16 weight, got " +
                         dtype_name(w.type()));
    expect_dtype(w, x_type, what);
  }
  require_condition(w.rank() == 2, what, "expected a 2-D [out, in] tensor");
}

void refuse_inference_weight(const Tensor& w, dtype x_type, const char* what) {
  if (w.defined() && w.type() == dtype::bf16 && x_type != dtype::bf16)
    throw tensor_error(std::string(what) +
                       ": bf16 weights are for inference; training keeps f32 weights");
}

void require_product_types(const Tensor& a, const char* a_what, const Tensor& b, const char* b_what, const Tensor& c,
                           const char* c_what) {
  if (a.type() != b.type())
    throw tensor_error(std::string(a_what) + " and " + b_what + " must have the same dtype, got " +
                       dtype_name(a.type()) + " and " + dtype_name(b.type()));
  if (c.type() != a.type() && c.type() != dtype::f32)
    throw tensor_error(std::string(c_what) + ": a product of " + dtype_name(a.type()) + " operands is written as " +
                       dtype_name(a.type()) + " or f32, not " + dtype_name(c.type()));
}

attention_geometry check_attention_geometry(const attention_shape& s, const char* what) {
  require_condition(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0, what,
                    "n_heads, n_kv_heads and head_dim must be positive");
  require_condition(s.n_heads % s.n_kv_heads == 0, what,
                    "n_heads must be a multiple of n_kv_heads (grouped-query attention)");
  attention_geometry g;
  g.hq = s.n_heads;
  g.hkv = s.n_kv_heads;
  g.dh = s.head_dim;
  g.group = g.hq / g.hkv;
  g.q_width = g.hq * g.dh;
  g.kv_width = g.hkv * g.dh;
  g.scale = s.scale != 0.0f ? s.scale : static_cast<float>(1.0 / std::sqrt(double(s.head_dim)));
  return g;
}

namespace {

struct matrix_shape {
  std::int64_t rows = 1, cols = 0;
};

matrix_shape as_matrix(const Tensor& t, const char* what) {
  require_condition(t.rank() >= 1, what, "gemm operands need at least one dimension");
  matrix_shape m;
  m.cols = t.dim(-1);
  for (int i = 0; i + 1 < t.rank(); ++i) m.rows *= t.dim(i);
  return m;
}

}  // namespace

gemm_dims check_gemm_shapes(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  const matrix_shape ad = as_matrix(a, "gemm a"), bd = as_matrix(b, "gemm b"), cd = as_matrix(c, "gemm c");
  gemm_dims d;
  d.m = trans_a ? ad.cols : ad.rows;
  d.k = trans_a ? ad.rows : ad.cols;
  const std::int64_t kb = trans_b ? bd.cols : bd.rows;
  d.n = trans_b ? bd.rows : bd.cols;
  if (d.k != kb || cd.rows != d.m || cd.cols != d.n)
    throw tensor_error("gemm: incompatible shapes: a " + shape_str(a.shape()) + (trans_a ? "^T" : "") + ", b " +
                       shape_str(b.shape()) + (trans_b ? "^T" : "") + ", c " + shape_str(c.shape()));
  return d;
}

std::int64_t check_kv_pages(const kv_pages_view& cache, std::int64_t start_pos, std::int64_t tq,
                            const char* what) {
  require_condition(start_pos >= 0, what, "start_pos must not be negative");
  require_condition(cache.page_tokens > 0, what, "cache page_tokens must be positive");
  require_condition(is_float_dtype(cache.type), what, "cache pages must be f32, bf16 or f16");
  require_condition(cache.length >= start_pos + tq, what,
                    "the cache must already hold keys and values up to start_pos + Tq");
  require_condition(cache.k_pages.size() == cache.v_pages.size(), what,
                    "the cache has different numbers of key and value pages");
  const std::int64_t needed = start_pos + tq;
  const std::int64_t pages = (needed + cache.page_tokens - 1) / cache.page_tokens;
  require_condition(static_cast<std::int64_t>(cache.k_pages.size()) >= pages, what,
                    "the cache has fewer pages than its length needs");
  for (std::int64_t p = 0; p < pages; ++p)
    require_condition(cache.k_pages[p] != nullptr && cache.v_pages[p] != nullptr, what,
                      "a cache page within the length is null");
  if (cache.device_pages != nullptr)
    require_condition(cache.page_stride >= 2 && cache.key_entry >= 0 && cache.key_entry + 1 < cache.page_stride,
                      what, "the cache's device page table needs a stride of at least 2 and its key entry within it");
  return pages;
}

void require_indices(const std::int32_t* idx, std::int64_t n, std::int64_t limit, const char* what) {
  for (std::int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= limit)
      throw tensor_error(std::string(what) + ": index " + std::to_string(idx[i]) + " at position " +
                         std::to_string(i) + " is outside [0, " + std::to_string(limit) + ")");
}

}  // namespace corolla
