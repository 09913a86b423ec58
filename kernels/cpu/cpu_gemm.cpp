// kernels/cpu/cpu_gemm.cpp — gemm and linear (forward, backward) through
// OpenBLAS.
//
// Threading: OpenBLAS runs single-threaded (set when the backend is
// created) and these wrappers split each product into one block per OpenMP
// thread, so the whole backend uses one thread pool. With OpenBLAS's own
// pthread pool next to OpenMP's, the two pools' idle workers spin against
// each other on a small machine: a batch-1 decode step (matrix-vector
// products alternating with OpenMP ops) measured 4-5x slower on 2 cores.
//
// A single row goes through sgemv (split over output rows): batch-1 decode
// is a chain of matrix-vector products bound by streaming the weights from
// memory, and sgemv avoids sgemm's packing of a 1-row panel.
#include <cblas.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#if defined(__x86_64__)
#include "kernels/cpu/cpu_avx512_dot.hpp"
#endif
#include "kernels/op_checks.hpp"

namespace corolla::cpu {
namespace {

blasint bi(std::int64_t v) { return static_cast<blasint>(v); }


/// y = beta * y; beta = 0 writes zeros without reading y, which may be
/// uninitialised memory holding NaN bit patterns.
void scale_or_zero(float* y, std::int64_t n, float beta) {
  if (beta == 0.0f) {
    std::memset(y, 0, static_cast<std::size_t>(n) * sizeof(float));
  } else if (beta != 1.0f) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) y[i] *= beta;
  }
}

/// y[rows] = alpha * W[rows, cols] @ x + beta * y (W row stride ldw), split
/// over output rows.
void gemv_rows(const float* w, std::int64_t rows, std::int64_t cols, std::int64_t ldw,
               const float* x, float* y, float alpha, float beta) {
  parallel_ranges(rows, cols, [&](std::int64_t r0, std::int64_t r1) {
    scale_or_zero(y + r0, r1 - r0, beta);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, bi(r1 - r0), bi(cols), alpha, w + r0 * ldw, bi(ldw),
                x, 1, 1.0f, y + r0, 1);
  });
}

/// y[cols] = alpha * W[rows, cols]^T @ x + beta * y, split over output
/// columns (each thread reads a column band of W).
void gemv_cols(const float* w, std::int64_t rows, std::int64_t cols, std::int64_t ldw,
               const float* x, float* y, float alpha, float beta) {
  parallel_ranges(cols, rows, [&](std::int64_t c0, std::int64_t c1) {
    scale_or_zero(y + c0, c1 - c0, beta);
    cblas_sgemv(CblasRowMajor, CblasTrans, bi(rows), bi(c1 - c0), alpha, w + c0, bi(ldw), x, 1,
                1.0f, y + c0, 1);
  });
}

/// Row-major C[m,n] = alpha * op(A) @ op(B) + beta * C, one block of rows
/// (or of columns, whichever dimension is larger) per thread.
void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
           float* c, std::int64_t ldc) {
  auto call = [&](std::int64_t mm, std::int64_t nn, const float* ap, const float* bp, float* cp) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                bi(mm), bi(nn), bi(k), alpha, ap, bi(lda), bp, bi(ldb), beta, cp, bi(ldc));
  };
  if (m >= n) {  // rows of op(A): A's rows, or A's columns when transposed
    parallel_ranges(m, n * k, [&](std::int64_t r0, std::int64_t r1) {
      call(r1 - r0, n, ta ? a + r0 : a + r0 * lda, b, c + r0 * ldc);
    });
  } else {  // columns of op(B): B's columns, or B's rows when transposed
    parallel_ranges(n, m * k, [&](std::int64_t c0, std::int64_t c1) {
      call(m, c1 - c0, a, tb ? b + c0 * ldb : b + c0, c + c0);
    });
  }
}

// ---- bf16 weights -------------------------------------------------------------

/// Rows up to which a bf16-weight linear takes dot products against each
/// widened weight row (bound by reading the weight); above it, blocks of the
/// weight are widened and multiplied with sgemm (bound by arithmetic).
/// `corolla bench serve --weights bf16` (the bench model, 2 cores): the dot
/// products win at 4 and 8 rows (137 vs 128, 165 vs 148 tokens/s), sgemm at
/// 16 (214 vs 185).
constexpr std::int64_t bf16_dot_rows = 8;

