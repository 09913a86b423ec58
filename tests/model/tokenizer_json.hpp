// tests/model/tokenizer_json.hpp — pieces of tokenizer.json files for the
// tokenizer tests: the pre-tokenizer regexes of real files, as those files
// spell them, and the JSON of a BPE model, an added token and a Split
// pre-tokenizer as HF's tokenizers writes them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace corolla::testing {

/// Llama 3's Split pattern (digits in threes).
inline const std::string llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// Qwen2's (and Qwen3's) Split pattern (digits one at a time).
inline const std::string qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// GPT-2's, which its ByteLevel pre-tokenizer runs when use_regex is true.
inline const std::string gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// An entry of "added_tokens" (normalized exactly when not special, as HF
/// writes them).
inline nlohmann::json added_token_json(int id, const std::string& content, bool lstrip = false, bool rstrip = false,
                                       bool special = true) {
  return {{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", !special}, {"special", special}};
}

/// Llama 3's and Qwen's pre-tokenizer: an isolating Split on `pattern`,
/// then the byte-level mapping without GPT-2's regex.
inline nlohmann::json split_pre_tokenizer_json(const std::string& pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

/// A byte-level BPE "model" section.
inline nlohmann::json bpe_model_json(const nlohmann::json& vocab, const nlohmann::json& merges, bool ignore_merges) {
  return {{"type", "BPE"},          {"dropout", nullptr},
          {"unk_token", nullptr},   {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
          {"byte_fallback", false}, {"ignore_merges", ignore_merges},
          {"vocab", vocab},         {"merges", merges}};
}

}  // namespace corolla::testing
