// kernels/cuda/moe.hpp — launchers of the mixture-of-experts row moves
// (host-only). Indices are device i32 already checked by the caller.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// out[r, :] = src[rows[r], :] * (weights ? weights[r] : 1) for m rows of d.
/// src and out are `t` (f32, bf16 or f16), weights f32.
void moe_gather(stream_t s, elem t, const void* src, const std::int32_t* rows, const float* weights, void* out,
                std::int64_t m, std::int64_t d);
/// out[t, :] (+)= sum_j weights[t, j] * src[slots[t, j], :] for n rows of k slots.
/// src and out are `t`, weights f32.
void moe_combine(stream_t s, elem t, const void* src, const std::int32_t* slots, const float* weights, void* out,
                 std::int64_t n, std::int64_t k, std::int64_t d, bool accumulate);
/// dweights[t, j] = dot(dy[t, :], src[slots[t, j], :]) for n rows of k slots.
/// dy and src are `t`, dweights f32.
void moe_combine_weight_grad(stream_t s, elem t, const void* dy, const void* src, const std::int32_t* slots,
                             float* dweights, std::int64_t n, std::int64_t k, std::int64_t d);

}  // namespace corolla::cuda
