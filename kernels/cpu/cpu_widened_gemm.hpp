// kernels/cpu/cpu_widened_gemm.hpp — the prefill path of the quantised
// products (linear_q8, linear_nf4): each thread widens blocks of about
// 1 MiB of its output channels' weight rows to f32 in its scratch and
// multiplies them with sgemm, so every quantised byte is still read once
// per call while the arithmetic runs at GEMM speed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <cblas.h>

#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {

/// y[rows, out] = x[rows, in] @ W^T (+ bias), W's rows [o, o + n) written
/// as f32 by widen(o, n, dst) (dst row-major [n, in]). bias may be null.
template <class Widen>
void linear_widened(const float* x, std::int64_t rows, std::int64_t in, std::int64_t out, const float* bias, float* y,
                    Widen&& widen) {
  const std::int64_t block = std::max<std::int64_t>(16, (std::int64_t{1} << 18) / std::max<std::int64_t>(in, 1));
  parallel_ranges(out, rows * in, [&](std::int64_t o0, std::int64_t o1) {
    const std::int64_t cap = std::min(block, o1 - o0);
    float* wf = thread_scratch(0, static_cast<std::size_t>(cap * in));
    for (std::int64_t b0 = o0; b0 < o1; b0 += cap) {
      const std::int64_t nb = std::min(cap, o1 - b0);
      widen(b0, nb, wf);
      float beta = 0.0f;
      if (bias) {
        for (std::int64_t r = 0; r < rows; ++r)
          std::memcpy(y + r * out + b0, bias + b0, static_cast<std::size_t>(nb) * sizeof(float));
        beta = 1.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(nb),
                  static_cast<int>(in), 1.0f, x, static_cast<int>(in), wf, static_cast<int>(in), beta, y + b0,
                  static_cast<int>(out));
    }
  });
}

}  // namespace corolla::cpu
