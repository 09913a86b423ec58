#include "api/stop_text.hpp"

#include <algorithm>

namespace corolla::api {

stop_text::stop_text(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string stop_text::push(std::string_view piece) {
  if (matched_) return {};
  held_ += piece;
  // The earliest match of any sequence.
  std::size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some sequence: it
  // starts where a sequence's first byte does, so never inside a UTF-8
  // character.
  std::size_t keep = 0;
  for (const auto& s : stops_) {
    const std::size_t most = std::min(held_.size(), s.size() - 1);
    for (std::size_t n = most; n > keep; --n)
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(s).substr(0, n)) {
        keep = n;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string stop_text::finish() {
  std::string out;
  out.swap(held_);
  return matched_ ? std::string() : out;
}

}  // namespace corolla::api
