// kernels/cuda/device_math.cuh — device-side helpers shared by the .cu files:
// element loads/stores for f32/bf16/f16 storage (device_elem.cuh; math is
// always f32), warp and block reductions (device_reduce.cuh), the
// launch geometry of grid-stride loops, and allow_smem.
// Included only by .cu files (nvcc, C++17).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_elem.cuh"
#include "kernels/cuda/device_reduce.cuh"

namespace corolla::cuda {

/// Threads per block of the grid-stride elementwise kernels.
constexpr int elementwise_threads = 256;

/// The largest gridDim.y (and z) a launch may use.
constexpr std::int64_t max_grid_y = 65535;

/// Blocks for a grid-stride loop over n elements: enough to fill the GPU
/// several times over, capped (the loop covers the rest).
inline unsigned grid_for(std::int64_t n, int threads = elementwise_threads) {
  std::int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

/// allow_smem on the kernel's address (device.cu): sets the attribute on
/// the current device unless a size at least as large was set there before
/// (a record kept under one lock with the call, so threads never lower it).
void allow_smem_for(const void* kernel, std::size_t bytes);

/// Lets `kernel` launch with `bytes` of dynamic shared memory: above 48 KiB
/// that takes an opt-in, which is per device. The attribute is set once per
/// kernel, device and larger size (callers may run on several devices).
/// Throws as COROLLA_CUDA_CHECK does.
template <class Kernel>
void allow_smem(Kernel kernel, std::size_t bytes) {
  allow_smem_for(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace corolla::cuda
