// actors/fault_corruption.hpp — wrong outputs on purpose, for faultlab's
// `corrupt` fault (a broken GPU or a malicious volunteer): what a corrupted
// span server returns instead of its real answer.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "kernels/tensor.hpp"

namespace corolla {

/// A copy of `t` (f32 [rows, width] on the host) with Gaussian noise as
/// large as each row's RMS added to every value: far outside what honest
/// servers differ by, and different for every `seed` (the step id), so
/// no two corrupt answers agree with each other either.
inline Tensor corrupted_copy(const Tensor& t, std::uint64_t seed) {
  Tensor out = t.clone();
  if (out.type() != dtype::f32 || out.shape().size() != 2) return out;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const std::int64_t rows = out.dim(0), width = out.dim(1);
  float* p = out.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    double sq = 0;
    for (std::int64_t c = 0; c < width; ++c) sq += static_cast<double>(p[r * width + c]) * p[r * width + c];
    const float rms = width > 0 ? static_cast<float>(std::sqrt(sq / static_cast<double>(width))) : 0.0f;
    const float scale = rms > 0 ? rms : 1.0f;
    for (std::int64_t c = 0; c < width; ++c) p[r * width + c] += scale * noise(rng);
  }
  return out;
}

}  // namespace corolla
