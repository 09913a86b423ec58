// model/outcome.hpp — a value or an error value, for the layers below the
// actors (model/, schedule/), which do not depend on CAF. Errors are values
// there as in the actors: a span server's bad input or a
// scheduling failure is normal, and the actor that called turns the error
// into a caf::error at its boundary. Each layer names its own error type
// (span_error, schedule_error); the holder is this one template.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace corolla {

/// A T or an error E; E carries a complete `message` for the user. Test it
/// (`if (r)`, ok()) before value(): value() on an error, or error() on a
/// value, is a programming error and throws std::logic_error (with the
/// error's message, where there is one).
template <class T, class E>
class outcome {
 public:
  /// A success holding `value`.
  outcome(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  /// A failure holding `error`.
  outcome(E error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit by design

  /// Whether a value is held.
  bool ok() const { return v_.index() == 0; }
  /// Same as ok() (the spelling of std::expected and caf::expected).
  bool has_value() const { return ok(); }
  explicit operator bool() const { return ok(); }

  /// The value; throws std::logic_error carrying the error's message when an error is held.
  const T& value() const& {
    if (!ok()) throw std::logic_error("a result holds an error: " + std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  /// The value (mutable); same contract as the const overload.
  T& value() & {
    if (!ok()) throw std::logic_error("a result holds an error: " + std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  /// The value moved out of a temporary (`f().value()`); same contract.
  T&& value() && { return std::move(value()); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(value()); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  /// The error; throws std::logic_error when a value is held.
  const E& error() const {
    if (ok()) throw std::logic_error("a result holds a value, not an error");
    return std::get<1>(v_);
  }

 private:
  std::variant<T, E> v_;
};

/// Success or an error E, for operations without a result value.
template <class E>
class outcome<void, E> {
 public:
  /// Success.
  outcome() = default;
  /// A failure holding `error`.
  outcome(E error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design

  /// Whether it succeeded.
  bool ok() const { return ok_; }
  /// Same as ok().
  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }

  /// The error; throws std::logic_error on success.
  const E& error() const {
    if (ok_) throw std::logic_error("a result holds success, not an error");
    return error_;
  }

 private:
  E error_{};
  bool ok_ = true;
};

}  // namespace corolla
