// actors/train_stall.hpp — the coordinator's stall check. A rank whose
// stage hangs inside a compute call reports itself (train_watchdog.hpp);
// a job can also stop with no rank computing: a message lost or never
// sent leaves ranks waiting on each other, and each wait alone looks like
// a victim's. Without this check such a job sat for --timeout-s (five
// minutes by default), and the error then named the first message the
// coordinator missed, usually a victim's.
//
// While the coordinator waits for a message of its ranks, nothing taken
// for max(--hang-s, 10 x the longest step of this run) is suspicious: it
// asks every rank's watchdog what the rank does (train.waits?, twice, a
// second apart), adds what it waits for itself, and lets
// schedule::diagnose_stall judge. Stuck is a train_stall naming the rank
// (or the cycle of waits) at fault; slow is waiting on, checking again
// every half threshold. The ranks' setup (building the model, restoring a
// checkpoint) counts as work; the first step of a run does not count
// towards the longest step.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "actors/train_comm.hpp"
#include "schedule/wait_graph.hpp"

namespace corolla {

class node;
struct train_layout;

/// How long past --timeout-s the coordinator waits for its ranks'
/// messages: a quarter of it, at most 10 s (take's comment says why).
std::chrono::milliseconds report_grace(std::chrono::milliseconds timeout);

class stall_watch {
 public:
  using clock_type = std::chrono::steady_clock;

  /// `hang_s` 0 = no checks (only the timeout).
  stall_watch(node& n, const train_layout& layout, double hang_s) : node_(n), layout_(layout), hang_s_(hang_s) {}

  /// The run's id and where each rank is (node ids), from the roster.
  void set_run(std::uint64_t run, std::map<int, std::string> ids);
  /// A step of this run took `seconds` (from its report to the previous
  /// one's); the first step of the run is not counted.
  void step_took(int step, int first, double seconds);
  /// Nothing taken for this long is suspicious.
  double threshold_s() const;

  /// The message of `type` for (step, rank) from `inbox`, within
  /// `timeout` and its report_grace; `what` names it ("report of step 5").
  /// Throws train_error at the timeout or on the inbox's failure, train_stall when the job is
  /// stuck (schedule/wait_graph.hpp; only when `judge`).
  remote_message take(train_inbox& inbox, const char* type, std::int64_t step, int rank, const std::string& what,
                      std::chrono::milliseconds timeout, bool judge = true);
  /// As take, for a message filed under another slot than its sender's
  /// rank (the parameters of bucket `slot`, from rank `from`).
  remote_message take_from(train_inbox& inbox, const char* type, std::int64_t step, int slot, int from,
                           const std::string& what, std::chrono::milliseconds timeout, bool judge = true);

 private:
  /// Every rank's answer to train.waits? (unanswered ones: answered false);
  /// throws the failure reported to `inbox` meanwhile as soon as it comes
  /// (a silent rank's answer is not waited for then).
  std::vector<schedule::rank_activity> sample(train_inbox& inbox, std::int64_t step);
  /// Judges the job while the coordinator waits for `what` of `step` from
  /// `rank`; throws train_stall when it is stuck (or the failure a rank
  /// reported to `inbox` meanwhile).
  void check(train_inbox& inbox, std::int64_t step, int rank, const std::string& what);

  node& node_;
  const train_layout& layout_;
  double hang_s_;
  std::uint64_t run_ = 0;
  std::map<int, std::string> ids_;
  double longest_step_s_ = 0;
  clock_type::time_point last_progress_ = clock_type::now(), last_check_{};
};

}  // namespace corolla
