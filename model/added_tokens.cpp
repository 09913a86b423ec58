// model/added_tokens.cpp — see added_tokens.hpp.
#include "model/added_tokens.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include "model/error.hpp"
#include "model/regex_split.hpp"

namespace corolla {
namespace {

/// Whether the code point ending just before byte `at` / starting at `at`
/// is whitespace, and its length in bytes (0 when not whitespace).
std::size_t space_before(std::string_view s, std::size_t at) {
  if (at == 0) return 0;
  std::int32_t i = static_cast<std::int32_t>(at);
  UChar32 c = 0;
  U8_PREV(reinterpret_cast<const std::uint8_t*>(s.data()), 0, i, c);
  return c >= 0 && u_isUWhiteSpace(c) ? at - static_cast<std::size_t>(i) : 0;
}

std::size_t space_at(std::string_view s, std::size_t at) {
  if (at >= s.size()) return 0;
  std::int32_t i = static_cast<std::int32_t>(at);
  UChar32 c = 0;
  U8_NEXT(reinterpret_cast<const std::uint8_t*>(s.data()), i, static_cast<std::int32_t>(s.size()), c);
  return c >= 0 && u_isUWhiteSpace(c) ? static_cast<std::size_t>(i) - at : 0;
}

bool flag(const nlohmann::json& t, const char* key) {
  const auto it = t.find(key);
  return it != t.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

std::vector<added_token> read_added_tokens(const nlohmann::json& j, const std::string& where, bool nfc_normalizer) {
  std::vector<added_token> out;
  if (!j.contains("added_tokens") || !j["added_tokens"].is_array()) return out;
  for (const auto& t : j["added_tokens"]) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string())
      throw model_error(where + ": malformed added token " + t.dump());
    added_token a{t["content"].get<std::string>(), t["id"].get<int>(), flag(t, "lstrip"), flag(t, "rstrip")};
    if (flag(t, "single_word"))
      throw model_error(where + ": added token '" + a.content +
                        "' is single_word, which corolla does not support (only lstrip and rstrip)");
    if (nfc_normalizer && flag(t, "normalized") && nfc(a.content) != a.content)
      throw model_error(where + ": added token '" + a.content +
                        "' is matched on normalized text and NFC changes it, which corolla does not support");
    out.push_back(std::move(a));
  }
  return out;
}

added_token_matcher::added_token_matcher(std::vector<added_token> tokens) : tokens_(std::move(tokens)) {
  // Longest first, so that a token containing another wins.
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const added_token& a, const added_token& b) { return a.content.size() > b.content.size(); });
  if (tokens_.size() > 65535) throw model_error("more than 65535 added tokens");
  for (std::size_t k = 0; k < tokens_.size(); ++k) {
    if (tokens_[k].content.empty())
      throw model_error("an added token (id " + std::to_string(tokens_[k].id) + ") is empty");
    by_first_byte_[static_cast<unsigned char>(tokens_[k].content.front())].push_back(static_cast<std::uint16_t>(k));
  }
}

std::optional<added_token_matcher::match> added_token_matcher::next(std::string_view text, std::size_t from) const {
  if (tokens_.empty()) return std::nullopt;
  for (std::size_t i = from; i < text.size(); ++i)
    for (const std::uint16_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const added_token& t = tokens_[k];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      match m{i, i + t.content.size(), t.id};
      if (t.lstrip) {
        for (std::size_t n = space_before(text, m.begin); n > 0 && m.begin - n >= from;
             n = space_before(text, m.begin))
          m.begin -= n;
      }
      if (t.rstrip) {
        for (std::size_t n = space_at(text, m.end); n > 0; n = space_at(text, m.end)) m.end += n;
      }
      return m;
    }
  return std::nullopt;
}

int added_token_matcher::id_of(std::string_view content) const {
  for (const added_token& t : tokens_)
    if (t.content == content) return t.id;
  return -1;
}

}  // namespace corolla
