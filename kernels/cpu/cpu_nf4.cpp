// kernels/cpu/cpu_nf4.cpp — NF4 inference weights on the CPU
// (kernels/nf4.hpp): quantisation, dequantisation, and linear_nf4.
//
// linear_nf4 splits the output channels between threads, so every packed
// byte is read from memory once per call. One row (decode): each block's
// 16 codes are scaled by its absmax once (two f32 tables of 8); 8 packed
// bytes widen to 32-bit lanes once, their high and low nibbles index the
// tables with vpermps straight into the FMAs (against x reordered once per
// call into even and odd values), never widening the row into memory. With
// AVX-512 (cpu_isa.hpp) 16 packed bytes widen at once and one vpermps looks
// up all 16 codes of the scaled table (and rows decoded into scratch, below,
// are written 32 weights per two lookups and two interleaves). Up to 8 rows
// (batched decode): a row is decoded once into per-thread scratch and
// dotted with every x row. More rows (prefill): blocks of rows are decoded
// into scratch and multiplied with sgemm. Every weight value used is the
// f32 product code * absmax, as dequantize_nf4 writes it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#include "kernels/cpu/cpu_widened_gemm.hpp"
#include "kernels/nf4.hpp"

namespace corolla::cpu {
namespace {

/// Rows up to which linear_nf4 dots decoded rows instead of calling sgemm.
constexpr std::int64_t nf4_dot_rows = 8;

/// The code of value k of a packed row.
inline int code_at(const std::uint8_t* q, std::int64_t k) {
  const std::uint8_t b = q[k / 2];
  return (k % 2 == 0) ? (b >> 4) : (b & 0x0f);
}

/// Writes the `in` values of one packed row, dequantised, to `out`.
void decode_row(const std::uint8_t* q, const float* absmax, std::int64_t in, float* out) {
  for (std::int64_t b0 = 0, blk = 0; b0 < in; b0 += nf4_block, ++blk) {
    const std::int64_t e = std::min<std::int64_t>(in, b0 + nf4_block);
    float table[16];
    for (int c = 0; c < 16; ++c) table[c] = nf4_codes[c] * absmax[blk];
    std::int64_t k = b0;
    for (; k + 1 < e; k += 2) {
      const std::uint8_t b = q[k / 2];
      out[k] = table[b >> 4];
      out[k + 1] = table[b & 0x0f];
    }
    if (k < e) out[k] = table[code_at(q, k)];
  }
}

#if defined(__AVX2__) && defined(__FMA__)
/// The 8 weights whose codes are the int32 lanes of `idx` (0..15), from the
/// scaled tables lo (codes 0..7) and hi (8..15): bit 3 of a code picks the
/// table (moved to the sign bit for blendv), its low 3 bits the entry.
inline __m256 lookup8(__m256i idx, __m256 lo, __m256 hi) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}
#endif

/// x of one row reordered for the fused dot products: in each group of
/// `group` values of the whole blocks (16 for AVX2, 32 for AVX-512), the
/// even-indexed values (those of the bytes' high nibbles) and then the odd
/// ones, so packed bytes widen once into lanes whose high and low nibbles
/// pair with two plain loads of x. Done once per call; every output
/// channel reuses it.
void split_even_odd(const float* x, std::int64_t in, float* out, int group) {
  const std::int64_t whole = in / nf4_block * nf4_block;
  const int half = group / 2;
  for (std::int64_t g = 0; g < whole; g += group)
    for (int i = 0; i < half; ++i) {
      out[g + i] = x[g + 2 * i];
      out[g + half + i] = x[g + 2 * i + 1];
    }
}

/// The partial block's share of x . w' (scalar), from value `from` on.
float dot_nf4_tail(const float* x, const std::uint8_t* q, const float* absmax, std::int64_t from, std::int64_t in) {
  float s = 0.0f;
  for (std::int64_t k = from; k < in; ++k) s += x[k] * (nf4_codes[code_at(q, k)] * absmax[k / nf4_block]);
  return s;
}

#ifdef COROLLA_HAVE_AVX512_KERNELS
COROLLA_AVX512_BEGIN
/// dot_nf4 with AVX-512: per block of 64 values, the 16 codes scaled by
/// the absmax fill one register; 16 packed bytes widen to 16 lanes, whose
/// high nibbles (shifted down) and low nibbles (vpermps reads only the low
/// four bits of an index) look up 16 weights each. `xs` is x after
/// split_even_odd with groups of 32.
COROLLA_AVX512 float dot_nf4_avx512(const float* x, const float* xs, const std::uint8_t* q, const float* absmax,
                                    std::int64_t in) {
  const __m512 codes = _mm512_loadu_ps(nf4_codes);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  std::int64_t blk = 0;
  for (; (blk + 1) * nf4_block <= in; ++blk) {
    const __m512 table = _mm512_mul_ps(codes, _mm512_set1_ps(absmax[blk]));
    const std::uint8_t* qb = q + blk * (nf4_block / 2);
    const float* xb = xs + blk * nf4_block;
    const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb)));
    const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16)));
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(xb), _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), table), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 16), _mm512_permutexvar_ps(v0, table), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 32), _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), table), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(xb + 48), _mm512_permutexvar_ps(v1, table), a3);
  }
  const float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  return s + dot_nf4_tail(x, q, absmax, blk * nf4_block, in);
}

