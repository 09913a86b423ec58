// apps/rank_processes.hpp — the rank processes of a local training job
// (`corolla train` without --rank): started as children of this binary,
// watched, and, when the job fails, told apart into the ranks it lost
// (ended by a signal, stopped) and those that only reported the failure.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "apps/stop_clock.hpp"

namespace corolla::app {

/// The rank processes of a local job: killed (SIGTERM, then SIGKILL) and
/// reaped when the launcher is done with them; they also die with it.
class rank_processes {
 public:
  rank_processes() = default;
  rank_processes(const rank_processes&) = delete;
  rank_processes& operator=(const rank_processes&) = delete;
  ~rank_processes() { stop(); }

  /// Starts rank `size()` as `corolla ARGS...`; it dies with this process
  /// unless `die_with_launcher` is false (apps/launcher_takeover.hpp).
  void start(const std::vector<std::string>& args, bool die_with_launcher = true);
  /// Takes the next rank's index for a rank this launcher does not start
  /// (a joined worker's): its pid() is -1 and nothing waits for it.
  void skip() { pids_.push_back(-1); }
  /// Takes process `pid` (started for another grid: apps/rank_hold.hpp;
  /// this process's child, or, after a takeover, the launcher's before)
  /// as rank `size()`.
  void adopt(pid_t pid);

  /// Watches the ranks until all have ended or `stop` is set: calls
  /// `ended(rank, how)` for each that ends ("exit status N" or "signal N"),
  /// and `stopped(rank, seconds)` once for each that stays stopped (state T
  /// or t: SIGSTOP, a debugger) for `stopped_limit_s` (0 = never).
  void watch(const std::atomic<bool>& stop, const std::function<void(int, const std::string&)>& ended,
             double stopped_limit_s, const std::function<void(int, double)>& stopped);

  /// One pass without waiting: the ranks that have ended since the last
  /// look, each with how ("exit status N" or "signal N").
  std::vector<std::pair<int, std::string>> reap_now();

  /// The ranks whose processes are stopped (SIGSTOP, a debugger): hung,
  /// as far as the job is concerned.
  std::vector<int> stopped() const;

  /// Reaps ranks as they exit, for at most `timeout`.
  void wait_all(std::chrono::milliseconds timeout);

  void stop();

  /// The process id of rank `r`.
  pid_t pid(int r) const { return pids_.at(static_cast<std::size_t>(r)); }
  /// Rank `r`'s process, no longer this object's to watch, end or reap.
  pid_t release(int r) {
    const pid_t p = pids_.at(static_cast<std::size_t>(r));
    pids_.at(static_cast<std::size_t>(r)) = -1;
    return p;
  }

 private:
  std::vector<pid_t> pids_;
};

/// How long a rank process may stay stopped before the launcher takes it
/// for hung: 2 s, or --hang-s when shorter (0 = never). A stopped process
/// computes nothing and answers nobody while its peers wait on it; without
/// this the job noticed only at the ranks' 10 s peer timeout.
double stopped_limit_s(double hang_s);

/// The ranks a failed job lost: those a signal ended (`signalled`, seen by
/// the watcher, and any that die within half a second: a lost connection
/// can be reported a moment before its process is reapable) or that are
/// stopped; else the rank the failure's root cause names, which is the last
/// one its message names ("rank 1 (...) failed: rank 3 (...) is down").
/// A stall (train_stall) names its own: the ranks it blames, none for a
/// deadlock (every rank is alive and none is at fault).
std::vector<int> lost_ranks(rank_processes& ranks, const std::set<int>& signalled, int world,
                            const std::exception_ptr& failure);

}  // namespace corolla::app
