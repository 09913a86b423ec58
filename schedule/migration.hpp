// schedule/migration.hpp — what moves when a training job changes layout:
// the diff of two plans into ownership moves of parameters and optimizer
// state, with byte counts, a predicted transfer time, and what no live rank
// holds any more.
//
// Pure (descriptions in, decisions out): the elastic scheduler (issue 20)
// asks it whether a re-plan after a death, a join or a link change can be
// reached from the ranks still alive, what it costs to get there, and
// whether that pays off against the step time it saves.
//
// The model of who holds what:
//   * parameters of a piece (transformer block i, the embeddings, the head)
//     live on every replica of the stage that holds the piece;
//   * its optimizer state (setup.optimizer_bytes per parameter) is split
//     evenly over the stage's d replicas under ZeRO-1 (replica r holds the
//     slice [r/d, (r+1)/d) of every piece), and held whole by each replica
//     otherwise;
//   * a rank may have a buddy holding a copy of its optimizer slices (the
//     in-memory redundancy that lets a single death lose nothing).
// Parameters move at setup.weight_bytes per parameter, optimizer state at
// setup.optimizer_bytes: the bytes the cost model counts for memory.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"
#include "schedule/planner.hpp"

namespace corolla::schedule {

/// A piece of the model that moves as a unit: transformer block i (>= 0),
/// or one of these.
inline constexpr int embedding_piece = -1;
inline constexpr int head_piece = -2;

/// "block 3", "the embeddings", "the head".
std::string piece_name(int piece);

enum class state_kind { parameters, optimizer };

/// One transfer of a migration.
struct state_move {
  state_kind kind = state_kind::parameters;
  int piece = 0;
  double from_fraction = 0;  ///< optimizer: the slice [from_fraction, to_fraction) of the piece's state
  double to_fraction = 1;
  int from_rank = -1;
  int to_rank = -1;
  double bytes = 0;
};

/// The diff of two plans.
struct migration {
  /// The plans cannot be compared (different models, spans with gaps) or
  /// the new one uses a rank that is not alive: why. Empty when usable.
  std::string error;
  std::vector<state_move> moves;  ///< sorted by (to_rank, piece, kind, from_fraction)
  double bytes = 0;               ///< sum of the moves
  /// Predicted seconds for all moves, running at once: each rank sends and
  /// receives one move after the other over link_between(), and the moves
  /// between two clusters share that link's aggregate bandwidth; the
  /// busiest rank or inter-cluster link sets the time.
  double seconds = 0;
  /// State the new plan needs that no live rank (or buddy) holds, one
  /// line each ("parameters of block 3", "optimizer state [0.5, 1) of the
  /// head"): the job must go back to its last checkpoint.
  std::vector<std::string> lost;

  bool reachable() const { return error.empty() && lost.empty(); }
};

/// Diffs `from` (the layout the job runs) into `to` (a new plan over the
/// ranks in `alive`). A rank of `to` that already holds a piece's
/// parameters or an optimizer slice keeps it; everything else comes from
/// the live holder with the fastest link to the receiver (a dead holder's
/// optimizer slices from its buddy in `buddies`: rank -> rank with a copy),
/// ties broken by the lower rank. Both plans must cover the same
/// `costs.blocks.size()` blocks contiguously.
migration plan_migration(const plan& from, const plan& to, const model_costs& costs, const training_setup& setup,
                         const cluster_description& cluster, const std::vector<int>& alive,
                         const std::map<int, int>& buddies = {});

/// Whether moving to a plan of `new_step_s` per step pays off within
/// `steps_left` steps against staying at `old_step_s`: the time saved must
/// exceed the migration's seconds by `margin` (a fraction, e.g. 0.2) of
/// them. A job that cannot stay (old_step_s infinite: a rank is dead) always
/// moves.
bool migration_pays_off(double old_step_s, double new_step_s, double migration_s, long steps_left,
                        double margin = 0.2);

}  // namespace corolla::schedule
