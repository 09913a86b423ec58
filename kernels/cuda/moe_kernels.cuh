// kernels/cuda/moe_kernels.cuh — the row moves of a mixture-of-experts MLP
// (Backend::moe_gather, moe_combine, moe_combine_weight_grad). The rows are
// T (f32, or bf16 / f16 under mixed precision: loaded widened, computed in
// f32, rounded once on store); routing weights and their gradient are f32.
// Included by moe.cu, and by tests/cuda_emulated/, which runs them on the
// CPU against an emulation of the CUDA features they use.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"
#include "kernels/cuda/grid_dependency.cuh"

namespace corolla::cuda {
namespace {

/// out[r, c] = src[rows[r], c] * (weights ? weights[r] : 1), one element per
/// thread of a grid-stride loop over m * d.
template <class T>
__global__ void moe_gather_kernel(const T* src, const std::int32_t* rows, const float* weights, T* out,
                                  std::int64_t m, std::int64_t d) {
  allow_dependents();  // early launch (grid_dependency.cuh)
  await_producers();
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < m * d;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / d, c = i % d;
    const float v = load_f32(src, static_cast<std::int64_t>(rows[r]) * d + c);
    store_f32(out, i, weights ? v * weights[r] : v);
  }
}

/// out[t, c] = (accumulate ? out[t, c] : 0) + sum_j w[t, j] * src[slots[t, j], c],
/// summed in slot order (no atomics: each output element is one thread's).
template <class T>
__global__ void moe_combine_kernel(const T* src, const std::int32_t* slots, const float* weights, T* out,
                                   std::int64_t n, std::int64_t k, std::int64_t d, bool accumulate) {
  allow_dependents();
  await_producers();
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n * d;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = i / d, c = i % d;
    float acc = accumulate ? load_f32(out, i) : 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const float v = load_f32(src, static_cast<std::int64_t>(slots[t * k + j]) * d + c);
      acc += weights ? weights[t * k + j] * v : v;
    }
    store_f32(out, i, acc);
  }
}

/// dweights[p] = dot(dy[p / k, :], src[slots[p], :]): one block per (t, j)
/// pair p, its threads striding over the d columns, then a block sum.
template <class T>
__global__ void moe_combine_weight_grad_kernel(const T* dy, const T* src, const std::int32_t* slots,
                                               float* dweights, std::int64_t k, std::int64_t d) {
  allow_dependents();
  await_producers();
  const std::int64_t p = blockIdx.x;
  const T* g = dy + (p / k) * d;
  const T* r = src + static_cast<std::int64_t>(slots[p]) * d;
  float acc = 0.0f;
  for (std::int64_t c = threadIdx.x; c < d; c += blockDim.x) acc += load_f32(g, c) * load_f32(r, c);
  acc = block_sum(acc);
  if (threadIdx.x == 0) dweights[p] = acc;
}

}  // namespace
}  // namespace corolla::cuda
