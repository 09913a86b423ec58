// kernels/cuda/gemm.cpp — gemm, linear and linear_backward through cuBLASLt
// (each product one cuda_backend::lt_matmul: lt_matmul.cpp, with the
// row-major convention, the precision and the algorithm choice).
//
// linear's bias goes through CUBLASLT_EPILOGUE_BIAS when its dtype equals
// y's (the bias vector runs along cuBLAS's m = out, broadcast over rows);
// otherwise it is broadcast into y first and the product added with beta 1.
// db is a column-sum kernel (elementwise.cu), dw a beta = 1 product.
// Training's fused products (the residual as C, GELU_AUX, DGELU) are in
// gemm_epilogues.cpp, through lt_matmul's lt_extra.
//
// linear with f32 x and a bf16 weight (inference: half the bytes per token)
// is no cuBLASLt product (its operands share a dtype) but the GEMV-style
// kernel of linear_bf16.cu, bias fused; linear_backward refuses it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/linear_bf16.hpp"
#include "kernels/cuda/linear_q8.hpp"
#include "kernels/cuda/nf4.hpp"
#include "kernels/cuda/quant.hpp"
#include "kernels/nf4.hpp"
#include "kernels/op_checks.hpp"

namespace corolla::cuda {
namespace {

/// linear with a bf16 weight: up to this many rows the GEMV kernel reads the
/// weight once per 8 rows; above, it is widened to f32 and cuBLASLt runs.
constexpr std::int64_t widen_above_rows = 16;
/// The widened slice of the weight: at most 64 MiB of f32.
constexpr std::int64_t widen_scratch_floats = std::int64_t{16} << 20;

/// Throws unless `t` is defined, on `where`, and of a float dtype.
void require_float(const Tensor& t, device where, const char* what) {
  require_on_device(t, where, what);
  if (!is_float_dtype(t.type()))
    throw tensor_error(std::string(what) + ": expected f32, bf16 or f16, got " +
                       dtype_name(t.type()));
}

/// c = beta * c over n elements without reading c when beta is 0.
void scale_or_zero(stream_t s, void* c, dtype ct, std::int64_t n, float beta) {
  if (beta == 0.0f)
    COROLLA_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<std::size_t>(n) * dtype_size(ct), s));
  else if (beta != 1.0f)
    scale(s, elem_of(ct, "gemm c"), c, beta, n);
}

}  // namespace

void cuda_backend::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                        float alpha, float beta) {
  require_float(a, dev(), "gemm a");
  require_float(b, dev(), "gemm b");
  require_float(c, dev(), "gemm c");
  require_product_types(a, "gemm a", b, "gemm b", c, "gemm c");
  const auto [m, n, k] = check_gemm_shapes(a, trans_a, b, trans_b, c);
  if (m == 0 || n == 0) return;
  device_guard guard(index_);
  if (k == 0) {  // empty sum: c = beta * c
    scale_or_zero(stream_, c.raw(), c.type(), m * n, beta);
    return;
  }
  lt_matmul(trans_a, trans_b, m, n, k, alpha, a.raw(), a.type(), a.dim(-1), b.raw(), b.type(),
            b.dim(-1), beta, c.raw(), c.type(), n);
}

namespace {

/// y [rows, out] (f32) = the f32 bias broadcast over the rows, or 0: a
/// product over an empty input width.
void fill_bias_rows(stream_t s, const Tensor* bias, Tensor& y, std::int64_t rows, std::int64_t out) {
  if (bias)
    broadcast_rows(s, bias->raw(), elem::f32, y.raw(), elem::f32, rows, out);
  else
    COROLLA_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), s));
}

}  // namespace

