// apps/rank_hold.hpp — a rank process between two grids of an elastic job.
//
// When its grid fails or drains (dist_train_options::hold_snapshots,
// drain_to_memory), a rank's runtime ends but its process, node and
// snapshot keeper stay: the next grid's ranks read its snapshots from its
// memory. The process then waits for the launcher: either it is ended
// (once the next grid no longer needs what it holds), or it gets
// "train.next" (wire::TrainAssign) naming a rank of the next grid, which it
// runs in itself: no new process, the same node.
//
//   launcher -> "train-next" on the holding node   request train.next -> empty | error
//   launcher -> the keeper (snapshot_keeper_name)  one-way train.snapdrop, after the
//                                                  next grid's first step
//
// An assignment is taken only when it names a run whose keeper this node
// holds (the run's id is what lets the launcher in), its arguments name a
// rank and a coordinator, and its job description parses; on taking one
// the process ends every other keeper it has, and "train-next" is gone
// until it holds again. Of the assignment's arguments only --rank and
// --coordinator are read: the process keeps its own model, data, threads
// and device (the same flags for every local rank, except that --device
// cuda starts rank r on GPU r mod the GPUs: a held process stays on the
// GPU it started on).
#pragma once

#include <chrono>
#include <string>

#include <caf/error.hpp>

#include "actors/train_job.hpp"
#include "apps/rank_assignment.hpp"

namespace corolla {
class Backend;
class node;
}  // namespace corolla

namespace corolla::app {

inline constexpr const char* next_rank_type = "train.next";

/// The rank a holding process runs next.
struct next_rank {
  int rank = 0;
  std::string coordinator;  ///< the next grid's coordinator endpoint
  dist_train_options job;
};

/// Holds: gives `compute`'s cached device memory back (null: none yet), publishes
/// "train-next" on `n` and waits for an assignment (see above). `label` and
/// `why` say which rank holds and why, in the log. Returns only with an
/// assignment; otherwise the launcher ends the process.
next_rank hold_for_next_rank(node& n, Backend* compute, const std::string& label, const std::string& why);

/// The launcher's side: asks the process holding on node `node_id` (at
/// `endpoint`) to run the rank `a` describes; `a.run` names the run whose
/// snapshots it holds. An error when it cannot be reached or refuses.
caf::error assign_next_rank(node& n, const std::string& node_id, const std::string& endpoint, const rank_assignment& a,
                            std::chrono::milliseconds timeout);

}  // namespace corolla::app
