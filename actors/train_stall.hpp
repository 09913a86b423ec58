// actors/train_stall.hpp — the coordinator's waits, with its stall check.
// A rank whose stage hangs inside a compute call reports itself
// (train_watchdog.hpp); a job can also stop with no rank computing: a
// message lost or never sent leaves ranks waiting on each other, and each
// wait alone looks like a victim's. Without this check such a job sat for
// --timeout-s (five minutes by default), and the error then named the
// first message the coordinator missed, usually a victim's.
//
// The coordinator is an event-based actor: it waits for its ranks'
// messages through await() below, which never blocks. While a wait is
// open, nothing taken for max(--hang-s, 10 x the longest step of this run)
// is suspicious: the watch asks every rank's watchdog what the rank does
// (train.waits?, twice, a second apart), adds what the coordinator waits
// for itself, and lets schedule::diagnose_stall judge. Stuck is a
// train_stall naming the rank (or the cycle of waits) at fault; slow is
// waiting on, checking again every half threshold. The message coming, or
// the inbox failing, ends a check in progress (a verdict of silence waits
// half a second for the silent rank's own report, and the message coming
// then ends it too). The wait's own deadline (--timeout-s and its grace)
// may end a check as well. The ranks' setup (building
// the model, restoring a checkpoint) counts as work; the first step of a
// run does not count towards the longest step.
//
// The actor routes these messages to it, inside its own error handling
// (each may throw train_error or train_stall, which end the job):
//   (inbox_delivery_atom, token, remote_message) -> waiter().on_delivery
//   (inbox_failure_atom, token, reason)          -> waiter().on_failure
//   (inbox_deadline_atom, timer)                 -> waiter().on_deadline
//   (stall_check_atom, wait, phase)              -> on_check
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "actors/inbox_waiter.hpp"
#include "actors/train_comm.hpp"
#include "schedule/wait_graph.hpp"

namespace corolla {

class node;
struct train_layout;

/// How long past --timeout-s the coordinator waits for its ranks'
/// messages: a quarter of it, at most 10 s (await's comment says why).
std::chrono::milliseconds report_grace(std::chrono::milliseconds timeout);

using stall_check_atom = caf::atom_constant<caf::atom("tstallchk")>;

class stall_watch {
 public:
  using clock_type = std::chrono::steady_clock;
  using delivery = inbox_waiter::delivery;

  /// Waits on `inbox`, each wait for at most `timeout` and its
  /// report_grace. `hang_s` 0 = no checks (only the timeout).
  stall_watch(node& n, const train_layout& layout, double hang_s, std::shared_ptr<train_inbox> inbox,
              std::chrono::milliseconds timeout);

  /// The actor that waits; before its first wait.
  void bind(caf::event_based_actor* self);
  /// The plain waiter under the watch (for waits that are not judged and
  /// get no grace: the joins).
  inbox_waiter& waiter() { return waiter_; }

  /// The run's id and where each rank is (node ids), from the roster.
  void set_run(std::uint64_t run, std::map<int, std::string> ids);
  /// A step of this run took `seconds` (from its report to the previous
  /// one's); the first step of the run is not counted.
  void step_took(int step, int first, double seconds);
  /// Nothing taken for this long is suspicious.
  double threshold_s() const;

  /// The message of `type` for (`step`, `slot`, `hop`) from rank `from`
  /// (slot is the rank but for messages filed elsewhere: the parameters of
  /// bucket `slot`, `hop` the ask they answer); `what` names it ("report of step 5"). Returned at once when
  /// it is filed; otherwise nothing, and `later` runs with it once it
  /// comes. The wait ends with train_error at the timeout and its grace or
  /// on the inbox's failure, with train_stall when the job is stuck (only
  /// when `judge`).
  std::optional<remote_message> await(const char* type, std::int64_t step, int slot, int from, const std::string& what,
                                      delivery later, bool judge = true, int hop = 0);

  /// A check's next phase is due (see the routing above).
  void on_check(std::uint64_t wait, int phase);

 private:
  /// Sends the next check's timer for the open wait.
  void schedule_check();
  /// Asks every rank's watchdog what it does (train.waits?), all at once,
  /// each within one answer window, into answers_ (unanswered: answered
  /// false); after the last, the check's phase `answered` is due unless
  /// the wait ended meanwhile.
  void sample(int answered);
  /// Judges the two samples against what the coordinator waits for.
  void judge(const std::vector<schedule::rank_activity>& after);
  /// Throws the verdict reached (or the failure a rank reported meanwhile).
  [[noreturn]] void throw_verdict();

  node& node_;
  const train_layout& layout_;
  double hang_s_;
  std::shared_ptr<train_inbox> inbox_;
  std::chrono::milliseconds timeout_;
  inbox_waiter waiter_;
  caf::event_based_actor* self_ = nullptr;
  std::uint64_t run_ = 0;
  std::map<int, std::string> ids_;
  double longest_step_s_ = 0;
  clock_type::time_point last_progress_ = clock_type::now(), last_check_{};
  /// The open judged wait: its number (a message for an older one is
  /// ignored), step, sender and name; whether it is judged.
  std::uint64_t wait_ = 0;
  bool judged_ = false;
  std::int64_t step_ = 0;
  int from_ = 0;
  std::string what_;
  /// The check in progress: when the first sample was asked for, its
  /// answers, the sample being answered, and a verdict waiting for a late
  /// failure report.
  clock_type::time_point asked_{};
  std::vector<schedule::rank_activity> before_, answers_;
  struct pending_verdict {
    std::string reason;
    std::vector<int> blamed;
  };
  std::optional<pending_verdict> verdict_;
};

}  // namespace corolla
