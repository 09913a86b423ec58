// schedule/snapshot_interval: the in-memory snapshot interval of an elastic
// job with --snapshot-every auto, from the measured copies and steps.
#include <doctest/doctest.h>

#include <vector>

#include "schedule/snapshot_interval.hpp"

using namespace corolla::schedule;

TEST_CASE("the snapshot interval keeps one step's copies to a fifth of the time between snapshot steps") {
  // Copies well within a fifth of a step: every step.
  CHECK(snapshot_interval(0.005, 0.05, 1) == 1);
  CHECK(snapshot_interval(0.01, 0.05, 1) == 1);  // exactly a fifth
  // A copy of 0.03 s in steps of 0.05 s: 3 steps (0.03 <= 0.2 * 3 * 0.05).
  CHECK(snapshot_interval(0.03, 0.05, 1) == 3);
  CHECK(snapshot_interval(0.031, 0.05, 1) == 4);
  // Never beyond the cap.
  CHECK(snapshot_interval(100.0, 0.05, 1) == 64);
  snapshot_interval_policy p;
  p.max_every = 10;
  CHECK(snapshot_interval(100.0, 0.05, 1, p) == 10);
  p.budget = 0.5;
  CHECK(snapshot_interval(0.05, 0.05, 1, p) == 2);
}

TEST_CASE("the snapshot interval grows at once and shrinks only to half or less") {
  CHECK(snapshot_interval(0.03, 0.05, 2) == 3);  // longer: at once
  CHECK(snapshot_interval(0.02, 0.05, 3) == 3);  // 2 would do, but 2 > 3 / 2: stays
  CHECK(snapshot_interval(0.01, 0.05, 3) == 1);  // 1 <= 3 / 2: back to every step
  CHECK(snapshot_interval(0.04, 0.05, 8) == 4);  // 4 <= 8 / 2
  CHECK(snapshot_interval(0.05, 0.05, 8) == 8);  // 5 > 4: stays
}

TEST_CASE("the snapshot interval keeps what is in force when nothing was measured") {
  CHECK(snapshot_interval(0.0, 0.05, 4) == 4);
  CHECK(snapshot_interval(0.03, 0.0, 4) == 4);
  CHECK(snapshot_interval(-1.0, -1.0, 2) == 2);
  CHECK(snapshot_interval(0.0, 0.0, 0) == 1);     // an interval in force is at least 1
  CHECK(snapshot_interval(0.0, 0.0, 500) == 64);  // and at most the cap
}

TEST_CASE("median_of: the middle value, the mean of the two middle ones, 0 for none") {
  CHECK(median_of(std::vector<double>{}) == 0.0);
  CHECK(median_of(std::vector<double>{3.0}) == 3.0);
  CHECK(median_of(std::vector<double>{5.0, 1.0, 3.0}) == 3.0);
  CHECK(median_of(std::vector<double>{4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK(median_of(std::vector<double>{0.1, 9.0, 0.2, 0.3, 0.25}) == 0.25);  // one slow copy does not decide
}
