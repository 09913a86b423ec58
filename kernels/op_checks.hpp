// kernels/op_checks.hpp — argument checks every backend's ops share: a tensor
// is defined, lives on the backend's device, has the expected dtype and
// shape; attention geometry is consistent. The checks allocate nothing
// unless they throw (the decode hot path calls them on every op).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/backend.hpp"
#include "kernels/tensor.hpp"

namespace corolla {

/// Throws tensor_error naming `what` unless `t` is defined and lives on
/// `where`. For the CPU the message says "the cpu backend needs a host
/// tensor, got one on cuda:0"; for a device it names both devices.
void require_on_device(const Tensor& t, device where, const char* what);
/// Same, and `t` has dtype `type` (any shape).
void require_on(const Tensor& t, device where, dtype type, const char* what);
/// Same, and `t` has exactly the shape `dims`.
void require_on(const Tensor& t, device where, dtype type,
                std::initializer_list<std::int64_t> dims, const char* what);
/// Same, with the expected shape taken from `like` (elementwise operands).
void require_like_on(const Tensor& t, device where, dtype type, const Tensor& like,
                     const char* what);
/// Throws tensor_error with `what` + ": " + `detail` when `ok` is false.
void require_condition(bool ok, const char* what, const char* detail);
/// Throws tensor_error naming `what`, the index and its position unless
/// every one of the `n` host indices `idx` lies in [0, limit).
void require_indices(const std::int32_t* idx, std::int64_t n, std::int64_t limit, const char* what);

/// linear's weight: defined, on `where`, 2-D, and of x's dtype `x_type` or,
/// for an f32 x, bf16 (an inference weight: half the bytes per token, see
/// Backend::linear). Throws tensor_error naming `what` otherwise (for an f32
/// x: "expected an f32 or bf16 weight, got f16"). The shape against x and y
/// is the caller's to check.
void require_linear_weight(const Tensor& w, device where, dtype x_type, const char* what);
/// For the ops that have no bf16-weight form (linear_backward): throws
/// tensor_error "<what>: bf16 weights are for inference; training keeps f32
/// weights" when `w` is bf16 and the activations (`x_type`) are not.
void refuse_inference_weight(const Tensor& w, dtype x_type, const char* what);

/// Backend::linear_fused's operands on a backend whose fused form takes an
/// f32 x of 1 to 16 rows with a bf16 w (CUDA's GEMV; the emulated device
/// mirrors it). Returns false when they are not that (the op is not taken:
/// the caller runs the two ops); else checks the rest and returns true, or
/// throws tensor_error: w [rows_w, in] (rows_w even for swiglu), bias f32
/// [out] (none for swiglu), a residual f32 [rows, out] with add and only
/// then, y f32 [rows, out], all on `where`; out = rows_w, or rows_w / 2.
bool check_linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
                        const Tensor* residual, const Tensor& y, device where);

/// The training products with a cuBLASLt epilogue (CUDA's
/// gemm_epilogues.cpp; the emulated device mirrors them). Each returns
/// false for operands it leaves to the caller, else checks the rest and
/// returns true, or throws tensor_error naming the op.
/// linear_fused's add through cuBLASLt: x [rows, in] and w [out, in] of one
/// float dtype, more than 16 rows (decode's rows stay with its own forms),
/// in and out non-zero, y of x's dtype, a bias (if any) of that dtype; then
/// y and the residual [rows, out] of that dtype.
bool check_linear_add_product(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual,
                              const Tensor& y, device where);
/// Backend::linear_gelu: x [rows, in] and w [out, in] of one float dtype,
/// y of that dtype, a bias (if any) of that dtype, rows, in and out
/// non-zero, out % 8 == 0 (cuBLASLt's aux matrix); then y and pre [rows,
/// out] of that dtype.
bool check_linear_gelu(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& pre, const Tensor& y,
                       device where);
/// Backend::gemm_gelu_backward: dy [rows, out] and w [out, in] of one float
/// dtype, dpre of that dtype, rows, in and out non-zero, in % 8 == 0; then
/// pre and dpre [rows, in] of that dtype.
bool check_gemm_gelu_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, const Tensor& dpre,
                              device where);

/// The residual's gradient of Backend::rmsnorm_backward_add and
/// layernorm_backward_add: on `where`, of dx's dtype and shape, and not dx
/// itself (the dx kernel reads it while writing dx). Throws tensor_error
/// naming `what` otherwise.
void require_residual_grad(const Tensor& dres, const Tensor& dx, device where, const char* what);

/// Backend::linear_rope_store_kv's operands on a backend whose fused form
/// takes one f32 row with a bf16 stacked q/k/v weight (CUDA's GEMV; the
/// emulated device mirrors it). Returns false when x is not one f32 row or
/// w not a 2-D bf16 weight with in % 8 == 0 (the op is not taken); else
/// checks the rest and returns true, or throws tensor_error: x [1, in], w
/// [hq*head_dim + 2*hkv*head_dim, in], bias f32 [that] when given, q f32
/// [1, hq*head_dim], all on `where`; positive head counts, an even
/// head_dim, a valid spec when rotating, destination rows given.
bool check_linear_rope_kv(const Tensor& x, const Tensor& w, const Tensor* bias, int hq, int hkv, int head_dim,
                          const rope_spec& spec, bool rotate, const Tensor& q, const void* k_out, const void* v_out,
                          device where);

/// The dtype rule of the device products (gemm, linear, linear_backward):
/// a and b share a dtype; the output c is f32 or that dtype (what cuBLASLt
/// offers with f32 compute). Throws tensor_error naming the operands.
void require_product_types(const Tensor& a, const char* a_what, const Tensor& b, const char* b_what, const Tensor& c,
                           const char* c_what);

/// The sizes of a product c[m, n] = op(a)[m, k] @ op(b)[k, n].
struct gemm_dims {
  std::int64_t m = 0, n = 0, k = 0;
};
/// Sees a, b and c as matrices (leading dimensions folded into rows) and
/// checks that they make a product with the given transpositions; throws
/// tensor_error ("gemm: incompatible shapes: a [..]^T, b [..], c [..]", or
/// an operand without dimensions) otherwise. Dtypes and devices are the
/// caller's to check.
gemm_dims check_gemm_shapes(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c);

/// Validated attention geometry (attention_shape with the defaults applied).
struct attention_geometry {
  std::int64_t hq = 0, hkv = 0, dh = 0;
  std::int64_t group = 0;  ///< query heads per key/value head
  std::int64_t q_width = 0, kv_width = 0;
  float scale = 0.0f;  ///< s.scale, or 1/sqrt(head_dim) when s.scale is 0
};

/// Checks heads and head_dim are positive and n_heads % n_kv_heads == 0;
/// throws tensor_error naming `what` otherwise.
attention_geometry check_attention_geometry(const attention_shape& s, const char* what);

/// Checks a paged cache view against Tq new rows starting at start_pos:
/// a float page type, positive page size, length covering start_pos + Tq, as many key as value
/// pages, enough pages and none null within the length. Returns the number
/// of pages the rows read.
std::int64_t check_kv_pages(const kv_pages_view& cache, std::int64_t start_pos, std::int64_t tq,
                            const char* what);

}  // namespace corolla
