// actors/train_watchdog.hpp — a rank whose stage stops making progress is
// a failure too. A stage stuck inside one forward or backward (a kernel
// that never returns, a deadlock in the compute) keeps its process and its
// node up: heartbeats go on, no link reports it down, and its peers would
// wait --timeout-s (five minutes by default) for messages that never come.
//
// The stage marks each compute call on a beacon (an atomic: since when it
// is inside one, or idle). The watchdog, a detached actor on the rank's
// node published as "train-watch", looks at it every 100 ms: a call
// running longer than max(hang_s, 10 x the longest call so far) is a hang,
// reported once through `on_hang` (the rank tells the coordinator, which
// names it as the failure's root cause; with --elastic the launcher
// re-plans without it). Waits for messages are not compute: a rank that
// waits on a hung one is its victim, not hung.
//
// A job can also stop while no rank computes: a message lost or never
// sent leaves ranks waiting on each other. The coordinator then asks every
// rank's watchdog what the rank is doing (train.waits?, a request with the
// run's id): it answers with its compute call, its progress counter and
// what its actors wait for (wire::TrainWaits), and the coordinator finds
// the rank or the cycle of waits the job is stuck on
// (schedule/wait_graph.hpp).
//
// For faultlab's `hang` the watchdog also obeys stall_atom from the node's
// control actor: the stage then stalls inside its next compute call until
// told otherwise (actors/node_control.hpp, control.stall).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "schedule/wait_graph.hpp"

namespace corolla {

/// What the stage shares with its watchdog.
class stage_beacon {
 public:
  /// The stage enters a compute call (forward, backward) named `what`.
  void enter(const char* what);
  /// ... and leaves it.
  void leave();
  /// Seconds inside the current call (0 when idle), and its name.
  double busy_s(const char** what = nullptr) const;
  /// The longest completed call so far, in seconds.
  double longest_s() const { return static_cast<double>(longest_ns_.load()) * 1e-9; }
  /// Calls completed so far.
  std::uint64_t calls() const { return calls_.load(); }
  /// Adds this beacon to a rank's answer to train.waits?: its call as the
  /// work the rank is inside (unless another beacon named one already),
  /// its calls to the progress counter.
  void add_to(schedule::rank_activity& a) const;
  /// faultlab's hang: while set, enter() does not return.
  void stall(bool on) { stalled_.store(on); }
  bool stalled() const { return stalled_.load(); }

 private:
  static std::int64_t now_ns();
  std::atomic<std::int64_t> since_ns_{0};  ///< 0 = idle
  std::atomic<std::int64_t> longest_ns_{0};
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<const char*> what_{""};
  std::atomic<bool> stalled_{false};
};

/// One compute call on the beacon, for its scope: enters on construction;
/// leaves on destruction and adds the seconds it took to `total`.
class compute_window {
 public:
  compute_window(stage_beacon& b, const char* what, double& total);
  ~compute_window();
  compute_window(const compute_window&) = delete;
  compute_window& operator=(const compute_window&) = delete;

 private:
  stage_beacon& beacon_;
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

/// Work marked on a beacon for its scope (no seconds summed): the DP-group
/// actor's updates, the stage's link probes. What the coordinator's stall
/// check sees as work rather than a rank stuck.
class beacon_mark {
 public:
  beacon_mark(stage_beacon& b, const char* what) : beacon_(b) { beacon_.enter(what); }
  ~beacon_mark() { beacon_.leave(); }
  beacon_mark(const beacon_mark&) = delete;
  beacon_mark& operator=(const beacon_mark&) = delete;

 private:
  stage_beacon& beacon_;
};

/// The threshold: a call is a hang past max(hang_s, 10 x the longest so far).
double hang_threshold_s(double hang_s, double longest_s);

/// "<label> is hung: its stage has been inside one <what> for 4.1 s (the
/// longest before took 0.012 s; --hang-s 4)".
std::string hang_reason(const std::string& label, double seconds, const std::string& what, double hang_s,
                        double longest_s);

/// What the rank does now, for the coordinator's train.waits? of run
/// `job` (an error for another run's): its waits and messages taken; the
/// watchdog adds its beacon (stage_beacon::add_to).
using activity_sampler = std::function<caf::expected<schedule::rank_activity>(std::uint64_t job)>;

/// Spawns the watchdog of `beacon`; with hang_s 0 it never checks and
/// only obeys stall_atom and answers train.waits?. `on_hang(seconds,
/// what)` runs once, on a thread of its own (it may block; the watchdog
/// goes on answering meanwhile).
caf::actor spawn_train_watchdog(caf::actor_system& system, std::shared_ptr<stage_beacon> beacon, double hang_s,
                                std::function<void(double seconds, const std::string& what)> on_hang,
                                activity_sampler activity);

}  // namespace corolla