/// Where each output lane of a 16-value half of 32 decoded weights comes
/// from in permutex2var(even, idx, odd): even values are lanes 0..15, odd
/// ones 16..31. Loaded from memory, not written as 512-bit constants (see
/// cpu_isa.hpp on GCC 12).
alignas(64) constexpr std::int32_t interleave_first[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
alignas(64) constexpr std::int32_t interleave_second[16] = {8,  24, 9,  25, 10, 26, 11, 27,
                                                            12, 28, 13, 29, 14, 30, 15, 31};

/// decode_row with AVX-512: per 16 packed bytes, two lookups (high and low
/// nibbles) and two interleaves write 32 weights in order.
COROLLA_AVX512 void decode_row_avx512(const std::uint8_t* q, const float* absmax, std::int64_t in, float* out) {
  const __m512 codes = _mm512_loadu_ps(nf4_codes);
  const __m512i first = _mm512_load_si512(interleave_first), second = _mm512_load_si512(interleave_second);
  std::int64_t blk = 0;
  for (; (blk + 1) * nf4_block <= in; ++blk) {
    const __m512 table = _mm512_mul_ps(codes, _mm512_set1_ps(absmax[blk]));
    for (int h = 0; h < 2; ++h) {
      const __m512i v =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + blk * (nf4_block / 2) + 16 * h)));
      const __m512 even = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
      const __m512 odd = _mm512_permutexvar_ps(v, table);
      float* o = out + blk * nf4_block + 32 * h;
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(even, first, odd));
      _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(even, second, odd));
    }
  }
  for (std::int64_t k = blk * nf4_block; k < in; ++k) out[k] = nf4_codes[code_at(q, k)] * absmax[k / nf4_block];
}
COROLLA_AVX512_END
#endif

