// kernels/cuda/convert_kernels.cuh — the f32 / bf16 / f16 conversion kernel.
// Included by convert.cu, and by tests/cuda_emulated/, which runs them on the
// CPU against an emulation of the CUDA features they use.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_elem.cuh"

namespace corolla::cuda {
namespace {

template <class Src, class Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    store_f32(dst, i, load_f32(src, i));
}

}  // namespace
}  // namespace corolla::cuda
