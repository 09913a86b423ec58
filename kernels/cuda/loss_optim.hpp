// kernels/cuda/loss_optim.hpp — cross-entropy and AdamW launchers
// (host-only; f32 device pointers).
#pragma once

#include <cstdint>

#include "kernels/cuda/stream.hpp"

namespace corolla::cuda {

/// Per row of logits [n, vocab]: losses[r] = logsumexp - logit[target]
/// (0 for target -1); dlogits (may alias logits, may be null) gets
/// (softmax - onehot) * grad_scale, zero rows for ignored targets. Targets
/// are device i32 already checked to be -1 or in [0, vocab).
void cross_entropy(stream_t s, const float* logits, const std::int32_t* targets, float* losses,
                   float* dlogits, float grad_scale, std::int64_t n, std::int64_t vocab);

/// The scalars of one AdamW step, computed on the host exactly as the CPU
/// backend does (torch.optim.AdamW's single-tensor path).
struct adamw_scalars {
  float decay = 1.0f;        ///< 1 - lr * weight_decay
  float step_size = 0.0f;    ///< lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;     ///< sqrt(1 - beta2^step)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float one_minus_b1 = 0.1f, one_minus_b2 = 0.001f;
};

/// params, m, v updated in place from grads (n elements each).
void adamw(stream_t s, float* params, const float* grads, float* m, float* v,
           const adamw_scalars& k, std::int64_t n);

}  // namespace corolla::cuda
