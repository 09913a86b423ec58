// kernels/cuda/embedding_kernels.cuh — the embedding gather and scatter-add
// kernels. Included by embedding.cu, and by tests/cuda_emulated/, which runs
// them on the CPU against an emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/grid_dependency.cuh"

namespace corolla::cuda {
namespace {

template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* ids, const T* table, T* out,
                                         std::int64_t n, std::int64_t d) {
  allow_dependents();  // early launch (grid_dependency.cuh): the next kernel may be scheduled now,
  await_producers();   // and this one touches nothing before the kernel before it is done
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < n * d;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = k / d, c = k % d;
    out[k] = table[static_cast<std::int64_t>(ids[i]) * d + c];
  }
}

__global__ void embedding_backward_kernel(const std::int32_t* ids, const float* dout,
                                          float* dtable, std::int64_t n, std::int64_t d) {
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < n * d;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = k / d, c = k % d;
    atomicAdd(dtable + static_cast<std::int64_t>(ids[i]) * d + c, dout[k]);
  }
}

}  // namespace
}  // namespace corolla::cuda
