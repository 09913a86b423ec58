// kernels/cuda/embedding.hpp — table lookup launchers (host-only). Ids are
// device i32 already checked to lie in [0, V) by the caller.
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// out[i, :] = table[ids[i], :] for n ids, rows of d (storage type t).
void embedding_forward(stream_t s, elem t, const std::int32_t* ids, const void* table, void* out,
                       std::int64_t n, std::int64_t d);
/// dtable[ids[i], :] += dout[i, :] (f32, atomicAdd: repeated ids add up in
/// an unspecified order).
void embedding_backward(stream_t s, const std::int32_t* ids, const float* dout, float* dtable,
                        std::int64_t n, std::int64_t d);

}  // namespace corolla::cuda