/// bf16 bits -> f32: the bits are the f32's upper half (a shift, which GCC
/// vectorises: 16 weights per AVX2 step).
inline float widen(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

void widen_row(const std::uint16_t* src, float* dst, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] = widen(src[i]);
}

/// sum x[i] * widen(w[i]), widening in registers (no scratch: the 1-row case).
float dot_bf16(const float* x, const std::uint16_t* w, std::int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += x[i] * widen(w[i]);
  return s;
}

#ifdef COROLLA_HAVE_AVX512_KERNELS
COROLLA_AVX512_BEGIN
/// 16 bf16 weights from `w`, as f32 lanes (zero-extended, shifted up).
COROLLA_AVX512 inline __m512 widened16(const std::uint16_t* w) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))), 16));
}

/// dot_bf16 with AVX-512.
constexpr auto dot_bf16_avx512 = dot_widened_avx512<std::uint16_t, widened16, widen>;
COROLLA_AVX512_END
#endif

/// The one-row bf16 dot product decode_isa() says to use.
using dot_bf16_fn = float (*)(const float*, const std::uint16_t*, std::int64_t);
dot_bf16_fn dot_bf16_for_isa() {
#ifdef COROLLA_HAVE_AVX512_KERNELS
  if (decode_isa() == vector_isa::avx512) return dot_bf16_avx512;
#endif
  return dot_bf16;
}

/// y[rows, out] = x[rows, in] @ w[out, in]^T (+ y when accumulate, which
/// holds the broadcast bias), w bf16, for rows <= bf16_dot_rows. Threads own
/// ranges of output features, so every weight row is read from memory once.
void linear_bf16_dot(const float* x, std::int64_t rows, std::int64_t in, const std::uint16_t* w,
                     std::int64_t out, float* y, bool accumulate) {
  const dot_bf16_fn dot_row = dot_bf16_for_isa();
  parallel_ranges(out, rows * in, [&](std::int64_t o0, std::int64_t o1) {
    float* wrow = rows > 1 ? thread_scratch(0, static_cast<std::size_t>(in)) : nullptr;
    for (std::int64_t o = o0; o < o1; ++o) {
      const std::uint16_t* wo = w + o * in;
      prefetch_ahead(wo, static_cast<std::size_t>(in) * sizeof(std::uint16_t));
      if (rows == 1) {
        const float v = dot_row(x, wo, in);
        y[o] = accumulate ? y[o] + v : v;
        continue;
      }
      widen_row(wo, wrow, in);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float v = dot_pipelined(x + r * in, wrow, in);
        float& yo = y[r * out + o];
        yo = accumulate ? yo + v : v;
      }
    }
  });
}

/// The same for many rows: each thread widens blocks of its weight rows
/// into scratch (about 1 MiB at a time) and multiplies them with sgemm.
void linear_bf16_blocked(const float* x, std::int64_t rows, std::int64_t in,
                         const std::uint16_t* w, std::int64_t out, float* y, float beta) {
  const std::int64_t block = std::max<std::int64_t>(16, (std::int64_t{1} << 18) / in);
  parallel_ranges(out, rows * in, [&](std::int64_t o0, std::int64_t o1) {
    const std::int64_t cap = std::min(block, o1 - o0);
    float* wf = thread_scratch(0, static_cast<std::size_t>(cap * in));
    for (std::int64_t b0 = o0; b0 < o1; b0 += cap) {
      const std::int64_t nb = std::min(cap, o1 - b0);
      for (std::int64_t o = 0; o < nb; ++o) widen_row(w + (b0 + o) * in, wf + o * in, in);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(rows), bi(nb), bi(in), 1.0f, x,
                  bi(in), wf, bi(in), beta, y + b0, bi(out));
    }
  });
}

}  // namespace

cpu_backend_impl::cpu_backend_impl() {
  // One thread pool for the whole backend: see the file comment.
  openblas_set_num_threads(1);
}

void cpu_backend_impl::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                            Tensor& c, float alpha, float beta) {
  require_host(a, dtype::f32, "gemm a");
  require_host(b, dtype::f32, "gemm b");
  require_host(c, dtype::f32, "gemm c");
  const auto [m, n, k] = check_gemm_shapes(a, trans_a, b, trans_b, c);

  float* cp = c.data<float>();
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: c = beta * c
    scale_or_zero(cp, m * n, beta);
    return;
  }
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  if (m == 1) {  // a is one contiguous row whether or not it is transposed
    if (trans_b)
      gemv_rows(bp, n, k, k, ap, cp, alpha, beta);  // b [N,K]
    else
      gemv_cols(bp, k, n, n, ap, cp, alpha, beta);  // b [K,N]
    return;
  }
  sgemm(trans_a, trans_b, m, n, k, alpha, ap, a.dim(-1), bp, b.dim(-1), beta, cp, n);
}

