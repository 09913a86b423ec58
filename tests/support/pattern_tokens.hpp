// tests/support/pattern_tokens.hpp — a repeated phrase of eight token ids,
// something a LoRA adapter learns in a few steps: as ids in memory and as
// a raw uint16 token file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "tests/support/tiny_model.hpp"

namespace corolla::testing {

/// n ids of the phrase 3 17 5 42 9 23 31 8, starting `offset` into it.
inline std::vector<std::int32_t> pattern_ids(int n, int offset) {
  static const int p[] = {3, 17, 5, 42, 9, 23, 31, 8};
  std::vector<std::int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(p[(i + offset) % 8]);
  return v;
}

/// The phrase 64 times as a raw uint16 token file.
inline void write_pattern(const std::filesystem::path& file) {
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 64; ++i)
    for (std::uint16_t t : {3, 17, 5, 42, 9, 23, 31, 8}) tokens.push_back(t);
  write_raw_u16(file, tokens);
}

}  // namespace corolla::testing
