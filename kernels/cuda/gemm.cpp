// kernels/cuda/gemm.cpp — gemm, linear and linear_backward through cuBLASLt.
//
// Row-major <-> column-major: cuBLAS sees a row-major [r, c] buffer as the
// column-major c x r matrix (its transpose). So row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T: cuBLAS's "A" is our b
// (op = trans_b), its "B" our a (op = trans_a), its m x n our n x m. Each
// layout describes the stored buffer: rows = the buffer's row length,
// cols = its row count, ld = its row stride.
//
// Precision: CUBLAS_COMPUTE_32F with f32 scale for every dtype (no TF32, so
// f32 products match the CPU reference at f32 tolerance); bf16/f16 inputs
// accumulate in f32. The output may be f32 or the inputs' 16-bit dtype.
// set_matmul_precision(tf32 | bf16) lets f32 products run on the tensor
// cores (CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16BF: operands rounded, f32
// accumulation), for training speed at that precision.
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
//
// The descriptors are rebuilt per call (microseconds); the heuristic's
// choice is cached per problem shape, dtypes and pointer alignments.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

cudaDataType_t cuda_type(dtype t) {
  switch (t) {
    case dtype::f32: return CUDA_R_32F;
    case dtype::bf16: return CUDA_R_16BF;
    case dtype::f16: return CUDA_R_16F;
    default: throw tensor_error(std::string("gemm: no cuBLAS type for ") + dtype_name(t));
  }
}

/// Throws unless `t` is defined, on `where`, and of a float dtype.
void require_float(const Tensor& t, device where, const char* what) {
  require_on_device(t, where, what);
  if (!is_float_dtype(t.type()))
    throw tensor_error(std::string(what) + ": expected f32, bf16 or f16, got " +
                       dtype_name(t.type()));
}

/// Largest power of two (up to 256) dividing the address.
std::uint32_t alignment_of(const void* p) {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && (v & (2 * a - 1)) == 0) a *= 2;
  return a;
}

// RAII owners of the cuBLASLt descriptors (destroy statuses are ignored:
// nothing useful can be done with them in a destructor).
struct matmul_desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~matmul_desc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct layout_desc {
  cublasLtMatrixLayout_t d = nullptr;
  ~layout_desc() {
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};
struct preference_desc {
  cublasLtMatmulPreference_t d = nullptr;
  ~preference_desc() {
    if (d) cublasLtMatmulPreferenceDestroy(d);
  }
};


/// c = beta * c over n elements without reading c when beta is 0.
void scale_or_zero(stream_t s, void* c, dtype ct, std::int64_t n, float beta) {
  if (beta == 0.0f)
    COROLLA_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<std::size_t>(n) * dtype_size(ct), s));
  else if (beta != 1.0f)
    scale(s, elem_of(ct, "gemm c"), c, beta, n);
}

