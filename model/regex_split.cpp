// model/regex_split.cpp — see regex_split.hpp.
#include "model/regex_split.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utext.h>

#include "model/error.hpp"

namespace corolla {

struct regex_split::impl {
  std::unique_ptr<icu::RegexPattern> pattern;
  regex_bounds bounds;
};

regex_split::regex_split(const std::string& pattern, const std::string& where, regex_bounds bounds)
    : impl_(std::make_unique<impl>()) {
  impl_->bounds = bounds;
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
  const regex_bounds& b = impl_->bounds;
  const std::int64_t steps =
      std::min<std::int64_t>(INT32_MAX, b.base_steps + static_cast<std::int64_t>(text.size() / 1024) * b.steps_per_kib);
  m->setTimeLimit(static_cast<std::int32_t>(steps), status);
  m->setStackLimit(b.stack_bytes, status);
  std::size_t at = 0;
  while (m->find(status) && U_SUCCESS(status)) {
    const auto b = static_cast<std::size_t>(m->start64(status)), e = static_cast<std::size_t>(m->end64(status));
    if (U_FAILURE(status)) break;
    if (b > at) out.push_back(text.substr(at, b - at));  // text no alternative matched
    if (e > b) out.push_back(text.substr(b, e - b));
    at = std::max(at, e);
  }
  utext_close(ut);
  if (status == U_REGEX_TIME_OUT || status == U_REGEX_STACK_OVERFLOW)
    throw model_error("the pre-tokenizer's regex gave up on a text of " + std::to_string(text.size()) + " bytes (" +
                      u_errorName(status) + "): the pattern backtracks too much on this input");
  if (U_FAILURE(status)) throw model_error(std::string("the pre-tokenizer's regex failed: ") + u_errorName(status));
  if (at < text.size()) out.push_back(text.substr(at));
}

std::string nfc(std::string_view text) {
  // ASCII is NFC as it is (the common case: no UTF-16 round trip).
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);
  if (text.size() > static_cast<std::size_t>(INT32_MAX / 2))
    throw model_error("a text of " + std::to_string(text.size()) + " bytes is too long to normalise");
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) throw model_error(std::string("NFC normalization is not available: ") + u_errorName(status));
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  // Always the normalised copy: bytes that are not UTF-8 become U+FFFD the
  // same way wherever they stand.
  const icu::UnicodeString normal = n->normalize(in, status);
  if (U_FAILURE(status)) throw model_error(std::string("NFC normalization failed: ") + u_errorName(status));
  std::string out;
  normal.toUTF8String(out);
  return out;
}

}  // namespace corolla
