// kernels/cuda/rope.cu — rotary position embedding (HuggingFace rotate-half).
// The angle is computed in double and cos/sin rounded to f32 once, exactly
// as kernels/cpu/cpu_rope.cpp builds its tables, so both backends rotate by
// the same f32 cos/sin (up to the last bit of the two libms' double
// cos/sin); no table is kept on the device.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/rope.hpp"

namespace corolla::cuda {
namespace {

/// One thread per (row, head, i < head_dim/2).
__global__ void rope_kernel(float* x, const std::int32_t* positions, std::int64_t n, int heads,
                            int head_dim, double theta, float sign) {
  const int half = head_dim / 2;
  const std::int64_t total = n * heads * half;
  for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < total;
       k += std::int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(k % half);
    const std::int64_t rh = k / half;  // row * heads + head
    const std::int64_t row = rh / heads;
    const double inv_freq = pow(theta, -2.0 * i / static_cast<double>(head_dim));
    const double angle = static_cast<double>(positions[row]) * inv_freq;
    const float c = static_cast<float>(cos(angle));
    const float sn = sign * static_cast<float>(sin(angle));
    float* x1 = x + rh * head_dim;  // row * (heads * head_dim) + head * head_dim
    float* x2 = x1 + half;
    const float a = x1[i], b = x2[i];
    x1[i] = a * c - b * sn;
    x2[i] = b * c + a * sn;
  }
}

}  // namespace

void rope(stream_t s, float* x, const std::int32_t* positions, std::int64_t n, int heads,
          int head_dim, float theta, bool inverse) {
  const std::int64_t total = n * heads * (head_dim / 2);
  if (total <= 0) return;
  rope_kernel<<<grid_for(total), elementwise_threads, 0, s>>>(
      x, positions, n, heads, head_dim, static_cast<double>(theta), inverse ? -1.0f : 1.0f);
  COROLLA_CUDA_LAUNCH_CHECK("rope_kernel");
}

}  // namespace corolla::cuda
