// tests/support/child_process.hpp — a long-running child process that a test
// owns: started without a shell, its stdout read line by line (readiness
// lines), its stderr kept in a file for failure messages, killed in the
// destructor. The child also dies with the test process (PR_SET_PDEATHSIG),
// so no child outlives a crashed test.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace corolla::testing {

class child_process {
 public:
  /// Starts `program args...`. Throws std::runtime_error when it cannot.
  child_process(const std::filesystem::path& program, std::vector<std::string> args);
  /// Starts the corolla binary built with the tests.
  static child_process corolla(std::vector<std::string> args);
  ~child_process();
  child_process(child_process&& other) noexcept;
  child_process& operator=(child_process&&) = delete;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// Reads stdout until a line matches `pattern` (std::regex_search) and
  /// returns the match; nullopt at the timeout or when stdout closes.
  std::optional<std::smatch> wait_line(const std::regex& pattern, std::chrono::milliseconds timeout);
  /// Every stdout line read so far.
  const std::vector<std::string>& lines() const { return lines_; }
  /// What the child wrote to stderr so far (for messages).
  std::string err() const;

  /// Sends `sig` (SIGKILL, SIGSTOP, SIGCONT, SIGTERM, ...). For SIGKILL and
  /// SIGSTOP it returns once the child is dead or stopped (at most 2 s), so
  /// a test's next request cannot be answered before the signal lands.
  void signal(int sig);
  /// Waits for the child to end (at most `timeout`); its exit status, or
  /// -signal when a signal ended it, or nullopt when it is still running.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  bool running() const { return pid_ > 0 && !status_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::filesystem::path err_file_;
  std::string pending_;  ///< stdout bytes after the last complete line
  std::vector<std::string> lines_;
  std::optional<int> status_;
};

}  // namespace corolla::testing
