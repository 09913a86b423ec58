// kernels/cpu/cpu_quant.cpp — blockwise absmax int8 (de)quantisation for
// compressing activations and gradients on the wire.
//
// Per block: scale = max|x| / 127 (0 for an all-zero block, whose q are 0);
// q = clamp(round_half_away_from_zero(x / scale), -127, 127); x' = q * scale,
// so |x - x'| <= scale / 2. The last block may be shorter than `block`.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {

void cpu_backend_impl::quantize_int8(const Tensor& x, int block, Tensor& q, Tensor& scales) {
  require_that(block > 0, "quantize_int8", "block must be positive");
  require_host(x, dtype::f32, "quantize_int8 x");
  require_like(q, dtype::i8, x, "quantize_int8 q");
  const std::int64_t n = x.numel(), blocks = (n + block - 1) / block;
  require(scales, dtype::f32, {blocks}, "quantize_int8 scales");
  const float* xp = x.data<float>();
  std::int8_t* qp = q.data<std::int8_t>();
  float* sp = scales.data<float>();
  parallel_for(blocks, 3 * std::int64_t{block}, [&](std::int64_t blk) {
    const std::int64_t b = blk * block, e = b + block < n ? b + block : n;
    const float* xb = xp;  // a local copy: GCC gathers through captured pointers in simd reductions
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (std::int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float s = amax / 127.0f;
    sp[blk] = s;
    if (s == 0.0f) {
      for (std::int64_t i = b; i < e; ++i) qp[i] = 0;
      return;
    }
    for (std::int64_t i = b; i < e; ++i) {
      float r = std::round(xp[i] / s);  // half away from zero
      r = std::min(127.0f, std::max(-127.0f, r));
      qp[i] = static_cast<std::int8_t>(static_cast<int>(r));
    }
  });
}

void cpu_backend_impl::dequantize_int8(const Tensor& q, const Tensor& scales, int block,
                                       Tensor& x) {
  require_that(block > 0, "dequantize_int8", "block must be positive");
  require_host(q, dtype::i8, "dequantize_int8 q");
  require_like(x, dtype::f32, q, "dequantize_int8 x");
  const std::int64_t n = q.numel(), blocks = (n + block - 1) / block;
  require(scales, dtype::f32, {blocks}, "dequantize_int8 scales");
  const std::int8_t* qp = q.data<std::int8_t>();
  const float* sp = scales.data<float>();
  float* xp = x.data<float>();
  parallel_for(blocks, std::int64_t{block}, [&](std::int64_t blk) {
    const std::int64_t b = blk * block, e = b + block < n ? b + block : n;
    const float s = sp[blk];
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) xp[i] = static_cast<float>(qp[i]) * s;
  });
}

}  // namespace corolla::cpu
