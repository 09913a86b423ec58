// schedule/snapshot_choice.hpp — which step a failed elastic job continues
// from, out of the in-memory snapshots its survivors hold
// (actors/train_snapshots.hpp), and whose copy of each rank's state to
// read. Pure: what each holder has (owners, steps, which buckets'
// parameters, where each moment shard lies) in, the step and its sources
// out. The launcher decides on it over the flushed files today
// (commit_memory_snapshots); the same decision fits what keepers answer
// over the network (train.snaps?).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace corolla::schedule {

/// Values [lo, hi) of a bucket of n values.
struct value_range {
  std::int64_t lo = 0, hi = 0, n = 0;
};

/// Orders moment pieces by where they start (then end).
inline bool starts_before(const value_range& x, const value_range& y) {
  return x.lo != y.lo ? x.lo < y.lo : x.hi < y.hi;
}

/// How the moment pieces of one bucket, sorted with starts_before, tile
/// its values [0, n) (n: the first piece's).
struct tiling {
  std::size_t bad = 0;    ///< the first piece that does not start at `next` or names another n; size() when none
  std::int64_t next = 0;  ///< where piece `bad` was due to start, or where the last one ended
  std::int64_t n = 0;     ///< the first piece's n (0 without pieces)
  std::size_t pieces = 0;
  bool tiles() const { return pieces > 0 && bad == pieces && next == n; }
};
tiling check_tiling(const std::vector<value_range>& sorted);

/// One snapshot one holder has: rank `owner`'s state after `step`.
struct held_snapshot {
  int holder = 0;
  int owner = 0;
  std::int64_t step = 0;
  std::set<std::string> params;                 ///< buckets whose whole parameters it holds
  std::map<std::string, value_range> moments;   ///< bucket -> where its moment shard lies
};

/// The step chosen and where each rank's state of it is read.
struct snapshot_choice {
  std::int64_t step = 0;        ///< 0: no step is complete (why_not says why)
  std::map<int, int> source;    ///< owner -> the holder whose copy is read
  std::string why_not;
  bool found() const { return step > 0; }
};

/// The newest step whose snapshots cover every rank of a grid of `world`
/// ranks (one copy each: the owner's own when it survived, since it holds
/// its parameters, else the first other holder's), hold every bucket's
/// parameters in those copies, and whose moment shards tile every bucket.
/// Only steps up to `newest` count when it is >= 0 (the last step printed:
/// a later one's loss was never shown), and none at or before
/// `latest_checkpoint` (the checkpoint is as new). `buckets`: every bucket
/// of the model ("head", "block.0", ...).
snapshot_choice choose_snapshot_step(const std::vector<held_snapshot>& held, int world,
                                     const std::vector<std::string>& buckets, std::int64_t newest = -1,
                                     std::int64_t latest_checkpoint = 0);

}  // namespace corolla::schedule
