// kernels/adamw_scalars.hpp — the per-step scalars of AdamW, a plain struct
// shared by the backends' interface (kernels/backend.hpp computes them) and
// the CUDA kernels' launcher (kernels/cuda/loss_optim.hpp, compiled by nvcc
// as C++17, which is why it stands alone).
#pragma once

namespace corolla {

/// The scalars of one AdamW step as torch.optim.AdamW's single-tensor path
/// computes them (in double, rounded to f32 where torch hands them to an f32
/// kernel). Every backend's adamw takes them from adamw_scalars_for, so they
/// agree bit for bit on everything but the element-wise arithmetic.
struct adamw_step_scalars {
  float decay = 1.0f;      ///< 1 - lr * weight_decay
  float step_size = 0.0f;  ///< lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;   ///< sqrt(1 - beta2^step)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float one_minus_b1 = 0.1f, one_minus_b2 = 0.001f;
  float grad_scale = 1.0f;  ///< gradients are multiplied by this first (adamw_params::grad_scale)
};

}  // namespace corolla
