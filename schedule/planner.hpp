// schedule/planner.hpp — choosing a pipeline x data-parallel layout for a
// training job on a heterogeneous cluster, and the baselines it must beat.
//
// The planner searches pipeline depth p, data-parallel width d, which
// workers run each (stage, replica) and the layers of each stage, keeping
// every data-parallel group inside ONE cluster and ONE NIC class (so only
// pipeline traffic crosses slow links), and returns the layout with the
// smallest predicted step time on the cost model (schedule/cost_model.hpp).
// The naive rank order and the Holmes rule are priced on the same model.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"

namespace corolla::schedule {

/// One pipeline stage of a plan, with its d replicas.
struct stage_plan {
  int index = 0;
  int first_layer = 0;       ///< blocks [first_layer, last_layer)
  int last_layer = 0;
  bool embedding = false;    ///< holds the token (and position) embeddings: stage 0
  bool head = false;         ///< holds the final norm, LM head and loss: the last stage
  std::vector<int> workers;  ///< ranks; replica r of this stage runs on workers[r]
  int cluster = -1;          ///< the cluster all replicas are in, -1 when they are not (baselines only)
  int nic = -1;              ///< the NIC class all replicas share, -1 when mixed (baselines only)
  stage_estimate cost;       ///< time, links and memory of one replica
};

/// Where one worker sits in a plan: what the runtime's stage actor needs.
struct placement {
  int rank = -1;
  int stage = -1;
  int replica = -1;
  int first_layer = 0;       ///< blocks [first_layer, last_layer)
  int last_layer = 0;
  bool embedding = false;
  bool head = false;
  int prev_rank = -1;        ///< replica `replica` of stage - 1 (activations come from it), -1 on stage 0
  int next_rank = -1;        ///< replica `replica` of stage + 1 (activations go to it), -1 on the last stage
  std::vector<int> dp_group; ///< every replica of this stage, in replica order (includes rank)
  int grad_buckets = 1;      ///< gradient buckets of the DP reduction
};

/// A training layout and its predicted cost.
struct plan {
  std::string strategy;      ///< "planner", "naive", "holmes", "holmes-2-stages"
  bool feasible = false;     ///< false: `reason` says why (memory, batch, constraints)
  std::string reason;
  int pp = 0;                ///< pipeline depth p
  int dp = 0;                ///< data-parallel width d
  int tp = 1;                ///< tensor-parallel width (always 1 for now)
  int micro_batches = 0;     ///< m per replica per step
  int micro_batch = 0;       ///< sequences per micro-batch
  int seq = 0;               ///< tokens per sequence
  std::vector<stage_plan> stages;
  std::vector<int> idle;     ///< ranks the plan leaves unused
  step_estimate estimate;    ///< the cost model's prediction (valid when the layout was priced)

  /// The layout (workers and spans) of this plan.
  pipeline_layout layout() const;
  /// Where `rank` sits, or nothing when it is idle or not in the plan.
  std::optional<placement> place(int rank) const;
  /// Seconds per step (infinity when not feasible).
  double step_s() const;
};

/// The planner's plan next to the baselines priced on the same cost model.
struct plan_report {
  plan best;              ///< the planner's choice (or why nothing fits)
  plan naive;             ///< file rank order, consecutive DP groups, even split; best's p and d
  plan holmes;            ///< NIC-sorted ranks, proportional split; best's p and d
  plan holmes_two_stages; ///< the Holmes rule with p = 2, as in its original code
  int layouts_priced = 0; ///< candidate layouts the search priced
};

/// Searches layouts for training `cfg` on `cluster` under `setup` (a forced
/// setup.pp / setup.dp restricts the search). Throws model_error only for
/// bad input (setup.validate); an infeasible job returns best.feasible = false
/// with the reason.
plan_report make_plan(const cluster_description& cluster, const model_config& cfg,
                      const training_setup& setup);

/// The naive baseline for p stages x d replicas: the first p*d ranks in
/// file order, stage i on ranks [i*d, (i+1)*d) whatever their NIC, layers
/// split evenly.
plan naive_plan(const cluster_description& cluster, const model_config& cfg,
                const training_setup& setup, int pp, int dp);
/// The Holmes rule for p stages x d replicas: ranks stably sorted by NIC
/// class (fastest class first), stage i on the next d of them, layers split
/// in proportion to each stage's summed TFLOP/s.
plan holmes_plan(const cluster_description& cluster, const model_config& cfg,
                 const training_setup& setup, int pp, int dp);

/// Prices a given layout and fills a plan (feasible unless memory does not fit).
plan price_layout(const cluster_description& cluster, const model_costs& costs,
                  const training_setup& setup, const pipeline_layout& layout,
                  const std::string& strategy);

/// True when every stage's replicas (its DP group) lie in one cluster and
/// one NIC class: the planner's hard constraint.
bool dp_groups_within_nic_class(const cluster_description& cluster, const pipeline_layout& layout);

}  // namespace corolla::schedule
