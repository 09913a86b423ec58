// schedule/regrid.hpp — the pipeline x data-parallel grid a training job
// continues on after it lost ranks (or gained some): pure, descriptions in,
// a decision out. The elastic local launcher (apps/train_elastic.cpp) asks
// it for the layout of the survivors; --cluster jobs re-plan with the
// planner instead.
#pragma once

#include <optional>
#include <string>

namespace corolla::schedule {

/// What a grid must satisfy.
struct grid_limits {
  int ranks = 1;         ///< ranks available
  int n_layers = 1;      ///< transformer blocks (each stage holds at least one per chunk)
  int global_batch = 1;  ///< sequences per step, split evenly over the replicas
  /// Sequences per micro-batch as given by the user (0 = the default rule:
  /// 1 with more than one stage, else the replica's whole share).
  int micro_batch = 0;
  int chunks = 1;        ///< model chunks per stage (interleaved 1F1B needs micro-batches % pp == 0)
  int prefer_pp = 1;     ///< the stages the job had: kept when the rest is equal
};

struct grid {
  int pp = 1, dp = 1;
  int ranks() const { return pp * dp; }
};

/// The grid using the most ranks that satisfies `l`; among those, the one
/// whose stage count is closest to l.prefer_pp, then the one with more
/// replicas (less pipeline bubble). nullopt when no grid fits (`why` says
/// what blocked it, when given).
std::optional<grid> regrid(const grid_limits& l, std::string* why = nullptr);

}  // namespace corolla::schedule