/// x . w' over one packed row of `in` values; `xs` is x after
/// split_even_odd with groups of 16, `x` itself serves the partial block.
float dot_nf4(const float* x, const float* xs, const std::uint8_t* q, const float* absmax, std::int64_t in) {
  std::int64_t blk = 0;
  float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 code_lo = _mm256_loadu_ps(nf4_codes), code_hi = _mm256_loadu_ps(nf4_codes + 8);
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; (blk + 1) * nf4_block <= in; ++blk) {
    const __m256 scale = _mm256_set1_ps(absmax[blk]);
    const __m256 lo = _mm256_mul_ps(code_lo, scale), hi = _mm256_mul_ps(code_hi, scale);
    const std::uint8_t* qb = q + blk * (nf4_block / 2);
    const float* xb = xs + blk * nf4_block;
    for (int g = 0; g < 4; g += 2) {  // 8 bytes (16 weights) per step, two steps per pass
      const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * g)));
      const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qb + 8 * g + 8)));
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * g), lookup8(_mm256_srli_epi32(v0, 4), lo, hi), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * g + 8), lookup8(_mm256_and_si256(v0, low4), lo, hi), a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * g + 16), lookup8(_mm256_srli_epi32(v1, 4), lo, hi), a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xb + 16 * g + 24), lookup8(_mm256_and_si256(v1, low4), lo, hi), a3);
    }
  }
  const __m256 all = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  s = _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
#else
  (void)xs;
#endif
  return s + dot_nf4_tail(x, q, absmax, blk * nf4_block, in);
}

/// The fused one-row dot product decode_isa() says to use, and the group
/// size of the x reordering it reads.
struct fused_dot {
  float (*dot)(const float* x, const float* xs, const std::uint8_t* q, const float* absmax, std::int64_t in);
  int group;
};

fused_dot fused_dot_for_isa() {
#ifdef COROLLA_HAVE_AVX512_KERNELS
  if (decode_isa() == vector_isa::avx512) return {dot_nf4_avx512, 32};
#endif
  return {dot_nf4, 16};
}

/// The row decoder decode_isa() says to use.
using decode_row_fn = void (*)(const std::uint8_t* q, const float* absmax, std::int64_t in, float* out);
decode_row_fn decode_row_for_isa() {
#ifdef COROLLA_HAVE_AVX512_KERNELS
  if (decode_isa() == vector_isa::avx512) return decode_row_avx512;
#endif
  return decode_row;
}

void require_nf4(const Tensor& q, const Tensor& absmax, std::int64_t out, std::int64_t in, const char* what_q,
                 const char* what_absmax) {
  require(q, dtype::i8, {out, nf4_row_bytes(in)}, what_q);
  require(absmax, dtype::f32, {out, nf4_row_blocks(in)}, what_absmax);
}

}  // namespace

void cpu_backend_impl::quantize_nf4(const Tensor& w, Tensor& q, Tensor& absmax) {
  require_host(w, dtype::f32, "quantize_nf4 w");
  require_that(w.rank() == 2, "quantize_nf4 w", "expected a 2-D [out, in] tensor");
  const std::int64_t out = w.dim(0), in = w.dim(1);
  require_nf4(q, absmax, out, in, "quantize_nf4 q", "quantize_nf4 absmax");
  const float* wp = w.data<float>();
  auto* qp = reinterpret_cast<std::uint8_t*>(q.data<std::int8_t>());
  float* ap = absmax.data<float>();
  const std::int64_t row_bytes = nf4_row_bytes(in), blocks = nf4_row_blocks(in);
  parallel_for(out, 20 * in, [&](std::int64_t o) {
    const float* row = wp + o * in;
    std::uint8_t* qr = qp + o * row_bytes;
    std::memset(qr, 0x77, static_cast<std::size_t>(row_bytes));  // code 7 (0.0), also the odd row's pad
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t b0 = blk * nf4_block, e = std::min<std::int64_t>(in, b0 + nf4_block);
      float amax = 0.0f;
      for (std::int64_t k = b0; k < e; ++k) amax = std::max(amax, std::fabs(row[k]));
      ap[o * blocks + blk] = amax;
      if (amax == 0.0f) continue;
      const float inv = 1.0f / amax;
      for (std::int64_t k = b0; k < e; ++k) {
        const auto c = static_cast<std::uint8_t>(nf4_index(row[k] * inv));
        std::uint8_t& b = qr[k / 2];
        b = (k % 2 == 0) ? static_cast<std::uint8_t>((b & 0x0f) | (c << 4)) : static_cast<std::uint8_t>((b & 0xf0) | c);
      }
    }
  });
}

