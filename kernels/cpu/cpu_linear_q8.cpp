// kernels/cpu/cpu_linear_q8.cpp — linear with an int8 weight quantised per
// output channel (Backend::linear_q8): y = (x @ q^T) * scale (+ bias).
//
// Threads own ranges of output channels, so every weight byte is read from
// memory once per call. A few rows (decode, small batches): each int8 row
// is dotted with every x row as it is read, widened in registers (16 lanes
// at a time with AVX-512 where the CPU has it, cpu_isa.hpp). Many rows
// (prefill): blocks of int8 rows are widened into per-thread f32 scratch
// and multiplied with sgemm, as the bf16 path does.
#include <algorithm>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#if defined(__x86_64__)
#include "kernels/cpu/cpu_avx512_dot.hpp"
#endif
#include "kernels/cpu/cpu_widened_gemm.hpp"

namespace corolla::cpu {
namespace {

/// Rows up to which the products are dot products over the int8 rows.
constexpr std::int64_t q8_dot_rows = 8;

/// x . q over n values. With AVX2 and FMA: 32 weights per iteration into
/// four independent accumulators (one chain would leave decode bound by the
/// FMA latency, not by memory: 1.75x f32 instead of the bytes' 4x).
float dot_q8(const float* x, const std::int8_t* q, std::int64_t n) {
  std::int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  // vpmovsxbd straight from memory: 8 weights widened per load.
  auto widened = [&](std::int64_t k) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k))));
  };
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), widened(i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), widened(i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), widened(i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), widened(i + 24), a3);
  }
  const __m256 all = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  s = _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
#endif
  for (; i < n; ++i) s += x[i] * static_cast<float>(q[i]);
  return s;
}

#ifdef COROLLA_HAVE_AVX512_KERNELS
COROLLA_AVX512_BEGIN
/// 16 int8 weights from `q`, as f32 lanes.
COROLLA_AVX512 inline __m512 widened16(const std::int8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

/// One int8 weight as f32.
inline float widen_q8(std::int8_t q) { return static_cast<float>(q); }

/// dot_q8 with AVX-512.
constexpr auto dot_q8_avx512 = dot_widened_avx512<std::int8_t, widened16, widen_q8>;
COROLLA_AVX512_END
#endif

/// The dot product decode_isa() says to use.
using dot_q8_fn = float (*)(const float*, const std::int8_t*, std::int64_t);
dot_q8_fn dot_q8_for_isa() {
#ifdef COROLLA_HAVE_AVX512_KERNELS
  if (decode_isa() == vector_isa::avx512) return dot_q8_avx512;
#endif
  return dot_q8;
}

}  // namespace

void cpu_backend_impl::linear_q8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor* bias,
                                 Tensor& y) {
  require_host(x, dtype::f32, "linear_q8 x");
  require_that(x.rank() == 2, "linear_q8 x", "expected a 2-D [rows, in] tensor");
  require_host(q, dtype::i8, "linear_q8 q");
  require_that(q.rank() == 2, "linear_q8 q", "expected a 2-D [out, in] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = q.dim(0);
  require(q, dtype::i8, {out, in}, "linear_q8 q");
  require(scale, dtype::f32, {out}, "linear_q8 scale");
  if (bias) require(*bias, dtype::f32, {out}, "linear_q8 bias");
  require(y, dtype::f32, {rows, out}, "linear_q8 y");
  if (rows == 0 || out == 0) return;

  const float* xp = x.data<float>();
  const auto* qp = q.data<std::int8_t>();
  const float* sp = scale.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  float* yp = y.data<float>();
  if (rows <= q8_dot_rows) {
    const dot_q8_fn dot_row = dot_q8_for_isa();
    parallel_ranges(out, rows * in, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        prefetch_ahead(qp + o * in, static_cast<std::size_t>(in));
        for (std::int64_t r = 0; r < rows; ++r)
          yp[r * out + o] = dot_row(xp + r * in, qp + o * in, in) * sp[o] + (bp ? bp[o] : 0.0f);
      }
    });
    return;
  }
  // Many rows: blocks of widened (scaled) weight rows through sgemm.
  linear_widened(xp, rows, in, out, bp, yp, [&](std::int64_t o0, std::int64_t n, float* wf) {
    for (std::int64_t o = 0; o < n; ++o) {
      const std::int8_t* src = qp + (o0 + o) * in;
      float* dst = wf + o * in;
      const float s = sp[o0 + o];
#pragma omp simd
      for (std::int64_t i = 0; i < in; ++i) dst[i] = static_cast<float>(src[i]) * s;
    }
  });
}

}  // namespace corolla::cpu
