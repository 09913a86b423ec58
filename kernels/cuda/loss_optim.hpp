// kernels/cuda/loss_optim.hpp — cross-entropy and AdamW launchers
// (host-only; device pointers; AdamW's buffers are f32).
#pragma once

#include <cstdint>

#include "kernels/adamw_scalars.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Per row of logits [n, vocab] (element type t, read into f32):
/// losses[r] (f32) = logsumexp - logit[target] (0 for target -1); dlogits
/// (type t; may alias logits, may be null) gets (softmax - onehot) *
/// grad_scale, zero rows for ignored targets. Targets are device i32
/// already checked to be -1 or in [0, vocab).
void cross_entropy(stream_t s, elem t, const void* logits, const std::int32_t* targets, float* losses,
                   void* dlogits, float grad_scale, std::int64_t n, std::int64_t vocab);

/// params, m, v updated in place from grads (n elements each), with the
/// step's scalars from adamw_scalars_for (computed on the host exactly as
/// the CPU backend does).
void adamw(stream_t s, float* params, const float* grads, float* m, float* v,
           const adamw_step_scalars& k, std::int64_t n);
/// adamw, also writing each updated parameter into `copy` (element type
/// `copy_type`: bf16 or f16), rounded once: one pass.
void adamw_with_copy(stream_t s, float* params, const float* grads, float* m, float* v, elem copy_type, void* copy,
                     const adamw_step_scalars& k, std::int64_t n);

}  // namespace corolla::cuda
