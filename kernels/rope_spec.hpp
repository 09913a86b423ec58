// kernels/rope_spec.hpp — what the rotary embedding rotates by: plain RoPE
// (theta) or one of HuggingFace's rope_scaling types, as
// transformers/modeling_rope_utils.py computes their frequencies:
//
//   plain   inv_freq_i = theta^(-2i/Dh)
//   linear  inv_freq_i / factor
//   llama3  wavelengths above original/low_freq_factor divided by factor,
//           below original/high_freq_factor kept, a smooth mix between
//   yarn    a ramp between interpolation (inv_freq_i / factor) and
//           extrapolation (inv_freq_i) over dimensions [low, high] found
//           from beta_fast/beta_slow; cos and sin scaled by an attention
//           factor (0.1 ln(factor) + 1 by default)
//
// Both backends evaluate inv_freq(i) in double from this one definition
// (the CUDA kernels on the device), so they rotate by the same f32 cos/sin
// up to the last bit of the two libms' double pow/cos/sin.
// Dynamic NTK scaling changes the frequencies with the sequence length
// (keys cached at one length would be rotated for another): not offered;
// model/config.cpp refuses it with the reason.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define COROLLA_HOST_DEVICE __host__ __device__
#else
#define COROLLA_HOST_DEVICE
#endif

namespace corolla {

enum class rope_kind : std::int32_t { plain, linear, llama3, yarn };

struct rope_spec {
  rope_kind kind = rope_kind::plain;
  double theta = 10000.0;
  double factor = 1.0;                     ///< linear, llama3, yarn
  double low_freq_factor = 1.0;            ///< llama3
  double high_freq_factor = 4.0;           ///< llama3
  double original_max_positions = 8192.0;  ///< llama3
  double ramp_low = 0.0, ramp_high = 1.0;  ///< yarn: the dimensions the ramp spans
  double attention_factor = 1.0;           ///< yarn: cos and sin are multiplied by it

  rope_spec() = default;
  /// Plain RoPE with base `theta` (implicit: a theta is a plain spec).
  COROLLA_HOST_DEVICE rope_spec(double base) : theta(base) {}  // NOLINT(google-explicit-constructor)

  /// The inverse frequency of pair i of a head of `head_dim`.
  COROLLA_HOST_DEVICE double inv_freq(int i, int head_dim) const {
    const double base = ::pow(theta, -2.0 * i / static_cast<double>(head_dim));
    switch (kind) {
      case rope_kind::plain: return base;
      case rope_kind::linear: return base / factor;
      case rope_kind::llama3: {
        const double wavelen = 2.0 * 3.14159265358979323846 / base;
        if (wavelen < original_max_positions / high_freq_factor) return base;
        if (wavelen > original_max_positions / low_freq_factor) return base / factor;
        const double s = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        return (1.0 - s) * base / factor + s * base;
      }
      case rope_kind::yarn: {
        const double high = ramp_high == ramp_low ? ramp_high + 0.001 : ramp_high;
        double ramp = (static_cast<double>(i) - ramp_low) / (high - ramp_low);
        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        const double extrapolation = 1.0 - ramp;
        return base / factor * (1.0 - extrapolation) + base * extrapolation;
      }
    }
    return base;
  }

  /// What cos and sin are multiplied by (1 but for yarn).
  COROLLA_HOST_DEVICE double scale() const { return kind == rope_kind::yarn ? attention_factor : 1.0; }

  /// Whether the numbers are usable (theta and factors positive and finite).
  bool valid() const {
    auto pos = [](double v) { return v > 0.0 && isfinite(v); };
    return pos(theta) && pos(factor) && pos(attention_factor) && isfinite(ramp_low) && isfinite(ramp_high) &&
           ramp_low <= ramp_high &&
           (kind != rope_kind::llama3 ||
            (pos(low_freq_factor) && pos(high_freq_factor) && pos(original_max_positions) &&
             high_freq_factor != low_freq_factor));
  }

  bool operator==(const rope_spec& o) const {
    return kind == o.kind && theta == o.theta && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_positions == o.original_max_positions &&
           ramp_low == o.ramp_low && ramp_high == o.ramp_high && attention_factor == o.attention_factor;
  }
};

}  // namespace corolla
