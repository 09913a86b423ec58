// net/rate_limit: the token bucket a relay limits each peer with.
#include <doctest/doctest.h>

#include <chrono>

#include "net/rate_limit.hpp"

using namespace corolla::net;
using namespace std::chrono_literals;

TEST_CASE("a token bucket passes bursts up to its size, then its rate, and refuses what does not fit") {
  const auto t0 = token_bucket::clock::time_point{} + 100s;
  token_bucket b(1000.0, 4000.0, t0);  // 1000 bytes/s, bursts of 4000
  CHECK(b.full(t0));
  CHECK(b.take(3000, t0));
  CHECK(b.available(t0) == doctest::Approx(1000));
  CHECK_FALSE(b.take(1500, t0));  // refused: nothing taken
  CHECK(b.available(t0) == doctest::Approx(1000));
  CHECK(b.take(1000, t0));
  CHECK_FALSE(b.take(1, t0));
  // Half a second refills 500 bytes.
  CHECK(b.available(t0 + 500ms) == doctest::Approx(500));
  CHECK(b.take(500, t0 + 500ms));
  CHECK_FALSE(b.take(10, t0 + 500ms));
  // Never beyond the burst, however long idle; a message larger than the burst never passes.
  CHECK(b.available(t0 + 1h) == doctest::Approx(4000));
  CHECK(b.full(t0 + 1h));
  CHECK_FALSE(b.take(4001, t0 + 1h));
  CHECK(b.take(4000, t0 + 1h));
  // A clock that goes back changes nothing.
  CHECK_FALSE(b.take(1, t0));
}
