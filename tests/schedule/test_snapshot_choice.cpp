// schedule/snapshot_choice.hpp: the step a failed elastic job continues
// from, and whose copy of each rank's state is read.
#include <doctest/doctest.h>

#include "schedule/snapshot_choice.hpp"

using namespace corolla::schedule;

namespace {

/// Rank `owner`'s snapshot of `step` at `holder`, in a 1x2 job whose
/// buckets "head" and "block.0" have 4 values (owner r's moments are [2r,
/// 2r + 2)); the owner's own copy holds the parameters.
held_snapshot copy(int holder, int owner, std::int64_t step) {
  held_snapshot s;
  s.holder = holder;
  s.owner = owner;
  s.step = step;
  for (const char* b : {"head", "block.0"}) {
    if (holder == owner) s.params.insert(b);
    s.moments[b] = {2 * owner, 2 * owner + 2, 4};
  }
  return s;
}

const std::vector<std::string> buckets{"head", "block.0"};

}  // namespace

TEST_CASE("snapshot choice: the newest complete step, each rank's own copy before its buddy's") {
  // Rank 1 died: step 5 has only rank 0's copies; step 4 has rank 1's at its buddy.
  const std::vector<held_snapshot> held{copy(0, 0, 4), copy(0, 0, 5), copy(0, 1, 4), copy(2, 1, 4), copy(1, 1, 4)};
  const snapshot_choice c = choose_snapshot_step(held, 2, buckets);
  REQUIRE(c.found());
  CHECK(c.step == 4);
  CHECK(c.source == std::map<int, int>{{0, 0}, {1, 1}});  // rank 1's own copy, though listed after its buddy's
  // Only its buddy's left: read from there.
  const snapshot_choice buddy = choose_snapshot_step({copy(0, 0, 4), copy(0, 1, 4)}, 2, buckets);
  CHECK(buddy.step == 4);
  CHECK(buddy.source.at(1) == 0);
}

TEST_CASE("snapshot choice: steps after the last one printed, or not newer than the checkpoint, are not used") {
  const std::vector<held_snapshot> held{copy(0, 0, 9), copy(0, 1, 9), copy(0, 0, 10), copy(0, 1, 10)};
  CHECK(choose_snapshot_step(held, 2, buckets).step == 10);
  const snapshot_choice printed = choose_snapshot_step(held, 2, buckets, 9);
  CHECK(printed.step == 9);
  const snapshot_choice none = choose_snapshot_step(held, 2, buckets, 9, 9);
  CHECK_FALSE(none.found());
  CHECK(none.why_not == "step 10: after the last step printed, 9; the checkpoint of step 9 is as new as any "
                        "snapshot left");
}

TEST_CASE("snapshot choice: a rank missing, parameters missing, or moments that do not tile make a step unusable") {
  CHECK(choose_snapshot_step({}, 2, buckets).why_not == "no rank holds a snapshot");
  const snapshot_choice missing = choose_snapshot_step({copy(0, 0, 6)}, 2, buckets);
  CHECK_FALSE(missing.found());
  CHECK(missing.why_not == "step 6: no snapshot of rank(s) 1");
  // Both copies are buddies' (dp > 1: no parameters).
  const snapshot_choice no_params = choose_snapshot_step({copy(1, 0, 6), copy(0, 1, 6)}, 2, buckets);
  CHECK(no_params.why_not == "step 6: no snapshot holds the parameters of head");
  held_snapshot gap = copy(1, 1, 6);
  gap.moments["block.0"] = {3, 4, 4};
  const snapshot_choice hole = choose_snapshot_step({copy(0, 0, 6), gap}, 2, buckets);
  CHECK(hole.why_not.find("step 6: the snapshots' moment shards of block.0 do not tile its values ([3, 4) where [2, "
                          "...) was due)") == 0);
  held_snapshot short_of = copy(1, 1, 6);
  short_of.moments.erase("head");
  CHECK(choose_snapshot_step({copy(0, 0, 6), short_of}, 2, buckets).why_not ==
        "step 6: the snapshots hold values [0, 2) of the optimizer state of head");
  // Owners outside the grid are ignored.
  CHECK(choose_snapshot_step({copy(0, 0, 6), copy(1, 1, 6), copy(2, 2, 7)}, 2, buckets).step == 6);
}
