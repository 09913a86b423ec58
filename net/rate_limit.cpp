#include "net/rate_limit.hpp"

#include <algorithm>

namespace corolla::net {

token_bucket::token_bucket(double rate, double burst, clock::time_point now)
    : rate_(rate), burst_(burst), tokens_(burst), at_(now) {}

double token_bucket::available(clock::time_point now) const {
  const double idle = std::max(0.0, std::chrono::duration<double>(now - at_).count());
  return std::min(burst_, tokens_ + idle * rate_);
}

bool token_bucket::take(double bytes, clock::time_point now) {
  const double have = available(now);
  if (now > at_) {
    tokens_ = have;
    at_ = now;
  }
  if (bytes > tokens_) return false;
  tokens_ -= bytes;
  return true;
}

}  // namespace corolla::net
