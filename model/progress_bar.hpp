// model/progress_bar.hpp — a one-line bar redrawn in place on stderr, for
// long loads and training runs. It draws only when stderr is a terminal
// (logs and pipes get the programs' ordinary lines instead).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

namespace corolla {

class progress_bar {
 public:
  /// Draws nothing unless `wanted` and stderr is a terminal.
  explicit progress_bar(bool wanted) : on_(wanted && isatty(STDERR_FILENO) == 1) {}
  ~progress_bar() { finish(); }
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  /// Whether it draws at all.
  bool drawing() const { return on_; }

  /// "label [#####.....] done/total  detail".
  void draw(std::string_view label, long done, long total, std::string_view detail = {}) {
    if (!on_) return;
    constexpr long width = 30;
    const long filled = total > 0 ? width * std::min(done, total) / total : width;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    // An empty view's data() may be null, which %.*s must not be given.
    const char* text = detail.empty() ? "" : detail.data();
    std::fprintf(stderr, "\r\033[K%.*s [%s] %ld/%ld%s%.*s", static_cast<int>(label.size()), label.data(), bar.c_str(),
                 done, total, detail.empty() ? "" : "  ", static_cast<int>(detail.size()), text);
    std::fflush(stderr);
    drawn_ = true;
  }
  /// A training step's bar: "train [#####.....] 12/100  loss 5.4312  1830 tok/s".
  void draw_step(long step, long total, double loss, double tokens_per_s) {
    if (!on_) return;
    char detail[64];
    std::snprintf(detail, sizeof detail, "loss %.4f  %.0f tok/s", loss, tokens_per_s);
    draw("train", step, total, detail);
  }
  /// Clears the bar so a line written to the same terminal is not garbled.
  void clear() {
    if (!on_ || !drawn_) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    drawn_ = false;
  }
  /// Leaves the last bar on its line and moves on.
  void finish() {
    if (!on_ || !drawn_) return;
    std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  bool on_;
  bool drawn_ = false;
};

}  // namespace corolla