cublasLtEpilogue_t lt_epilogue_of(lt_epilogue e) {
  using E = lt_epilogue;
  switch (e) {
    case E::bias: return CUBLASLT_EPILOGUE_BIAS;
    case E::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case E::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case E::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case E::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* lt_epilogue_name(lt_epilogue e) {
  using E = lt_epilogue;
  switch (e) {
    case E::bias: return ", bias epilogue";
    case E::gelu_aux: return ", GELU_AUX epilogue";
    case E::gelu_aux_bias: return ", GELU_AUX_BIAS epilogue";
    case E::dgelu: return ", DGELU epilogue";
    case E::none: break;
  }
  return "";
}

}  // namespace

bool cuda_backend::lt_matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                             const void* a, dtype at, std::int64_t lda, const void* b, dtype bt, std::int64_t ldb,
                             float beta, void* c, dtype ct, std::int64_t ldc, const lt_extra& extra) {
  ensure_lt_workspace();
  matmul_desc op;
  // f32 operands may use the tensor cores at a lower input precision.
  const matmul_precision precision =
      at == dtype::f32 && bt == dtype::f32 ? get_matmul_precision() : matmul_precision::f32;
  const cublasComputeType_t compute = precision == matmul_precision::tf32   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : precision == matmul_precision::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                            : CUBLAS_COMPUTE_32F;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.d, compute, CUDA_R_32F));
  // cuBLAS "A" = our b, "B" = our a (see the file comment).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                      sizeof op_a));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                      sizeof op_b));
  if (extra.epilogue != lt_epilogue::none) {
    const cublasLtEpilogue_t epilogue = lt_epilogue_of(extra.epilogue);
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof epilogue));
  }
  if (extra.epilogue == lt_epilogue::bias || extra.epilogue == lt_epilogue::gelu_aux_bias) {
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &extra.bias, sizeof extra.bias));
    const cudaDataType_t bias_type = cuda_type(ct);  // callers pass a bias of c's dtype
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        op.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  const bool has_aux = extra.epilogue == lt_epilogue::gelu_aux || extra.epilogue == lt_epilogue::gelu_aux_bias ||
                       extra.epilogue == lt_epilogue::dgelu;
  if (has_aux) {  // the aux matrix is laid out as d (cuBLAS's n x m, column-major), of d's dtype
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                        &extra.aux, sizeof extra.aux));
    const std::int64_t aux_ld = extra.aux_ld;
    COROLLA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  // Stored buffers: b is [k, n] (or [n, k] when transposed), a is [m, k]
  // (or [k, m]), c (and d) is [m, n]; each as column-major (row length,
  // row count).
  layout_desc la, lb, lc;
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.d, cuda_type(bt), trans_b ? k : n,
                                                  trans_b ? n : k, ldb));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.d, cuda_type(at), trans_a ? m : k,
                                                  trans_a ? k : m, lda));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc.d, cuda_type(ct), n, m, ldc));
  void* const d = extra.d ? extra.d : c;
  if (extra.batch > 1) {
    if (has_aux) throw std::logic_error("lt_matmul: a strided batch with an aux matrix");
    const std::int32_t count = extra.batch;
    const auto set_batch = [&](layout_desc& l, std::int64_t stride) {
      COROLLA_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l.d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &stride, sizeof stride));
    };
    set_batch(la, extra.batch_b);
    set_batch(lb, extra.batch_a);
    set_batch(lc, extra.batch_c);
    if (extra.bias) {
      // cuBLASLt has no alignment preference for the bias and sees only the
      // first: every later one must be as aligned, up to 16 bytes (a vector
      // load). GPT-2-1.5B's q/k/v bias stride is 128-byte aligned.
      const auto* later = static_cast<const char*>(extra.bias) + extra.batch_bias * static_cast<std::int64_t>(dtype_size(ct));
      if (std::min(alignment_of(later), 16u) < std::min(alignment_of(extra.bias), 16u)) {
        if (extra.may_decline) return false;
        throw std::invalid_argument("lt_matmul: a batch's bias stride misaligns its later biases");
      }
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                          &extra.batch_bias, sizeof extra.batch_bias));
    }
  }

  // The heuristic assumes 256-byte aligned pointers unless told otherwise;
  // views (slices) can start anywhere a dtype allows; so can a batch's
  // later products (the alignment of base + stride bounds them all).
  const auto batch_alignment = [&](const void* p, std::int64_t stride, dtype t) {
    const std::uint32_t first = alignment_of(p);
    if (extra.batch <= 1 || stride == 0) return first;
    const auto bytes = stride * static_cast<std::int64_t>(dtype_size(t));
    return std::min(first, alignment_of(static_cast<const char*>(p) + bytes));
  };
  const std::uint32_t align_a = batch_alignment(b, extra.batch_b, bt), align_b = batch_alignment(a, extra.batch_a, at);
  const std::uint32_t align_c = batch_alignment(c, extra.batch_c, ct), align_d = batch_alignment(d, extra.batch_c, ct);
  const std::uint32_t align_aux = has_aux ? alignment_of(extra.aux) : 256;
  lt_key key;
  key.dims = {m,           n,  k, lda, ldb, ldc, has_aux ? extra.aux_ld : 0,
              extra.batch, extra.batch_a, extra.batch_b, extra.batch_c, extra.batch_bias};
  key.align = {align_a, align_b, align_c, align_d, align_aux};
  key.flags = {static_cast<std::uint8_t>(trans_a), static_cast<std::uint8_t>(trans_b),
               static_cast<std::uint8_t>(at),      static_cast<std::uint8_t>(bt),
               static_cast<std::uint8_t>(ct),      static_cast<std::uint8_t>(extra.epilogue),
               static_cast<std::uint8_t>(precision), static_cast<std::uint8_t>(d != c),
               static_cast<std::uint8_t>(extra.may_decline)};
  if (extra.may_decline && lt_declined_.count(key)) return false;
  cublasLtMatmulAlgo_t algo{};
  static_assert(sizeof algo == sizeof(std::array<std::uint64_t, 8>), "cublasLtMatmulAlgo_t size");
  if (auto it = lt_algos_.find(key); it != lt_algos_.end()) {
    std::memcpy(&algo, it->second.data(), sizeof algo);
  } else {
    preference_desc pref;
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.d));
    const std::uint64_t workspace = lt_workspace_bytes_;
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.d, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
    if (extra.may_decline && ct != dtype::f32) {
      // The fused forms promise one rounding: no split-K algorithm that
      // reduces its partial sums in (or in place of) the 16-bit output,
      // before the epilogue adds the residual or takes the GELU.
      const std::uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref.d, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
    }

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt_, op.d, la.d, lb.d, lc.d, lc.d, pref.d, 1, &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED &&
        !(extra.may_decline && status == CUBLAS_STATUS_INVALID_VALUE))
      throw_cublas_error(status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      if (extra.may_decline) {
        lt_declined_.insert(key);
        return false;
      }
      throw std::runtime_error(
          "gemm on " + name() + ": cuBLASLt has no algorithm for m=" + std::to_string(m) +
          " n=" + std::to_string(n) + " k=" + std::to_string(k) + " (" + dtype_name(at) + " x " +
          dtype_name(bt) + " -> " + dtype_name(ct) + lt_epilogue_name(extra.epilogue) +
          ", trans_a=" + std::to_string(trans_a) + " trans_b=" + std::to_string(trans_b) +
          ", alignments " + std::to_string(align_b) + "/" + std::to_string(align_a) + "/" +
          std::to_string(align_c) + " bytes)");
    }
    algo = result.algo;
    std::array<std::uint64_t, 8> stored{};
    std::memcpy(stored.data(), &algo, sizeof algo);
    lt_algos_.emplace(key, stored);
  }
  const cublasStatus_t launched = cublasLtMatmul(lt_, op.d, &alpha, b, la.d, a, lb.d, &beta, c, lc.d, d, lc.d,
                                                 &algo, lt_workspace_, lt_workspace_bytes_, stream_);
  if (extra.may_decline && (launched == CUBLAS_STATUS_NOT_SUPPORTED || launched == CUBLAS_STATUS_INVALID_VALUE ||
                            launched == CUBLAS_STATUS_ARCH_MISMATCH)) {
    // Refused before anything ran (argument checks): the caller's fallback runs.
    lt_algos_.erase(key);
    lt_declined_.insert(key);
    return false;
  }
  if (launched != CUBLAS_STATUS_SUCCESS) throw_cublas_error(launched, "cublasLtMatmul", __FILE__, __LINE__);
  COROLLA_CUDA_LAUNCH_CHECK("cublasLtMatmul");  // with COROLLA_CUDA_SYNC=1: faults located here
  return true;
}

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
      lt_matmul(false, true, rows, n, in, 1.0f, x.raw(), dtype::f32, in, wide, dtype::f32, in, 0.0f,
                y.data<float>() + o0, dtype::f32, out, bias_epilogue(bias ? bias->data<float>() + o0 : nullptr));
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
                          elem_of(db->type(), "linear_backward db"));
}

}  // namespace corolla::cuda
