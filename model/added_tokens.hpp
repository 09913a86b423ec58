// model/added_tokens.hpp — a byte-level BPE tokenizer's added tokens
// (tokenizer.json's "added_tokens": <|begin_of_text|>, <|im_start|>, ...):
// the text is split on them before any normalising or pre-tokenising, as
// HF's tokenizers does, longest token first at each position; a token with
// `lstrip` / `rstrip` also takes the whitespace (Unicode White_Space) on
// its left / right. `single_word`, and `normalized` content that the NFC
// normalizer would change, are refused with a clear error.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace corolla {

/// One added token.
struct added_token {
  std::string content;
  int id = -1;
  bool lstrip = false;  ///< the match takes the whitespace before it
  bool rstrip = false;  ///< the match takes the whitespace after it
};

/// tokenizer.json's "added_tokens" (none when absent). `where` names the
/// file in errors; `nfc` says whether the file normalises with NFC.
/// Throws model_error for a malformed entry or a flag corolla does not run.
std::vector<added_token> read_added_tokens(const nlohmann::json& file, const std::string& where, bool nfc);

/// Finds added tokens in text.
class added_token_matcher {
 public:
  /// A match: the token's id and the bytes [begin, end) it takes, stripped
  /// whitespace included.
  struct match {
    std::size_t begin = 0, end = 0;
    int id = -1;
  };

  added_token_matcher() = default;
  explicit added_token_matcher(std::vector<added_token> tokens);

  /// The first token at or after byte `from` of `text` (the end of the
  /// previous match); its lstrip never reaches before `from`.
  std::optional<match> next(std::string_view text, std::size_t from) const;

  /// The id of the token whose content is `content`, or -1.
  int id_of(std::string_view content) const;

  /// Every token, longest content first.
  const std::vector<added_token>& tokens() const { return tokens_; }

 private:
  std::vector<added_token> tokens_;
  /// Indices into tokens_ of the tokens starting with each byte, longest
  /// first: most bytes of a text start no token and cost one lookup (Llama
  /// 3's files hold 256 added tokens).
  std::array<std::vector<std::uint16_t>, 256> by_first_byte_;
};

}  // namespace corolla
