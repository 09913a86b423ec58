// net/rate_limit.hpp — a token bucket: at most `rate` bytes per second on
// average, in bursts of up to `burst` bytes. What a relay allows one peer
// to send through it (actors/relay.hpp).
#pragma once

#include <chrono>

namespace corolla::net {

class token_bucket {
 public:
  using clock = std::chrono::steady_clock;
  /// Full at `now`. `rate` and `burst` must be positive.
  token_bucket(double rate, double burst, clock::time_point now);
  /// Takes `bytes` when the bucket (refilled at `rate` since the last call,
  /// up to `burst`) holds them; otherwise takes nothing and returns false.
  /// A message larger than the burst never passes.
  bool take(double bytes, clock::time_point now);
  /// Bytes it holds at `now`.
  double available(clock::time_point now) const;
  /// Whether it is full at `now` (the sender has been idle long enough).
  bool full(clock::time_point now) const { return available(now) >= burst_; }

 private:
  double rate_, burst_, tokens_;
  clock::time_point at_;
};

}  // namespace corolla::net
