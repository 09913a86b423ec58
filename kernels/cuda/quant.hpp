// kernels/cuda/quant.hpp — blockwise absmax int8 launchers (host-only).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Per block of `block` values of x [n]: scale = max|x| / 127,
/// q = clamp(round_half_away(x / scale), -127, 127) (0 when scale is 0).
void quantize_int8(stream_t s, const float* x, std::int64_t n, int block, std::int8_t* q,
                   float* scales);
/// x = q * scale of its block.
void dequantize_int8(stream_t s, const std::int8_t* q, const float* scales, std::int64_t n,
                     int block, float* x);

}  // namespace corolla::cuda
