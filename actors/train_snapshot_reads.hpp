// actors/train_snapshot_reads.hpp — where a rank of the next grid reads
// each tensor it needs of the in-memory snapshots of the grid before
// (actors/train_snapshots.hpp): pure, listings in, reads out.
//
// The parameters of each bucket come from one copy that holds them, the
// moment pieces that overlap the rank's own shard from their owner's copy.
// A process that held the grid before's snapshots (it runs the next
// grid's rank: apps/rank_hold.hpp) reads from its own copies first, and
// over a link only what they lack: what moves is what changed process.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/train_snapshots.hpp"

namespace corolla {

/// One bucket's shard a rank reads: its moments [lo, hi).
struct shard_want {
  std::string bucket;
  std::int64_t lo = 0, hi = 0;
};

/// The copy of one owner's snapshot the launcher chose: the node holding
/// it and what it lists.
struct chosen_copy {
  std::string node;
  snapshot_listing listing;
};

/// (node, owner) -> the tensor names to fetch there of that owner's
/// snapshot. `chosen`: every owner's chosen copy (of one step); `local`:
/// this process's listings of that step (none: it holds nothing), on node
/// `self`. Parameters: from a local copy of any owner, else the first
/// chosen copy (by owner) that has them; moments of an owner whose range
/// overlaps a want: from the local copy of that owner when it has both m
/// and v, else from its chosen copy.
std::map<std::pair<std::string, int>, std::vector<std::string>> plan_snapshot_reads(
    const std::map<int, chosen_copy>& chosen, const std::vector<snapshot_listing>& local, const std::string& self,
    const std::vector<shard_want>& wanted);

}  // namespace corolla
