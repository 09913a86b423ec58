// kernels/cuda/linear_q8.hpp — linear with an f32 input and an int8 weight
// quantised per output channel (Backend::linear_q8), launcher only
// (host-only: no CUDA types).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// y[rows, out] = (x[rows, in] @ q[out, in]^T) * scale[out] (+ bias[out]),
/// x, scale, bias, y f32 (device), q i8; one warp per output channel, up to
/// 8 rows of x per pass over its row (linear_q8_kernels.cuh). rows, in,
/// out > 0; bias may be null.
void linear_q8(stream_t s, const float* x, std::int64_t rows, std::int64_t in, const std::int8_t* q,
               const float* scale, const float* bias, std::int64_t out, float* y);

}  // namespace corolla::cuda
