// kernels/weight_format.hpp — how an inference weight is stored: f32, bf16,
// int8 per output channel (Backend::linear_q8) or 4-bit NormalFloat in
// blocks of 64 (Backend::linear_nf4, kernels/nf4.hpp). The format of the
// `--weights` flag, of a server's SpanInfo.weights and of its DHT record.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/nf4.hpp"

namespace corolla {

enum class weight_format : std::uint8_t { f32, bf16, int8, nf4 };

/// The name on the wire, in DHT records and in JSON: "f32", "bf16", "i8"
/// (as dtype_name(dtype::i8), which servers announced before nf4 existed)
/// or "nf4".
constexpr const char* weight_format_name(weight_format f) {
  switch (f) {
    case weight_format::f32: return "f32";
    case weight_format::bf16: return "bf16";
    case weight_format::int8: return "i8";
    case weight_format::nf4: return "nf4";
  }
  return "?";
}

/// The name a --weights flag gives it: "int8" where the wire says "i8".
constexpr const char* weight_format_flag(weight_format f) {
  return f == weight_format::int8 ? "int8" : weight_format_name(f);
}

/// The format named `text`: a wire name above, or the flag's "int8".
constexpr std::optional<weight_format> weight_format_named(std::string_view text) {
  if (text == "f32") return weight_format::f32;
  if (text == "bf16") return weight_format::bf16;
  if (text == "int8" || text == "i8") return weight_format::int8;
  if (text == "nf4") return weight_format::nf4;
  return std::nullopt;
}

/// Formats read with scales through a quantised product (linear_q8 or
/// linear_nf4) rather than Backend::linear.
constexpr bool is_quantized(weight_format f) { return f == weight_format::int8 || f == weight_format::nf4; }

/// Bytes a linear weight [out, in] stored as `f` takes, scales included:
/// 4 or 2 per value (f32, bf16); 1 per value and a 4-byte scale per row
/// (int8); half a byte per value, rows padded to whole bytes, and a 4-byte
/// absmax per block of 64 (nf4).
constexpr std::int64_t stored_weight_bytes(std::int64_t out, std::int64_t in, weight_format f) {
  switch (f) {
    case weight_format::f32: return 4 * out * in;
    case weight_format::bf16: return 2 * out * in;
    case weight_format::int8: return out * in + 4 * out;
    case weight_format::nf4: return out * nf4_row_bytes(in) + 4 * out * nf4_row_blocks(in);
  }
  return 4 * out * in;
}

}  // namespace corolla
