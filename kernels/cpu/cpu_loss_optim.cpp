// kernels/cpu/cpu_loss_optim.cpp — softmax cross-entropy and the AdamW step.
#include <cmath>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {

void cpu_backend_impl::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                                     Tensor* dlogits, float grad_scale) {
  require_host(logits, dtype::f32, "cross_entropy logits");
  require_that(logits.rank() == 2, "cross_entropy logits", "expected a 2-D [N, V] tensor");
  const std::int64_t n = logits.dim(0), vocab = logits.dim(1);
  require(targets, dtype::i32, {n}, "cross_entropy targets");
  require(losses, dtype::f32, {n}, "cross_entropy losses");
  if (dlogits) require(*dlogits, dtype::f32, {n, vocab}, "cross_entropy dlogits");
  const std::int32_t* tp = targets.data<std::int32_t>();
  for (std::int64_t r = 0; r < n; ++r)  // before the parallel loop: nothing throws inside it
    if (tp[r] != -1 && (tp[r] < 0 || tp[r] >= vocab))
      throw tensor_error("cross_entropy: target " + std::to_string(tp[r]) + " at row " +
                         std::to_string(r) + " is outside [0, " + std::to_string(vocab) +
                         ") and is not -1 (ignored)");
  const float* lp = logits.data<float>();
  float* out = losses.data<float>();
  float* dp = dlogits ? dlogits->data<float>() : nullptr;

  parallel_for(n, 4 * vocab, [&](std::int64_t r) {
    const float* l = lp + r * vocab;
    float* d = dp ? dp + r * vocab : nullptr;
    const std::int32_t t = tp[r];
    if (t == -1) {
      out[r] = 0.0f;
      if (d)
        for (std::int64_t i = 0; i < vocab; ++i) d[i] = 0.0f;
      return;
    }
    float mx = l[0];
    for (std::int64_t i = 1; i < vocab; ++i) mx = l[i] > mx ? l[i] : mx;
    const float target_logit = l[t];  // read before d (which may alias l) is written
    double sum = 0.0;
    if (d) {
      for (std::int64_t i = 0; i < vocab; ++i) {
        const float e = std::exp(l[i] - mx);
        d[i] = e;
        sum += e;
      }
    } else {
      for (std::int64_t i = 0; i < vocab; ++i) sum += std::exp(l[i] - mx);
    }
    // loss = logsumexp - l[t] = (max - l[t]) + log(sum exp(l - max))
    out[r] = (mx - target_logit) + static_cast<float>(std::log(sum));
    if (d) {
      const float f = static_cast<float>(grad_scale / sum);
#pragma omp simd
      for (std::int64_t i = 0; i < vocab; ++i) d[i] *= f;
      d[t] -= grad_scale;
    }
  });
}

void cpu_backend_impl::adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                             const adamw_params& p, std::int64_t step) {
  require_host(params, dtype::f32, "adamw params");
  require_host(grads, dtype::f32, "adamw grads");
  require_host(m, dtype::f32, "adamw m");
  require_host(v, dtype::f32, "adamw v");
  const std::int64_t n = params.numel();
  require_that(grads.numel() == n && m.numel() == n && v.numel() == n, "adamw",
               "params, grads, m and v must have the same number of elements");
  require_that(step >= 1, "adamw", "step counts from 1");

  const adamw_step_scalars k = adamw_scalars_for(p, step);  // as torch.optim.AdamW computes them
  const float decay = k.decay, step_size = k.step_size, bc2_sqrt = k.bc2_sqrt;
  const float beta1 = k.beta1, beta2 = k.beta2, eps = k.eps;
  const float one_minus_b1 = k.one_minus_b1, one_minus_b2 = k.one_minus_b2, grad_scale = k.grad_scale;
  float* pp = params.data<float>();
  const float* gp = grads.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  parallel_ranges(n, 8, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) {
      const float g = gp[i] * grad_scale;
      const float mi = beta1 * mp[i] + one_minus_b1 * g;
      const float vi = beta2 * vp[i] + one_minus_b2 * g * g;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      pp[i] = pp[i] * decay - step_size * (mi / denom);
      mp[i] = mi;
      vp[i] = vi;
    }
  });
}

}  // namespace corolla::cpu
