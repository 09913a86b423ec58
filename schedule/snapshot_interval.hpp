// schedule/snapshot_interval.hpp — how often an elastic job's ranks copy
// their state to their buddies (`corolla train --elastic --snapshot-every
// auto`, actors/train_snapshots.hpp). Pure: the coordinator measures how
// long the copies of a snapshot step take to reach the buddies and how long
// a step takes, and asks here for the interval.
//
// A copy shares its link with the job's own traffic, and a copy that is
// still on its way when the next one leaves queues behind it: the interval
// keeps the copies to a share of the time between them. A longer interval
// costs a failure up to K - 1 replayed steps (the newest complete snapshot
// is older), never a lost one.
#pragma once

#include <span>

namespace corolla::schedule {

/// What the interval is chosen by.
struct snapshot_interval_policy {
  /// The share of the time between two snapshot steps that one step's
  /// copies may take (from the step's reports to the last buddy's
  /// acknowledgement).
  double budget = 0.2;
  int max_every = 64;  ///< never longer than this many steps
};

/// The interval for snapshots whose copies took `copy_s` seconds in steps
/// of `step_s` seconds, when `current` is in force: the smallest K with
/// copy_s <= budget * K * step_s, within [1, max_every]. A longer interval
/// is taken at once; a shorter one only when it is at most half of
/// `current` (copies measured near the boundary do not make it flip back
/// and forth). Unmeasured figures (<= 0) keep `current`.
int snapshot_interval(double copy_s, double step_s, int current, const snapshot_interval_policy& p = {});

/// The median of `xs` (0 for none): what the coordinator passes for the
/// copies and the steps measured since it last decided.
double median_of(std::span<const double> xs);

}  // namespace corolla::schedule
