#include "actors/inbox_waiter.hpp"

#include <caf/all.hpp>

namespace corolla {

namespace {

std::string ms_text(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

}  // namespace

std::optional<remote_message> inbox_waiter::await(const std::string& key, std::string what, int from,
                                                  delivery later, std::optional<std::chrono::milliseconds> timeout) {
  const std::uint64_t token = ++tokens_;
  auto m = inbox_->await(key, what, from, caf::actor_cast<caf::actor>(self_), token);
  if (m) return m;
  token_ = token;
  what_ = std::move(what);
  later_ = std::move(later);
  arm(timeout.value_or(timeout_));
  return std::nullopt;
}

void inbox_waiter::expect(std::string message) {
  expected_ = std::move(message);
  arm(timeout_);
}

void inbox_waiter::progress() { deadline_ = std::chrono::steady_clock::now() + wait_timeout_; }

void inbox_waiter::arm(std::chrono::milliseconds timeout) {
  wait_timeout_ = timeout;
  progress();
  if (timer_armed_ && timer_due_ <= deadline_) return;  // it comes first and sets itself again
  send_timer(timeout);
}

void inbox_waiter::send_timer(std::chrono::milliseconds after) {
  timer_armed_ = true;
  timer_due_ = std::chrono::steady_clock::now() + after;
  self_->delayed_send(caf::actor_cast<caf::actor>(self_), after, inbox_deadline_atom::value, ++timer_);
}

void inbox_waiter::cancel() {
  if (token_) inbox_->cancel(caf::actor_cast<caf::actor>(self_), token_);
  token_ = 0;
  later_ = nullptr;
  expected_.reset();
}

void inbox_waiter::on_delivery(std::uint64_t token, remote_message m) {
  if (token != token_) return;  // not possible: one await at a time, a cancelled one is never answered
  token_ = 0;
  delivery next = std::move(later_);
  later_ = nullptr;
  next(std::move(m));
}

void inbox_waiter::on_failure(std::uint64_t token, const std::string& reason) {
  if (token != token_) return;
  token_ = 0;
  later_ = nullptr;
  throw train_error(reason);
}

void inbox_waiter::on_deadline(std::uint64_t timer) {
  if (timer != timer_) return;  // a newer one stands
  timer_armed_ = false;
  if (!waiting()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < deadline_) {
    send_timer(std::chrono::ceil<std::chrono::milliseconds>(deadline_ - now));
    return;
  }
  // A peer down, an abort: that reason says more than the timeout (waits
  // on other actors do not hear of it otherwise).
  if (auto failure = inbox_->failure()) {
    if (token_ && !inbox_->cancel(caf::actor_cast<caf::actor>(self_), token_)) return;  // answered meanwhile
    token_ = 0;
    later_ = nullptr;
    expected_.reset();
    throw train_error(*failure);
  }
  if (token_) {
    // Not cancelled: the message was handed over on the deadline and is on
    // its way to this actor.
    if (!inbox_->cancel(caf::actor_cast<caf::actor>(self_), token_)) return;
    token_ = 0;
    later_ = nullptr;
    throw train_error("no " + what_ + " within " + ms_text(wait_timeout_));
  }
  std::string message = std::move(*expected_);
  expected_.reset();
  throw train_error(message);
}

}  // namespace corolla
