// net/log_limit.hpp — a cap on repeated log lines. A peer that floods a node
// with malformed messages must not flood its log too: each source (a
// connection, a link) lets a few lines per second through and counts the
// rest, and the next line that gets through says how many were held back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace corolla::net {

/// At most `burst` lines per `window`. Not thread-safe: one owner (the I/O
/// thread for a connection, the actor for a link).
class log_limiter {
 public:
  explicit log_limiter(int burst = 5, std::chrono::milliseconds window = std::chrono::seconds(1))
      : burst_(burst), window_(window) {}

  /// Whether to log this line. When true, note() describes the lines
  /// suppressed since the last one let through (and resets that count).
  bool allow(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++in_window_;
    return true;
  }

  /// " (N similar lines suppressed)" after suppressed lines, else "".
  std::string note() {
    if (suppressed_ == 0) return {};
    const std::string s = " (" + std::to_string(suppressed_) + " similar line" + (suppressed_ == 1 ? "" : "s") +
                          " suppressed)";
    suppressed_ = 0;
    return s;
  }

  /// Lines held back since the last note().
  std::uint64_t suppressed() const { return suppressed_; }

 private:
  int burst_;
  std::chrono::milliseconds window_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace corolla::net
