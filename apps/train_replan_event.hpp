// apps/train_replan_event.hpp — one re-plan of an elastic job
// (apps/train_elastic.cpp) as the user sees it: one line on stdout, or an
// object with --json, printed once the new grid completes its first step
// (so that its time is the whole switch), and kept for the summary line.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/train_job.hpp"
#include "apps/train_args.hpp"

namespace corolla::app {

/// "rank 3 (stage 1, replica 1, blocks 2..3), rank 1 (...)".
std::string labels(const train_layout& l, const std::vector<int>& ranks);

/// One re-plan, printed once the new grid completes its first step (so
/// that its time is the whole recovery: from the failure to the next step).
struct replan_event {
  /// Non-empty for a planned re-plan: what measurements changed (links,
  /// workers' speeds), and `cause` says which kinds.
  std::vector<std::string> changes;
  std::string cause;
  double predicted_from_s = 0, predicted_to_s = 0;  ///< the cost model's step, as running and re-planned
  std::string reason;
  std::vector<int> lost;
  std::string lost_labels, from, to;
  int ranks_left = 0;                 ///< ranks (or, with --cluster, workers) left to plan on
  std::string left_unit = "rank(s)";
  int resume_step = 0;       ///< the checkpoint continued from (0: the start)
  bool from_memory = false;  ///< read from the ranks' in-memory snapshots (held, or flushed and assembled into a checkpoint)
  int last_done = 0;         ///< the last step completed before the failure
  double bytes = 0;          ///< checkpoint bytes the new grid reads
  std::chrono::steady_clock::time_point failed_at;

  /// The --json object; `seconds` (from failed_at) only when completed.
  nlohmann::json json(double seconds, bool completed) const;
  /// Prints it (text, or the object with --json); `completed`: the new
  /// grid completed its first step (else it failed again before).
  void print(const train_args& a, bool completed) const;
};

}  // namespace corolla::app
