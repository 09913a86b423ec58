// actors/step_queue.hpp — the steps an actor holds back to run as one batch,
// and when that batch runs. The span server (actors/span_server.cpp) and the
// local decode batcher (actors/decode_batcher.cpp) both queue the steps of
// their sessions, send themselves a flush message when a queue starts (so
// the steps already in the mailbox join it), and on that flush run the
// queue at once, or wait, briefly, for the sessions of the last batches
// that have not sent their next step yet (schedule/decode_gathering.hpp);
// the step of the last of them runs the queue at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "schedule/decode_gathering.hpp"

namespace corolla {

/// A queue of steps of type `Step`, one per session at most (the owner
/// checks holds() and runs the queue first), with the gathering rule.
template <class Step>
class step_queue {
 public:
  using clock_type = std::chrono::steady_clock;

  explicit step_queue(swarm::gathering_policy policy = {}) : gathering_(policy) {}

  bool empty() const { return steps_.empty(); }
  std::size_t size() const { return steps_.size(); }
  /// Whether a step of `session` is queued.
  bool holds(const std::string& session) const {
    for (const auto& s : sessions_)
      if (s == session) return true;
    return false;
  }
  /// Which queue this is: a flush message carries it, and one for a queue
  /// already taken is stale.
  std::uint64_t seq() const { return seq_; }

  /// Queues `step` of `session`. True when it starts the queue: the owner
  /// then sends itself a flush for seq().
  bool push(std::string session, Step step) {
    const bool first = steps_.empty();
    if (first) queued_at_ = clock_type::now();
    sessions_.push_back(std::move(session));
    steps_.push_back(std::move(step));
    return first;
  }

  /// Whether the queue waits for late sessions and none is missing now: the
  /// owner runs it at once.
  bool complete() const { return waiting_ && gathering_.missing(sessions_).empty(); }

  /// What a flush message asks for.
  struct flush_decision {
    bool run = false;  ///< run the queue now
    /// Otherwise, with a non-zero wait: flush again after it (same seq).
    std::chrono::microseconds wait{0};
    bool first_wait = false;  ///< this queue's first wait (for counting waits)
  };
  /// The flush of queue `seq`: nothing for a stale flush or an empty queue;
  /// run when no session of the last batches is missing or the wait is
  /// used up; else how much longer to wait.
  flush_decision on_flush(std::uint64_t seq) {
    flush_decision d;
    if (seq != seq_ || steps_.empty()) return d;
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - queued_at_);
    d.wait = gathering_.wait(sessions_, waited);
    if (d.wait.count() == 0) {
      d.run = true;
      return d;
    }
    d.first_wait = !waiting_;
    waiting_ = true;
    return d;
  }

  /// Takes the steps out (in arrival order) to run them, and their sessions
  /// into `sessions`; the next push starts a new queue.
  std::vector<Step> take(std::vector<std::string>& sessions) {
    sessions = std::move(sessions_);
    sessions_.clear();
    std::vector<Step> out = std::move(steps_);
    steps_.clear();
    ++seq_;  // a flush still on its way is for this queue: stale
    waiting_ = false;
    return out;
  }

  /// A batch of `sessions` ran in `seconds` (they are expected back).
  void ran(const std::vector<std::string>& sessions, double seconds) { gathering_.ran(sessions, seconds); }
  /// `session` ended: nobody waits for it any more.
  void forget(const std::string& session) { gathering_.forget(session); }
  /// `session` just started: its first step is waited for as a step of a
  /// session of the last batch (decode_gathering::expect).
  void expect(const std::string& session) { gathering_.expect(session); }

 private:
  std::vector<Step> steps_;
  std::vector<std::string> sessions_;
  clock_type::time_point queued_at_{};
  std::uint64_t seq_ = 0;
  bool waiting_ = false;
  swarm::decode_gathering gathering_;
};

}  // namespace corolla
