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

/// One parameter's AdamW step in registers: m, v and p updated from the
/// raw gradient g (times k.grad_scale).
__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, const adamw_step_scalars& k) {
  g *= k.grad_scale;
  m = k.beta1 * m + k.one_minus_b1 * g;
  v = k.beta2 * v + k.one_minus_b2 * g * g;
  const float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
  p = p * k.decay - k.step_size * (m / denom);
}

/// Element i of an AdamW step: m[i], v[i] and params[i] updated; returns
/// the new params[i].
__device__ __forceinline__ float adamw_element(std::int64_t i, float* params, const float* grads, float* m, float* v,
                                               const adamw_step_scalars& k) {
  float p = params[i], mi = m[i], vi = v[i];
  adamw_update(p, grads[i], mi, vi, k);
  params[i] = p;
  m[i] = mi;
  v[i] = vi;
  return p;
}

/// What the AdamW kernels write besides params, m and v: nothing
/// (adamw_no_copy), or each updated parameter rounded once into the 16-bit
/// compute copy (bf16 or f16), as the conversion kernel stores it.
struct adamw_no_copy {};
/// Parameter i into the copy, rounded once (store_f32); nothing without one.
template <class CT>
__device__ __forceinline__ void store_copy(CT* copy, std::int64_t i, float p) {
  store_f32(copy, i, p);
}
__device__ __forceinline__ void store_copy(adamw_no_copy*, std::int64_t, float) {}

/// One parameter per thread (grid-stride): where the pointers share no
/// 16-byte alignment, and the few before their first 16-byte boundary.
template <class CT>
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, CT* copy, adamw_step_scalars k,
                             std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    store_copy(copy, i, adamw_element(i, params, grads, m, v, k));
  }
}

/// Four parameters per thread (grid-stride over n / 4 groups) with 16-byte
/// loads and stores of params, grads, m and v (each 16-byte aligned): the
/// step is memory-bound (28 bytes a parameter, 30 with a bf16 copy), and
/// wide accesses move four times the bytes per instruction. The n % 4
/// parameters past the last group go to the grid's first threads, one each.
/// Every parameter's arithmetic is adamw_update's: the same bits as
/// adamw_kernel.
template <class CT>
__global__ void adamw_vec4_kernel(float* params, const float* grads, float* m, float* v, CT* copy,
                                  adamw_step_scalars k, std::int64_t n) {
  const std::int64_t groups = n / 4;
  const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  for (std::int64_t q = first; q < groups; q += std::int64_t{gridDim.x} * blockDim.x) {
    float4 p = reinterpret_cast<const float4*>(params)[q];
    const float4 g = reinterpret_cast<const float4*>(grads)[q];
    float4 mq = reinterpret_cast<const float4*>(m)[q];
    float4 vq = reinterpret_cast<const float4*>(v)[q];
    adamw_update(p.x, g.x, mq.x, vq.x, k);
    adamw_update(p.y, g.y, mq.y, vq.y, k);
    adamw_update(p.z, g.z, mq.z, vq.z, k);
    adamw_update(p.w, g.w, mq.w, vq.w, k);
    reinterpret_cast<float4*>(params)[q] = p;
    reinterpret_cast<float4*>(m)[q] = mq;
    reinterpret_cast<float4*>(v)[q] = vq;
    store_copy(copy, 4 * q, p.x);
    store_copy(copy, 4 * q + 1, p.y);
    store_copy(copy, 4 * q + 2, p.z);
    store_copy(copy, 4 * q + 3, p.w);
  }
  if (first < n - 4 * groups) {
    const std::int64_t i = 4 * groups + first;
    store_copy(copy, i, adamw_element(i, params, grads, m, v, k));
  }
}

}  // namespace
}  // namespace corolla::cuda
