// kernels/cuda/attention_mma.hpp — causal grouped-query attention for
// training on the tensor cores: bf16 operands, f32 accumulation and softmax
// (host-only header; the kernels are in attention_mma.cu, layouts as in
// attention.hpp). The backend takes this path when products run at bf16
// precision (set_matmul_precision(bf16), `--matmul bf16`); the f32 and tf32
// settings keep attention_tiled.cu's f32 kernels.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Whether the tensor-core kernels take this geometry and these pointers on
/// the current device: head size 32, 64, 96 or 128, every pointer 16-byte
/// aligned, kernels compiled for sm_80 or newer (bf16 WMMA) in this binary,
/// and their shared memory within the device's limit. Otherwise the
/// launchers below launch nothing and return false.
bool attention_mma_supported(const attention_dims& g, std::initializer_list<const void*> pointers);

/// out and lse (may be null) as attention_forward, or false (nothing
/// launched) when !attention_mma_supported.
bool attention_forward_mma(stream_t s, const attention_dims& g, const float* q, const float* k,
                           const float* v, std::int64_t batch, std::int64_t seq, float* out,
                           float* lse);

/// dq, dk, dv (overwritten) from lse and delta (dout . out per row and head,
/// [b][h][t]), or false (nothing launched) when !attention_mma_supported.
bool attention_backward_mma(stream_t s, const attention_dims& g, const float* q, const float* k,
                            const float* v, const float* lse, const float* dout, const float* delta,
                            std::int64_t batch, std::int64_t seq, float* dq, float* dk, float* dv);

}  // namespace corolla::cuda
