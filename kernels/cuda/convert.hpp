// kernels/cuda/convert.hpp — dtype conversion on the device (host-only header).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// dst[i] = src[i] converted (round to nearest even) for n elements on `s`.
/// bf16 <-> f16 goes through f32 (exact widening, one rounding).
void convert(stream_t s, const void* src, elem from, void* dst, elem to, std::int64_t n);

}  // namespace corolla::cuda
