// kernels/cuda/linear_bf16.hpp — linear with an f32 input and a bf16
// (inference) weight, launcher only (host-only: no CUDA types).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// y[rows, out] = x[rows, in] @ w[out, in]^T (+ bias[out] when not null),
/// x, bias, y f32 and w bf16, products summed in f32 (see Backend::linear).
/// One warp per output feature takes up to 8 rows per pass over the weight
/// row, so batch-1 to batch-8 decode reads every weight once (16-byte loads
/// when in % 8 == 0 and x, w are 16-byte aligned); more rows make more
/// passes (correct, not tuned for prefill). rows, in, out > 0.
void linear_bf16_weight(stream_t s, const float* x, std::int64_t rows, std::int64_t in,
                        const void* w, std::int64_t out, const float* bias, float* y);

}  // namespace corolla::cuda
