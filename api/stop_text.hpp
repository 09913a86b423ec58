// api/stop_text.hpp — the OpenAI API's `stop` sequences over streamed text.
//
// Generated text arrives in pieces (one per token). Text is released as soon
// as no stop sequence can begin in it; a tail that could still grow into a
// stop sequence is held back. When a sequence appears, the text before it is
// released and the rest (the sequence and anything after) never is, so the
// concatenation of what push() and finish() return is the generated text cut
// before the first stop sequence, exactly as a non-streamed answer is cut.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace corolla::api {

/// Cuts streamed text at the first of several stop sequences.
class stop_text {
 public:
  /// `stops`: non-empty UTF-8 strings (none: text passes through).
  explicit stop_text(std::vector<std::string> stops);
  /// Adds `piece`; returns the text now safe to release (possibly empty).
  /// After a match, returns "" forever.
  std::string push(std::string_view piece);
  /// Whether a stop sequence was found.
  bool matched() const { return matched_; }
  /// At the end of generation: the text held back (none after a match).
  std::string finish();

 private:
  std::vector<std::string> stops_;
  std::string held_;  ///< text not released yet: a possible start of a stop sequence
  bool matched_ = false;
};

}  // namespace corolla::api