void cpu_backend_impl::dequantize_nf4(const Tensor& q, const Tensor& absmax, Tensor& w) {
  require_host(w, dtype::f32, "dequantize_nf4 w");
  require_that(w.rank() == 2, "dequantize_nf4 w", "expected a 2-D [out, in] tensor");
  const std::int64_t out = w.dim(0), in = w.dim(1);
  require_nf4(q, absmax, out, in, "dequantize_nf4 q", "dequantize_nf4 absmax");
  const auto* qp = reinterpret_cast<const std::uint8_t*>(q.data<std::int8_t>());
  const float* ap = absmax.data<float>();
  float* wp = w.data<float>();
  const std::int64_t row_bytes = nf4_row_bytes(in), blocks = nf4_row_blocks(in);
  const decode_row_fn decode = decode_row_for_isa();
  parallel_for(out, 2 * in, [&](std::int64_t o) { decode(qp + o * row_bytes, ap + o * blocks, in, wp + o * in); });
}

void cpu_backend_impl::linear_nf4(const Tensor& x, const Tensor& q, const Tensor& absmax, const Tensor* bias,
                                  Tensor& y) {
  require_host(x, dtype::f32, "linear_nf4 x");
  require_that(x.rank() == 2, "linear_nf4 x", "expected a 2-D [rows, in] tensor");
  require_host(q, dtype::i8, "linear_nf4 q");
  require_that(q.rank() == 2, "linear_nf4 q", "expected a 2-D [out, in / 2] tensor");
  const std::int64_t rows = x.dim(0), in = x.dim(1), out = q.dim(0);
  require_nf4(q, absmax, out, in, "linear_nf4 q", "linear_nf4 absmax");
  if (bias) require(*bias, dtype::f32, {out}, "linear_nf4 bias");
  require(y, dtype::f32, {rows, out}, "linear_nf4 y");
  if (rows == 0 || out == 0) return;

  const float* xp = x.data<float>();
  const auto* qp = reinterpret_cast<const std::uint8_t*>(q.data<std::int8_t>());
  const float* ap = absmax.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  float* yp = y.data<float>();
  const std::int64_t row_bytes = nf4_row_bytes(in), blocks = nf4_row_blocks(in);
  if (rows == 1) {
    float* xs = thread_scratch(1, static_cast<std::size_t>(in));  // the calling thread's, read by all
    const fused_dot d = fused_dot_for_isa();
    split_even_odd(xp, in, xs, d.group);
    parallel_ranges(out, in, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        prefetch_ahead(qp + o * row_bytes, static_cast<std::size_t>(row_bytes));
        yp[o] = d.dot(xp, xs, qp + o * row_bytes, ap + o * blocks, in) + (bp ? bp[o] : 0.0f);
      }
    });
    return;
  }
  const decode_row_fn decode = decode_row_for_isa();
  if (rows <= nf4_dot_rows) {
    parallel_ranges(out, rows * in, [&](std::int64_t o0, std::int64_t o1) {
      float* wf = thread_scratch(0, static_cast<std::size_t>(in));
      for (std::int64_t o = o0; o < o1; ++o) {
        prefetch_ahead(qp + o * row_bytes, static_cast<std::size_t>(row_bytes));
        decode(qp + o * row_bytes, ap + o * blocks, in, wf);
        for (std::int64_t r = 0; r < rows; ++r) yp[r * out + o] = dot_pipelined(xp + r * in, wf, in) + (bp ? bp[o] : 0.0f);
      }
    });
    return;
  }
  // Many rows: blocks of decoded weight rows through sgemm.
  linear_widened(xp, rows, in, out, bp, yp, [&](std::int64_t o0, std::int64_t n, float* wf) {
    for (std::int64_t o = 0; o < n; ++o) decode(qp + (o0 + o) * row_bytes, ap + (o0 + o) * blocks, in, wf + o * in);
  });
}

}  // namespace corolla::cpu
