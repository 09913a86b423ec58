// apps/stop_clock.hpp: when the local launcher takes a stopped rank
// process for hung.
#include <doctest/doctest.h>

#include "apps/stop_clock.hpp"

using corolla::app::stop_clock;
using namespace std::chrono_literals;

TEST_CASE("stop_clock: a rank stopped at every look for the limit is reported once, with how long") {
  stop_clock c(2.0);
  const auto t0 = stop_clock::clock_type::now();
  CHECK(c.look({}, t0).empty());
  CHECK(c.look({1}, t0 + 100ms).empty());
  for (auto t = 200ms; t < 2100ms; t += 100ms) CHECK(c.look({1, 3}, t0 + t).empty());
  const auto hung = c.look({1, 3}, t0 + 2100ms);
  REQUIRE(hung.size() == 1u);
  CHECK(hung[0].first == 1);
  CHECK(hung[0].second == doctest::Approx(2.0));
  CHECK(c.look({1, 3}, t0 + 2200ms).size() == 1u);  // rank 3's turn; rank 1 not again
  CHECK(c.look({1, 3}, t0 + 2300ms).empty());
}

TEST_CASE("stop_clock: a rank let go starts from zero, and a gap between looks (the launcher stopped too) resets "
          "every count") {
  stop_clock c(1.0);
  const auto t0 = stop_clock::clock_type::now();
  c.look({2}, t0);
  c.look({2}, t0 + 500ms);
  c.look({}, t0 + 600ms);  // SIGCONT
  c.look({2}, t0 + 700ms);
  CHECK(c.look({2}, t0 + 1500ms).empty());  // 0.8 s since stopped again
  CHECK(c.look({2}, t0 + 1700ms).size() == 1u);

  stop_clock d(1.0);
  d.look({0}, t0);
  // Ctrl-Z stopped the launcher with its ranks for a minute; after SIGCONT
  // the ranks are still seen stopped for a moment.
  CHECK(d.look({0}, t0 + 60s).empty());
  CHECK(d.look({0}, t0 + 60s + 100ms).empty());
  CHECK(d.look({0}, t0 + 61s + 100ms).size() == 1u);  // and still stopped a second later: hung
}

TEST_CASE("stop_clock: a limit of zero reports at the first look") {
  stop_clock c(0.0);
  CHECK(c.look({4}, stop_clock::clock_type::now()).size() == 1u);
}
