// kernels/cuda/nf4.hpp — NF4 inference weights on the device
// (kernels/nf4.hpp), launchers only (host-only: no CUDA types).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// w f32 [out, in] -> q [out, (in+1)/2] packed codes, absmax [out, ceil(in/64)].
void quantize_nf4(stream_t s, const float* w, std::int64_t out, std::int64_t in, std::uint8_t* q, float* absmax);
/// The reverse: w = code * absmax.
void dequantize_nf4(stream_t s, const std::uint8_t* q, const float* absmax, std::int64_t out, std::int64_t in,
                    float* w);
/// y[rows, out] = x @ w'^T (+ bias), one warp per output channel, up to 8
/// rows of x per pass over its packed row. rows, in, out > 0; bias may be null.
void linear_nf4(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const std::uint8_t* q,
                const float* absmax, const float* bias, std::int64_t out, float* y);

}  // namespace corolla::cuda
