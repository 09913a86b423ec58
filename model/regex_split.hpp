// model/regex_split.hpp — the pre-tokenizer and normalizer steps of
// HuggingFace tokenizer.json files that Llama 3 and Qwen2/3 use: a Split on
// the file's own regex (behavior "Isolated": each match, and any text
// between matches, is a pre-token) and the NFC normalizer. Both run on ICU
// (its regex engine has the Unicode classes, case-insensitive groups and
// look-ahead these patterns use), not on a hand-written approximation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace corolla {

/// The work one split may do, in ICU's units: match-engine time steps
/// (each "on the order of milliseconds", ICU says) and the backtracking
/// stack's bytes. A pattern from a tokenizer.json that backtracks
/// catastrophically on some input then fails that input with a model_error
/// instead of hanging a server or the process.
struct regex_bounds {
  std::int32_t base_steps = 10000;  ///< per split of any text
  std::int32_t steps_per_kib = 100;  ///< plus this per KiB of text
  std::int32_t stack_bytes = 8 << 20;
};

class regex_split {
 public:
  /// Compiles `pattern`; throws model_error naming `where` when ICU refuses it.
  regex_split(const std::string& pattern, const std::string& where, regex_bounds bounds = {});
  ~regex_split();
  regex_split(const regex_split&) = delete;
  regex_split& operator=(const regex_split&) = delete;

  /// Appends the pre-tokens of `text` (UTF-8) to `out`: views into `text`
  /// whose concatenation is `text`. Thread-safe. Throws model_error when
  /// the match exceeds the bounds.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// `text` (UTF-8) in Unicode normalization form C. Throws model_error when
/// ICU cannot.
std::string nfc(std::string_view text);

}  // namespace corolla
