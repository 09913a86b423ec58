// kernels/cuda/moe.hpp — launchers of the mixture-of-experts row moves
// (host-only). Indices are device i32 already checked by the caller.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// out[r, :] = src[rows[r], :] * (weights ? weights[r] : 1) for m rows of d.
void moe_gather(stream_t s, const float* src, const std::int32_t* rows, const float* weights, float* out,
                std::int64_t m, std::int64_t d);
/// out[t, :] (+)= sum_j weights[t, j] * src[slots[t, j], :] for n rows of k slots.
void moe_combine(stream_t s, const float* src, const std::int32_t* slots, const float* weights, float* out,
                 std::int64_t n, std::int64_t k, std::int64_t d, bool accumulate);
/// dweights[t, j] = dot(dy[t, :], src[slots[t, j], :]) for n rows of k slots.
void moe_combine_weight_grad(stream_t s, const float* dy, const float* src, const std::int32_t* slots,
                             float* dweights, std::int64_t n, std::int64_t k, std::int64_t d);

}  // namespace corolla::cuda
