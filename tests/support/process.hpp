// tests/support/process.hpp — run a program to completion and capture it.
//
// For app tests that start the real corolla binary: arguments are passed
// as they are (no shell), stdout and stderr are captured separately, and a
// program still running at the timeout is killed (and reported so), so no
// child outlives the call.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace corolla::testing {

/// How a process ended and what it wrote.
struct process_result {
  int exit_code = -1;      ///< exit status when it exited normally, else -1
  int term_signal = 0;     ///< the signal that ended it, 0 when it exited
  bool timed_out = false;  ///< killed by us at the timeout
  std::string out;         ///< everything written to stdout
  std::string err;         ///< everything written to stderr

  /// True when the process exited by itself (not by a signal).
  bool exited() const { return term_signal == 0 && !timed_out && exit_code >= 0; }
  /// The lines of `err` (without their newlines; no empty last line).
  std::vector<std::string> err_lines() const;
  /// The lines of `out`.
  std::vector<std::string> out_lines() const;
};

/// Runs `program` with `args` and waits at most `timeout`. Throws
/// std::runtime_error only when the process cannot be started.
process_result run_process(const std::filesystem::path& program,
                           const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// Runs the corolla binary built with the tests (COROLLA_BINARY).
process_result run_corolla(const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace corolla::testing
