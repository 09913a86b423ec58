// kernels/cuda/loss_optim.hpp — cross-entropy and AdamW launchers
// (host-only; f32 device pointers).
#pragma once

#include <cstdint>

#include "kernels/adamw_scalars.hpp"
#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Per row of logits [n, vocab]: losses[r] = logsumexp - logit[target]
/// (0 for target -1); dlogits (may alias logits, may be null) gets
/// (softmax - onehot) * grad_scale, zero rows for ignored targets. Targets
/// are device i32 already checked to be -1 or in [0, vocab).
void cross_entropy(stream_t s, const float* logits, const std::int32_t* targets, float* losses,
                   float* dlogits, float grad_scale, std::int64_t n, std::int64_t vocab);

/// params, m, v updated in place from grads (n elements each), with the
/// step's scalars from adamw_scalars_for (computed on the host exactly as
/// the CPU backend does).
void adamw(stream_t s, float* params, const float* grads, float* m, float* v,
           const adamw_step_scalars& k, std::int64_t n);

}  // namespace corolla::cuda
