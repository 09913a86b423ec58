// kernels/cpu/cpu_avx512_dot.hpp — the AVX-512 dot product of an f32 row
// with a row of narrower weights, for the one-row decode kernels (bf16,
// int8): 64 weights per iteration into four accumulators, each 16 widened
// by `Widen16`, the tail by `Widen1`. Internal to kernels/cpu; include only
// where cpu_isa.hpp's COROLLA_HAVE_AVX512_KERNELS is checked.
#pragma once

#include <cstdint>

#include <immintrin.h>

#include "kernels/cpu/cpu_isa.hpp"

#ifdef COROLLA_HAVE_AVX512_KERNELS
namespace corolla::cpu {

COROLLA_AVX512_BEGIN
template <typename T, __m512 (*Widen16)(const T*), float (*Widen1)(T)>
COROLLA_AVX512 float dot_widened_avx512(const float* x, const T* w, std::int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  std::int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), Widen16(w + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), Widen16(w + i + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), Widen16(w + i + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), Widen16(w + i + 48), a3);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; ++i) s += x[i] * Widen1(w[i]);
  return s;
}
COROLLA_AVX512_END

}  // namespace corolla::cpu
#endif
