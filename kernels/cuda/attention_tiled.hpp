// kernels/cuda/attention_tiled.hpp — tiled (flash-style) causal attention
// for training, head sizes up to tiled_max_head_dim (host-only header; the
// kernels are in attention_tiled.cu, layouts as in attention.hpp).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Largest head size of the tiled kernels (attention.cu's take the rest).
constexpr int tiled_max_head_dim = 128;

/// out and lse (may be null) as attention_forward, q/k/v/out of element
/// type t; false (nothing launched) when g.dh exceeds tiled_max_head_dim or
/// the sequence has more 32-row tiles than a grid's y dimension holds.
bool attention_forward_tiled(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                             const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse);

/// dq, dk, dv (overwritten; q/k/v/dout/dq/dk/dv of element type t) from
/// lse and delta (dout . out per row and head, [b][h][t], f32); false
/// (nothing launched) as attention_forward_tiled.
bool attention_backward_tiled(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                              const void* v, const float* lse, const void* dout, const float* delta,
                              std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv);

}  // namespace corolla::cuda
