// kernels/cuda/activation.cuh — the activation functions as device code,
// shared by the elementwise kernels and the GEMV's fused epilogues, so a
// fused and an unfused decode compute the same expression. Free of CUDA
// runtime headers (the emulated tests compile it as host C++).
#pragma once

#include <cmath>

namespace corolla::cuda {
namespace {

/// sqrt(2/pi), the tanh-GELU constant ("gelu_new" in HuggingFace).
constexpr float gelu_k = 0.7978845608028654f;
constexpr float gelu_c = 0.044715f;

/// tanh-approximated GELU.
__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanhf(gelu_k * (v + gelu_c * v * v * v)));
}

/// SwiGLU's product: silu(gate) * up.
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

}  // namespace
}  // namespace corolla::cuda
