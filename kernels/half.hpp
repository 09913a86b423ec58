// kernels/half.hpp — bf16 and f16 <-> f32 conversions on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace corolla {

/// bf16 bits -> f32 (exact).
inline float bf16_to_f32(std::uint16_t h) {
  std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// f32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))
    return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// IEEE half bits -> f32 (exact, including subnormals, inf, NaN).
float f16_to_f32(std::uint16_t h);
/// f32 -> IEEE half bits, round to nearest even, overflow to inf.
std::uint16_t f32_to_f16(float f);

/// Bulk conversions (n elements).
void bf16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f16_to_f32(const std::uint16_t* src, float* dst, std::size_t n);
void f32_to_bf16(const float* src, std::uint16_t* dst, std::size_t n);
void f32_to_f16(const float* src, std::uint16_t* dst, std::size_t n);

}  // namespace corolla
