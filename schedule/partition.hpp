// schedule/partition.hpp — which layers each pipeline stage runs.
//
// Three ways to cut L layers into p contiguous spans: evenly (the naive
// baseline), in proportion to stage speed (the Holmes rule), and by dynamic
// programming over the cost model under memory limits (the planner). A
// partition is p + 1 boundaries 0 = b_0 < b_1 < ... < b_p = L: stage i runs
// blocks [b_i, b_{i+1}).
#pragma once

#include <optional>
#include <vector>

#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"

namespace corolla::schedule {

/// Everything about one stage position that does not depend on its layers.
struct stage_slot {
  double flops_per_s = 0;  ///< the slowest replica's effective FLOP/s
  double capacity = 0;     ///< usable bytes of the smallest replica
  int in_flight = 0;       ///< micro-batches of activations held (1F1B: min(p - i, m))
  int dp = 1;              ///< replicas (ZeRO-1 shards the optimizer over them)
  link_spec dp_link;       ///< slowest link of the stage's DP ring
  bool first = false;      ///< holds the embeddings
  bool last = false;       ///< holds the LM head (and the tied copy when p > 1)
};

/// The stage positions of a layout whose spans are still open: speeds and
/// memories from the workers of each stage (stage i on `workers[i]`), in-flight
/// counts from the 1F1B rule. Every stage must have the same number of workers.
std::vector<stage_slot> make_slots(const cluster_description& cluster, const training_setup& setup,
                                   const std::vector<std::vector<int>>& workers);

/// What the dynamic program minimises.
enum class partition_objective {
  /// The slowest stage's forward+backward time per micro-batch (the 1F1B
  /// steady-state interval); ties broken by the sum over stages (the fill
  /// and drain), so equal bottlenecks prefer less total work on slow stages.
  bottleneck,
  /// max_i [(m + p - 1) * S_i + exposed DP reduction of stage i]: a stage
  /// whose DP group sits on a slow link should also hold fewer parameters.
  bottleneck_with_reduction,
};

/// The best boundaries for `slots` under `objective` such that every stage
/// fits its memory, or nothing when no contiguous split fits. `m` is the
/// number of micro-batches per replica. O(p L^2).
std::optional<std::vector<int>> partition_layers(const model_costs& costs, const training_setup& setup,
                                                 const std::vector<stage_slot>& slots, int m,
                                                 partition_objective objective);

/// L layers over p stages as evenly as possible; the first L mod p stages
/// get one more. Requires 1 <= p <= L.
std::vector<int> even_split(int layers, int stages);

/// The Holmes rule: layers in proportion to each stage's speed, rounded by
/// largest remainder, at least one per stage (48 layers at 197 : 160 ->
/// 26 / 22). Requires 1 <= speeds.size() <= layers and positive speeds.
std::vector<int> proportional_split(int layers, const std::vector<double>& speeds);

/// Boundaries -> spans of a layout over `workers` (stage i on workers[i]).
pipeline_layout make_layout(const std::vector<std::vector<int>>& workers, const std::vector<int>& bounds);

}  // namespace corolla::schedule