void cpu_backend_impl::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  require_host(x, dtype::f32, "linear x");
  require_that(x.rank() == 2, "linear x", "expected a 2-D [rows, in] tensor");
  require_linear_weight(w, device{}, x.type(), "linear w");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  require(w, w.type(), {out, in}, "linear w");
  if (bias) require(*bias, dtype::f32, {out}, "linear bias");
  require(y, dtype::f32, {rows, out}, "linear y");
  if (rows == 0 || out == 0) return;

  float* yp = y.data<float>();
  float beta = 0.0f;
  if (bias) {  // y starts as the bias broadcast over rows; BLAS adds x @ w^T
    const float* bp = bias->data<float>();
    parallel_for(rows, out, [&](std::int64_t r) {
      std::memcpy(yp + r * out, bp, static_cast<std::size_t>(out) * sizeof(float));
    });
    beta = 1.0f;
  }
  if (in == 0) {
    if (!bias) std::memset(yp, 0, y.nbytes());
    return;
  }
  if (w.type() == dtype::bf16) {
    const auto* wp = w.data<std::uint16_t>();
    if (rows <= bf16_dot_rows)
      linear_bf16_dot(x.data<float>(), rows, in, wp, out, yp, beta != 0.0f);
    else
      linear_bf16_blocked(x.data<float>(), rows, in, wp, out, yp, beta);
    return;
  }
  if (rows == 1) {
    gemv_rows(w.data<float>(), out, in, in, x.data<float>(), yp, 1.0f, beta);
    return;
  }
  sgemm(false, true, rows, out, in, 1.0f, x.data<float>(), in, w.data<float>(), in, beta, yp, out);
}

void cpu_backend_impl::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                       Tensor* dx, Tensor& dw, Tensor* db) {
  require_host(x, dtype::f32, "linear_backward x");
  require_that(x.rank() == 2, "linear_backward x", "expected a 2-D [rows, in] tensor");
  refuse_inference_weight(w, x.type(), "linear_backward w");
  require_host(w, dtype::f32, "linear_backward w");
  require_that(w.rank() == 2, "linear_backward w", "expected a 2-D [out, in] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  require(w, dtype::f32, {out, in}, "linear_backward w");
  require(dy, dtype::f32, {rows, out}, "linear_backward dy");
  if (dx) require(*dx, dtype::f32, {rows, in}, "linear_backward dx");
  require(dw, dtype::f32, {out, in}, "linear_backward dw");
  if (db) require(*db, dtype::f32, {out}, "linear_backward db");

  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* dyp = dy.data<float>();
  if (dx && rows > 0 && in > 0) {
    float* dxp = dx->data<float>();
    if (out == 0)
      std::memset(dxp, 0, dx->nbytes());
    else if (rows == 1)  // dx = w^T dy
      gemv_cols(wp, out, in, in, dyp, dxp, 1.0f, 0.0f);
    else  // dx[rows,in] = dy[rows,out] @ w[out,in]
      sgemm(false, false, rows, in, out, 1.0f, dyp, out, wp, in, 0.0f, dxp, in);
  }
  if (rows > 0 && out > 0 && in > 0) {
    float* dwp = dw.data<float>();
    if (rows == 1)  // rank-1 update dw += dy x^T, split over dw's rows
      parallel_ranges(out, in, [&](std::int64_t r0, std::int64_t r1) {
        cblas_sger(CblasRowMajor, bi(r1 - r0), bi(in), 1.0f, dyp + r0, 1, xp, 1, dwp + r0 * in,
                   bi(in));
      });
    else  // dw[out,in] += dy^T[out,rows] @ x[rows,in]
      sgemm(true, false, out, in, rows, 1.0f, dyp, out, xp, in, 1.0f, dwp, in);
  }
  if (db && rows > 0 && out > 0) {
    float* dbp = db->data<float>();
    // Each thread owns a range of columns and walks every row: no races, and
    // the per-column summation order is the same for any thread count.
    parallel_ranges(out, rows, [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* d = dyp + r * out;
#pragma omp simd
        for (std::int64_t c = c0; c < c1; ++c) dbp[c] += d[c];
      }
    });
  }
}

}  // namespace corolla::cpu
