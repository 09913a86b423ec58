// kernels/cuda/rope.hpp — rotary position embedding launcher (host-only).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// In place on x [n, heads*head_dim] (f32): pair (i, i + head_dim/2) of each
/// head rotated by positions[row] * theta^(-2i/head_dim) (negated when
/// `inverse`). Positions (device, i32) must be non-negative: checked by the
/// caller.
void rope(stream_t s, float* x, const std::int32_t* positions, std::int64_t n, int heads,
          int head_dim, float theta, bool inverse);

}  // namespace corolla::cuda
