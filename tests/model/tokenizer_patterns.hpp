// tests/model/tokenizer_patterns.hpp — the pre-tokenizer regexes of real
// tokenizer.json files, as those files spell them, for the tokenizer tests.
#pragma once

#include <string>

namespace corolla::testing {

/// Llama 3's Split pattern (digits in threes).
inline const std::string llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// Qwen2's (and Qwen3's) Split pattern (digits one at a time).
inline const std::string qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// GPT-2's, which its ByteLevel pre-tokenizer runs when use_regex is true.
inline const std::string gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace corolla::testing
