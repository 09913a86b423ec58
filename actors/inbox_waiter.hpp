// actors/inbox_waiter.hpp — how an event-based actor of a training job
// (a rank's stage actor and DP-group actor, the coordinator through its
// stall_watch) waits without blocking: for a
// message of its rank's inbox (train_inbox::await: the message comes to
// the actor as an actor message once filed), or for answers of another
// actor, with a deadline either way. One wait is open at a time; one timer
// message (inbox_deadline_atom) stands for its deadline, however many
// waits come and go before it fires: a new timer is sent only when a wait
// ends sooner than the one standing (older ones are then ignored).
//
// The actor routes three messages to it, inside its own error handling
// (each may throw train_error, which ends the actor's work):
//   (inbox_delivery_atom, token, remote_message) -> on_delivery
//   (inbox_failure_atom, token, reason)          -> on_failure
//   (inbox_deadline_atom, timer)                 -> on_deadline
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include "actors/messages.hpp"
#include "actors/train_comm.hpp"

namespace corolla {

using inbox_deadline_atom = caf::atom_constant<caf::atom("tindeadl")>;

class inbox_waiter {
 public:
  using delivery = std::function<void(remote_message)>;

  /// Waits on `inbox`, each wait for at most `timeout`. `lane` tells
  /// several waiters of one actor apart (one open wait each): their
  /// tokens and timers carry it (lane_of), for the actor to route them.
  inbox_waiter(std::shared_ptr<train_inbox> inbox, std::chrono::milliseconds timeout, std::uint16_t lane = 0)
      : inbox_(std::move(inbox)),
        timeout_(timeout),
        tokens_(std::uint64_t{lane} << lane_shift),
        timer_(std::uint64_t{lane} << lane_shift) {}

  /// The lane of a token or timer this class made.
  static std::uint16_t lane_of(std::uint64_t token_or_timer) {
    return static_cast<std::uint16_t>(token_or_timer >> lane_shift);
  }

  /// The actor that waits; before its first wait.
  void bind(caf::event_based_actor* self) { self_ = self; }

  /// The message filed under `key`: returned at once when it is there;
  /// otherwise nothing, and `later` runs with it in on_delivery. After the
  /// timeout (`timeout` when given) on_deadline throws "no <what> within N
  /// ms". `what` and `from` are for the inbox's waits() (the coordinator's
  /// stall check). Throws train_error when the inbox has failed.
  std::optional<remote_message> await(const std::string& key, std::string what, int from, delivery later,
                                      std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  /// A wait for something other than the inbox (another actor's answers):
  /// after the timeout without progress(), on_deadline throws `message`.
  void expect(std::string message);
  /// Some of what expect() waits for came: the deadline starts again.
  void progress();
  /// All of it came: the wait is over.
  void settle() { expected_.reset(); }

  /// Gives the open wait up (the actor's work failed otherwise): the
  /// inbox forgets it, and nothing of it comes any more.
  void cancel();

  /// Whether a wait is open.
  bool waiting() const { return token_ != 0 || expected_.has_value(); }

  void on_delivery(std::uint64_t token, remote_message m);
  void on_failure(std::uint64_t token, const std::string& reason);
  /// The open wait's deadline passed: throws the inbox's failure if it
  /// has one (more precise than a timeout), else the wait's timeout.
  void on_deadline(std::uint64_t timer);

 private:
  static constexpr int lane_shift = 48;

  void arm(std::chrono::milliseconds timeout);
  void send_timer(std::chrono::milliseconds after);

  std::shared_ptr<train_inbox> inbox_;
  std::chrono::milliseconds timeout_;
  caf::event_based_actor* self_ = nullptr;
  std::uint64_t tokens_;      ///< awaits made (their tokens), after the lane
  std::uint64_t token_ = 0;   ///< the inbox await open now (0: none)
  std::string what_;
  delivery later_;
  std::optional<std::string> expected_;  ///< the other wait's timeout message
  std::chrono::milliseconds wait_timeout_{0};  ///< the open wait's
  std::chrono::steady_clock::time_point deadline_;
  bool timer_armed_ = false;
  std::uint64_t timer_;  ///< the timer standing (older ones are ignored), after the lane
  std::chrono::steady_clock::time_point timer_due_;
};

}  // namespace corolla
