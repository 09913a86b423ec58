// kernels/nf4.hpp — 4-bit NormalFloat (NF4) as bitsandbytes defines it
// (Dettmers et al., QLoRA): 16 codes, the quantiles of a standard normal
// rescaled to [-1, 1] with an exact 0; weights in blocks of 64 consecutive
// values of a row, each block scaled by its absmax. The one definition the
// CPU and CUDA kernels and the tests share.
//
// Layout of an NF4 weight [out, in] (Backend::quantize_nf4):
//   * q: i8 [out, nf4_row_bytes(in)], two codes per byte, value 2j of a row
//     in the high nibble of byte j and value 2j+1 in the low nibble (the
//     order of bitsandbytes' packing); an odd row ends in a low nibble of
//     code 7 (0.0);
//   * absmax: f32 [out, nf4_row_blocks(in)], the max |w| of each block.
// Blocks never straddle rows, so row slices of a stacked weight are
// weights in their own right (q, k, v in one stack). For in % 64 == 0 (every
// real model) this is bitsandbytes' blockwise layout of the row-major
// tensor. The absmax stay f32 (no double quantisation): 4.5 bits a weight.
//
// Quantisation: n = w * (1 / absmax), code = the number of midpoints between
// consecutive codes below n (the nearest code; bitsandbytes' dQuantizeNF4
// decision tree, with the same midpoints). An all-zero block has absmax 0
// and codes 7. Dequantisation: w' = nf4_codes[code] * absmax in f32, so
// |w - w'| <= nf4_max_error * absmax.
#pragma once

#include <cstdint>

namespace corolla {

inline constexpr int nf4_block = 64;

inline constexpr float nf4_codes[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/// The decision thresholds of bitsandbytes' dQuantizeNF4, ascending: code i
/// covers (nf4_midpoints[i-1], nf4_midpoints[i]].
inline constexpr float nf4_midpoints[15] = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,  0.2035212516784668f,   0.2920137718319893f,   0.3893125355243683f,
    0.5016634166240692f,  0.6427869200706482f,   0.8614784181118011f,
};

/// Half the widest gap between consecutive codes (between -1.0 and -0.6962):
/// the largest rounding error relative to a block's absmax.
inline constexpr float nf4_max_error = 0.5f * (1.0f - 0.6961928009986877f);

/// The code of a value already divided by its block's absmax.
inline int nf4_index(float normalized) {
  int code = 0;
  for (float m : nf4_midpoints) code += normalized > m ? 1 : 0;
  return code;
}

inline constexpr std::int64_t nf4_row_bytes(std::int64_t in) { return (in + 1) / 2; }
inline constexpr std::int64_t nf4_row_blocks(std::int64_t in) { return (in + nf4_block - 1) / nf4_block; }

/// The tables a device kernel takes by value (it has no access to the
/// host's constexpr arrays).
struct nf4_tables {
  float code[16];
  float midpoint[15];
};

inline nf4_tables nf4_tables_of() {
  nf4_tables t{};
  for (int i = 0; i < 16; ++i) t.code[i] = nf4_codes[i];
  for (int i = 0; i < 15; ++i) t.midpoint[i] = nf4_midpoints[i];
  return t;
}

}  // namespace corolla