void cuda_backend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  require_float(x, dev(), "linear x");
  require_condition(x.rank() == 2, "linear x", "expected a 2-D [rows, in] tensor");
  require_linear_weight(w, dev(), x.type(), "linear w");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  require_on(w, dev(), w.type(), {out, in}, "linear w");
  if (bias) {
    require_float(*bias, dev(), "linear bias");
    require_on(*bias, dev(), bias->type(), {out}, "linear bias");
  }
  require_float(y, dev(), "linear y");
  require_on(y, dev(), y.type(), {rows, out}, "linear y");
  if (x.type() == dtype::f32 && w.type() == dtype::bf16) {  // an inference weight
    require_on(y, dev(), dtype::f32, {rows, out}, "linear y");
    if (bias) require_on(*bias, dev(), dtype::f32, {out}, "linear bias");
    if (rows == 0 || out == 0) return;
    device_guard guard(index_);
    if (in == 0) {
      fill_bias_rows(stream_, bias, y, rows, out);
      return;
    }
    if (rows <= widen_above_rows) {
      linear_bf16_weight(stream_, x.data<float>(), rows, in, w.raw(), out,
                         bias ? bias->data<float>() : nullptr, y.data<float>());
      return;
    }
    // Many rows (prefill): the GEMV kernel would re-read the weight every 8
    // rows. Widen it to f32 a slice of output features at a time (exact:
    // a bf16 is the top half of an f32) and multiply with cuBLASLt in f32,
    // as the CPU backend does above 16 rows.
    const std::int64_t slice =
        std::max<std::int64_t>(1, std::min<std::int64_t>(out, widen_scratch_floats / in));
    auto* wide = static_cast<float*>(
        scratch(slot_widen, static_cast<std::size_t>(slice * in) * sizeof(float)));
    const auto* w16 = static_cast<const std::uint16_t*>(w.raw());
    for (std::int64_t o0 = 0; o0 < out; o0 += slice) {
      const std::int64_t n = std::min(slice, out - o0);
      convert(stream_, w16 + o0 * in, elem::bf16, wide, elem::f32, n * in);
      // Untimed: a prompt's length is a new problem for each prompt.
      lt_extra extra = bias_epilogue(bias ? bias->data<float>() + o0 : nullptr);
      extra.tune = false;
      lt_matmul(false, true, rows, n, in, 1.0f, x.raw(), dtype::f32, in, wide, dtype::f32, in, 0.0f,
                y.data<float>() + o0, dtype::f32, out, extra);
    }
    return;
  }
  require_product_types(x, "linear x", w, "linear w", y, "linear y");
  if (rows == 0 || out == 0) return;
  device_guard guard(index_);
  const bool epilogue = bias && bias->type() == y.type();
  float beta = 0.0f;
  const auto broadcast_bias = [&] {
    broadcast_rows(stream_, bias->raw(), elem_of(bias->type(), "linear bias"), y.raw(), elem_of(y.type(), "linear y"),
                   rows, out);
  };
  if (bias && !epilogue) {  // y starts as the bias broadcast over rows
    broadcast_bias();
    beta = 1.0f;
  }
  if (in == 0) {
    if (epilogue)
      broadcast_bias();
    else if (!bias)
      COROLLA_CUDA_CHECK(cudaMemsetAsync(y.raw(), 0, y.nbytes(), stream_));
    return;
  }
  lt_matmul(false, true, rows, out, in, 1.0f, x.raw(), x.type(), in, w.raw(), w.type(), in, beta, y.raw(), y.type(),
            out, bias_epilogue(epilogue ? bias->raw() : nullptr));
}

bool cuda_backend::linear_fused(const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
                                const Tensor* residual, Tensor& y) {
  // Decode's case: f32 rows with a bf16 weight, few enough rows for the
  // GEMV (linear's own path for them), a non-empty product. Training's:
  // the residual add of a product of many rows (gemm_epilogues.cpp).
  if (!check_linear_fused(x, w, bias, e, residual, y, dev()))
    return e == linear_epilogue::add && residual && linear_add_lt(x, w, bias, *residual, y);
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = y.dim(1);
  device_guard guard(index_);
  const gemv_epilogue epilogue = e == linear_epilogue::add    ? gemv_epilogue::residual
                                 : e == linear_epilogue::gelu ? gemv_epilogue::gelu
                                                              : gemv_epilogue::swiglu;
  linear_bf16_weight(stream_, x.data<float>(), rows, in, w.raw(), out, bias ? bias->data<float>() : nullptr,
                     y.data<float>(), epilogue, residual ? residual->data<float>() : nullptr);
  return true;
}

bool cuda_backend::linear_rope_store_kv(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& positions,
                                        int hq, int hkv, int head_dim, const rope_spec& spec, bool rotate, Tensor& q,
                                        void* k_out, void* v_out, dtype cache_type) {
  // Decode's one row with the stacked bf16 weight, on the 16-byte path;
  // COROLLA_CUDA_QKV_EPILOGUE=0 leaves every step to the two ops (for
  // measuring the fusion, or ruling it out).
  static const bool enabled = env_switch("COROLLA_CUDA_QKV_EPILOGUE", true);
  if (!enabled) return false;
  if (!check_linear_rope_kv(x, w, bias, hq, hkv, head_dim, spec, rotate, q, k_out, v_out, dev())) return false;
  if (alignment_of(x.raw()) < 16 || alignment_of(w.raw()) < 16) return false;
  const cuda::elem cache = elem_of(cache_type, "linear_rope_store_kv cache rows");
  device_guard guard(index_);
  const std::int32_t* pos = rotate ? rope_positions(positions, 1, "linear_rope_store_kv") : nullptr;
  linear_bf16_rope_kv(stream_, x.data<float>(), x.dim(1), w.raw(), bias ? bias->data<float>() : nullptr,
                      q.data<float>(), pos, hq, hkv, head_dim, spec, rotate, cache, k_out, v_out);
  return true;
}

