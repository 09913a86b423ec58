// kernels/cuda/loss_optim_kernels.cuh — the softmax cross-entropy and AdamW
// kernels. Included by loss_optim.cu, and by tests/cuda_emulated/, which
// runs them on the CPU against an emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/adamw_scalars.hpp"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {
namespace {

constexpr int ce_threads = 256;

/// Three passes over the row: max, sum of exp (f64, like the CPU), then the
/// gradient. Every read of a logit happens before the block's first write
/// (block reductions separate the passes), so dlogits may alias logits; in
/// the last pass each thread reads its element before overwriting it.
template <class T>
__global__ void cross_entropy_kernel(const T* logits, const std::int32_t* targets, float* losses, T* dlogits,
                                     float grad_scale, std::int64_t vocab) {
  const std::int64_t row = blockIdx.x;
  const T* l = logits + row * vocab;
  T* d = dlogits ? dlogits + row * vocab : nullptr;
  const std::int32_t t = targets[row];
  if (t == -1) {  // uniform per block: no thread reaches a reduction
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (d)
      for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) store_f32(d, i, 0.0f);
    return;
  }
  const float target_logit = load_f32(l, t);
  float mx = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, load_f32(l, i));
  mx = block_max(mx);
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(load_f32(l, i) - mx);
  sum = block_sum(sum);
  // loss = logsumexp - l[t] = (max - l[t]) + log(sum exp(l - max))
  if (threadIdx.x == 0) losses[row] = (mx - target_logit) + static_cast<float>(log(sum));
  if (d) {
    const float f = static_cast<float>(grad_scale / sum);
    for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float g = expf(load_f32(l, i) - mx) * f;
      store_f32(d, i, i == t ? g - grad_scale : g);
    }
  }
}

/// Element i of an AdamW step: m[i], v[i] and params[i] updated; returns
/// the new params[i].
__device__ __forceinline__ float adamw_element(std::int64_t i, float* params, const float* grads, float* m, float* v,
                                               const adamw_step_scalars& k) {
  const float g = grads[i] * k.grad_scale;
  const float mi = k.beta1 * m[i] + k.one_minus_b1 * g;
  const float vi = k.beta2 * v[i] + k.one_minus_b2 * g * g;
  const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
  const float p = params[i] * k.decay - k.step_size * (mi / denom);
  params[i] = p;
  m[i] = mi;
  v[i] = vi;
  return p;
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v,
                             adamw_step_scalars k, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    adamw_element(i, params, grads, m, v, k);
}

/// adamw_kernel that also writes each updated parameter, rounded once, into
/// copy (CT: bf16 or f16; the 16-bit compute weights of mixed precision),
/// as the conversion kernel would (store_f32): the same bits as the update
/// followed by a copy, in one pass.
template <class CT>
__global__ void adamw_copy_kernel(float* params, const float* grads, float* m, float* v, CT* copy,
                                  adamw_step_scalars k, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    store_f32(copy, i, adamw_element(i, params, grads, m, v, k));
}

}  // namespace
}  // namespace corolla::cuda
