// apps/train_step_lines.hpp — what a distributed job's launcher shows of its
// steps: each step --log-every shows as a line on stdout (text, or JSON
// with --json), and, when stderr is a terminal and --json is off, a
// progress bar redrawn after every step ("train [####....] 12/100  loss
// 5.4312  1830 tok/s"), as single-process training draws it.
#pragma once

#include <mutex>

#include "actors/train_job.hpp"
#include "model/progress_bar.hpp"

namespace corolla::app {

struct train_args;

class step_lines {
 public:
  explicit step_lines(const train_args& a);

  /// Step `r` of a job laid out as `o`: its line when --log-every shows
  /// it (the bar cleared first), then the bar. From the coordinator's thread.
  void step(const dist_train_options& o, const dist_step_report& r);
  /// Clears the bar, before another line goes to the terminal (the elastic
  /// launcher's re-plan lines).
  void clear();
  /// Leaves the last bar on its line, before the summary.
  void finish();

 private:
  const train_args& a_;
  std::mutex mu_;  ///< the coordinator's thread draws, the launcher's clears
  progress_bar bar_;
};

}  // namespace corolla::app
