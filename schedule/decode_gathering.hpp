// schedule/decode_gathering.hpp — when a swarm server's queue of one-row
// decode steps runs as a batch. Concurrent sessions fall into phases: the
// steps answered by one batch come back together, while the steps that
// arrived during that batch already wait in the mailbox and run next, so a
// server with 16 sessions would run two batches of about 8 for ever, each
// reading every weight once. A batch therefore waits, briefly, for the
// sessions of the last batches that have not queued their next step yet: at
// most a fraction of the last batch's time and a fixed cap, and not at all
// once every one of them is queued. A session that stops stepping is waited
// for at most until it drops out of the batches remembered. Pure: the span
// server actor (actors/span_server.cpp) tells it what ran and asks it how
// long to wait.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

namespace corolla::swarm {

/// How long a queue of one-row steps may wait for late sessions.
struct gathering_policy {
  /// Of the last batch's compute time.
  double wait_fraction = 0.5;
  /// Never longer than this (a session far away must not hold the rest up).
  std::chrono::microseconds max_wait{50'000};
  /// Sessions of this many last batches are expected back.
  int remember_batches = 2;
};

class decode_gathering {
 public:
  explicit decode_gathering(gathering_policy p = {}) : policy_(p) {}

  /// A batch of `sessions` ran in `seconds`.
  void ran(const std::vector<std::string>& sessions, double seconds);
  /// `session` ended (closed, expired): nobody waits for it any more.
  void forget(const std::string& session);
  /// `session` just started and its first step is on its way: it is waited
  /// for as a session of the last batch (a burst of new sessions then
  /// starts in one batch, not one step apart). Nothing before any batch ran.
  void expect(const std::string& session);
  /// Sessions of the remembered batches that are not in `queued`.
  std::vector<std::string> missing(const std::vector<std::string>& queued) const;
  /// How much longer a queue holding `queued`, whose first step was queued
  /// `waited` ago, waits before it runs: zero when no remembered session is
  /// missing or the wait is used up.
  std::chrono::microseconds wait(const std::vector<std::string>& queued, std::chrono::microseconds waited) const;

 private:
  gathering_policy policy_;
  std::deque<std::vector<std::string>> recent_;  ///< the sessions of the last batches, newest last
  double last_seconds_ = 0;
};

}  // namespace corolla::swarm
