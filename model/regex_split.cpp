// model/regex_split.cpp — see regex_split.hpp.
#include "model/regex_split.hpp"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include "model/error.hpp"

namespace corolla {

struct regex_split::impl {
  std::unique_ptr<icu::RegexPattern> pattern;
};

regex_split::regex_split(const std::string& pattern, const std::string& where) : impl_(std::make_unique<impl>()) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  impl_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse, status));
  if (U_FAILURE(status) || !impl_->pattern)
    throw model_error(where + ": the pre-tokenizer's regex " + pattern + " does not compile (" + u_errorName(status) +
                      " at offset " + std::to_string(parse.offset) + ")");
}

regex_split::~regex_split() = default;

void regex_split::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  UErrorCode status = U_ZERO_ERROR;
  // A UTF-8 UText: the matcher's indices are byte offsets into `text`.
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  std::unique_ptr<icu::RegexMatcher> m(impl_->pattern->matcher(status));
  if (U_FAILURE(status) || !m) {
    utext_close(ut);
    throw model_error(std::string("the pre-tokenizer's regex cannot run: ") + u_errorName(status));
  }
  m->reset(ut);
  std::size_t at = 0;
  while (m->find(status) && U_SUCCESS(status)) {
    const auto b = static_cast<std::size_t>(m->start64(status)), e = static_cast<std::size_t>(m->end64(status));
    if (U_FAILURE(status)) break;
    if (b > at) out.push_back(text.substr(at, b - at));  // text no alternative matched
    if (e > b) out.push_back(text.substr(b, e - b));
    at = std::max(at, e);
  }
  utext_close(ut);
  if (U_FAILURE(status)) throw model_error(std::string("the pre-tokenizer's regex failed: ") + u_errorName(status));
  if (at < text.size()) out.push_back(text.substr(at));
}

std::string nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw model_error(std::string("NFC normalization is not available: ") + u_errorName(status));
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (n->isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const icu::UnicodeString normal = n->normalize(in, status);
  if (U_FAILURE(status)) throw model_error(std::string("NFC normalization failed: ") + u_errorName(status));
  std::string out;
  normal.toUTF8String(out);
  return out;
}

}  // namespace corolla
