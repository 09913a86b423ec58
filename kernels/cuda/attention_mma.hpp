// kernels/cuda/attention_mma.hpp — causal grouped-query attention for
// training on the tensor cores: bf16 or f16 operands, f32 accumulation and
// softmax (host-only header; the kernels are in attention_mma.cu, layouts as
// in attention.hpp). The backend takes this path for bf16 and f16 tensors
// (their values are 16-bit already; f16 multiplies in f16), and for f32
// ones when products run at bf16 precision (set_matmul_precision(bf16),
// `--matmul bf16`); f32 at the f32 and tf32 settings keeps
// attention_tiled.cu's f32-arithmetic kernels.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// The tensor-core kernel family the launchers below use: the register
/// kernels (fa, the default; attention_fa_kernels.cuh) or the WMMA ones
/// (wmma; attention_mma_kernels.cuh). Read from COROLLA_ATTENTION_KERNELS
/// (unset, "fa" or "wmma") at every call, so a benchmark can time both in
/// one process; any other value is an invalid_argument naming it.
enum class mma_attention_kernels { fa, wmma };
mma_attention_kernels mma_attention_kernels_in_use();

/// Whether the tensor-core kernels take this geometry and these pointers on
/// the current device: head size 32, 64, 96 or 128, every pointer 16-byte
/// aligned, kernels compiled for sm_80 or newer (bf16 tensor cores) in this
/// binary, and the family in use's shared memory within the device's limit. Otherwise the
/// launchers below launch nothing and return false.
bool attention_mma_supported(const attention_dims& g, std::initializer_list<const void*> pointers);

/// out and lse (may be null) as attention_forward, or false (nothing
/// launched) when !attention_mma_supported or the storage `t` is not f32,
/// bf16 or f16. q, k, v, out of storage t; bf16 ones give the f32 path's
/// results on the same (bf16) values, rounded once; f16 ones run the same
/// kernels with f16 tiles, P and dS.
bool attention_forward_mma(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                           const void* v, std::int64_t batch, std::int64_t seq, void* out, float* lse);

/// dq, dk, dv (overwritten, storage t) from lse and delta (dout . out per
/// row and head, [b][h][t]), or false (nothing launched) as attention_forward_mma.
bool attention_backward_mma(stream_t s, const attention_dims& g, elem t, const void* q, const void* k,
                            const void* v, const float* lse, const void* dout, const float* delta,
                            std::int64_t batch, std::int64_t seq, void* dq, void* dk, void* dv);

}  // namespace corolla::cuda