void cuda_backend::linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias, Tensor& y) {
  require_on(x, dev(), dtype::f32, "linear_q8 x");
  require_condition(x.rank() == 2, "linear_q8 x", "expected a 2-D [rows, in] tensor");
  require_on(q, dev(), dtype::i8, "linear_q8 q");
  require_condition(q.rank() == 2, "linear_q8 q", "expected a 2-D [out, in] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = q.dim(0);
  require_on(q, dev(), dtype::i8, {out, in}, "linear_q8 q");
  require_on(scale, dev(), dtype::f32, {out}, "linear_q8 scale");
  if (bias) require_on(*bias, dev(), dtype::f32, {out}, "linear_q8 bias");
  require_on(y, dev(), dtype::f32, {rows, out}, "linear_q8 y");
  if (rows == 0 || out == 0) return;
  device_guard guard(index_);
  if (in == 0) {
    fill_bias_rows(stream_, bias, y, rows, out);
    return;
  }
  if (rows > gemv_rows) {  // prefill: widen the weight once and run the f32 GEMM
    Tensor w = empty({out, in});
    cuda::dequantize_int8(stream_, q.data<std::int8_t>(), scale.data<float>(), out * in, static_cast<int>(in),
                          w.data<float>());
    linear(x, w, bias, y);
    return;
  }
  // Decode: the GEMV reads each int8 weight once for up to 8 rows.
  cuda::linear_q8(stream_, x.data<float>(), rows, in, q.data<std::int8_t>(), scale.data<float>(),
                  bias ? bias->data<float>() : nullptr, out, y.data<float>());
}

void cuda_backend::linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias,
                              Tensor& y) {
  require_on(x, dev(), dtype::f32, "linear_nf4 x");
  require_condition(x.rank() == 2, "linear_nf4 x", "expected a 2-D [rows, in] tensor");
  require_on(q, dev(), dtype::i8, "linear_nf4 q");
  require_condition(q.rank() == 2, "linear_nf4 q", "expected a 2-D [out, in / 2] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = q.dim(0);
  require_on(q, dev(), dtype::i8, {out, nf4_row_bytes(in)}, "linear_nf4 q");
  require_on(absmax, dev(), dtype::f32, {out, nf4_row_blocks(in)}, "linear_nf4 absmax");
  if (bias) require_on(*bias, dev(), dtype::f32, {out}, "linear_nf4 bias");
  require_on(y, dev(), dtype::f32, {rows, out}, "linear_nf4 y");
  if (rows == 0 || out == 0) return;
  device_guard guard(index_);
  if (in == 0) {
    fill_bias_rows(stream_, bias, y, rows, out);
    return;
  }
  const auto* packed = static_cast<const std::uint8_t*>(q.raw());
  if (rows > gemv_rows) {  // prefill: dequantise once and run the f32 GEMM
    Tensor w = empty({out, in});
    cuda::dequantize_nf4(stream_, packed, absmax.data<float>(), out, in, w.data<float>());
    linear(x, w, bias, y);
    return;
  }
  cuda::linear_nf4(stream_, x.data<float>(), rows, in, packed, absmax.data<float>(),
                   bias ? bias->data<float>() : nullptr, out, y.data<float>());
}

void cuda_backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                   Tensor* dx, Tensor& dw, Tensor* db) {
  require_float(x, dev(), "linear_backward x");
  require_condition(x.rank() == 2, "linear_backward x", "expected a 2-D [rows, in] tensor");
  refuse_inference_weight(w, x.type(), "linear_backward w");
  require_float(w, dev(), "linear_backward w");
  require_condition(w.rank() == 2, "linear_backward w", "expected a 2-D [out, in] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  require_on(w, dev(), x.type(), {out, in}, "linear_backward w");
  require_on(dy, dev(), x.type(), {rows, out}, "linear_backward dy");
  if (dx) {
    require_float(*dx, dev(), "linear_backward dx");
    require_on(*dx, dev(), dx->type(), {rows, in}, "linear_backward dx");
    require_product_types(dy, "linear_backward dy", w, "linear_backward w", *dx,
                          "linear_backward dx");
  }
  require_float(dw, dev(), "linear_backward dw");
  require_on(dw, dev(), dw.type(), {out, in}, "linear_backward dw");
  require_product_types(dy, "linear_backward dy", x, "linear_backward x", dw,
                        "linear_backward dw");
  if (db) {
    require_float(*db, dev(), "linear_backward db");
    require_on(*db, dev(), db->type(), {out}, "linear_backward db");
  }
  device_guard guard(index_);
  if (dx && rows > 0 && in > 0) {
    if (out == 0)
      COROLLA_CUDA_CHECK(cudaMemsetAsync(dx->raw(), 0, dx->nbytes(), stream_));
    else  // dx[rows,in] = dy[rows,out] @ w[out,in]
      lt_matmul(false, false, rows, in, out, 1.0f, dy.raw(), dy.type(), out, w.raw(), w.type(),
                in, 0.0f, dx->raw(), dx->type(), in);
  }
  if (rows > 0 && out > 0 && in > 0)  // dw[out,in] += dy^T[out,rows] @ x[rows,in]
    lt_matmul(true, false, out, in, rows, 1.0f, dy.raw(), dy.type(), out, x.raw(), x.type(), in,
              1.0f, dw.raw(), dw.type(), in);
  if (db && rows > 0 && out > 0)
    column_sum_accumulate(stream_, dy.raw(), elem_of(dy.type(), "linear_backward dy"), rows, out, db->raw(),
                          elem_of(db->type(), "linear_backward db"), column_partials(rows, out, 1));
}

}  // namespace corolla::cuda
