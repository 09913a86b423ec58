// schedule/replan.hpp — the elastic scheduler's decision when links or
// workers' speeds change under a running job: fold measured link rates and
// compute times into the cluster description, price the running layout on
// what was measured, plan again, and say whether moving pays off. Pure:
// descriptions in, a decision out.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/config.hpp"
#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"
#include "schedule/planner.hpp"

namespace corolla::schedule {

/// One worker's measured compute over some steps, next to what the cost
/// model predicts for the same work at the worker's file (nominal) speed.
struct compute_measurement {
  int worker = 0;        ///< rank in the description
  double seconds = 0;    ///< measured inside forward and backward (<= 0: not measured)
  double modeled = 0;    ///< predicted at the nominal FLOP/s (> 0)
};

/// When a measurement counts as a change.
struct replan_policy {
  /// A link measured below `slower` x what the description says is slower
  /// than planned (probes see less than the line rate: per-message costs,
  /// a busy host). Above it, a link measured before returns to the rule.
  double slower = 0.5;
  /// The new plan must save more than this fraction of the restart's cost
  /// on top of it (migration_pays_off's margin).
  double margin = 0.2;
  /// Probes in a row that must agree before a link counts as changed (a
  /// busy host makes single echoes slow now and then).
  int confirmations = 2;
  /// A worker whose measured/modeled compute time is more than `straggler`
  /// x the fastest measured worker's is a straggler; at or below it again,
  /// one measured before is back at its nominal speed.
  double straggler = 2.0;
};

/// Which measurements have said the same thing `policy.confirmations`
/// times in a row: a link slower than planned (or than measured before),
/// or one measured slow before that is back. Keeps the streaks between
/// probes.
class change_watch {
 public:
  /// The measurements of `m` that are sustained changes against `c`; a
  /// link whose probe says nothing new loses its streak.
  std::vector<link_measurement> sustained(const cluster_description& c, const std::vector<link_measurement>& m,
                                          const replan_policy& policy = {});
  /// The same for workers' compute (with_compute's verdicts); the round's
  /// fastest worker, the reference, comes along with any straggler.
  std::vector<compute_measurement> sustained_compute(const cluster_description& c, const std::vector<compute_measurement>& m,
                                             const replan_policy& policy = {});

 private:
  std::map<std::pair<std::string, std::string>, int> streak_;  ///< by worker names, (lower, higher)
};

/// `c` with the measurements folded in: a link slower than `policy.slower`
/// x its rule becomes a measured link (both directions, the measured rate,
/// the rule's latency); one measured before that now reaches the threshold
/// (or is too fast to tell) goes back to the rule. `changes` (optional)
/// gets one line per link that changed, e.g. "a/0 <-> b/0: 2.1 Mbit/s
/// measured, 1 Gbit/s planned".
cluster_description with_measurements(const cluster_description& c, const std::vector<link_measurement>& m,
                                       const replan_policy& policy = {}, std::vector<std::string>* changes = nullptr);

/// What the cost model predicts each worker of `p` computes per step at
/// its nominal speed (c.nominal_flops where a measurement replaced it):
/// its stage's forward and backward for every micro-batch. `worker` and
/// `modeled` set, `seconds` 0.
std::vector<compute_measurement> modeled_compute(const cluster_description& c, const plan& p);

/// `c` with compute measurements folded in: a straggler (policy.straggler)
/// gets flops = nominal x fastest ratio / its ratio (the nominal kept in
/// c.nominal_flops); one measured before that is no straggler any more
/// gets its nominal flops back. `changes` as for with_measurements, e.g.
/// "n1/0 computes 3.1x slower than n0/0 (per the cost model): 6.5e+06
/// FLOP/s instead of 2e+07".
cluster_description with_compute(const cluster_description& c, const std::vector<compute_measurement>& m,
                                 const replan_policy& policy = {}, std::vector<std::string>* changes = nullptr);

/// What the scheduler decided.
struct replan_advice {
  bool move = false;     ///< switch to `next`
  plan next;             ///< the planner's plan on the measured description
  double current_s = 0;  ///< the running layout's step, priced on the measured description
  double next_s = 0;     ///< next's step
  std::string why;       ///< one line: the prices and the verdict
};

/// Prices `current` (the running plan) on `measured` and plans again there
/// with `setup` (its pp/dp left free), and moves when migration_pays_off
/// within `steps_left` steps against a switch costing `switch_s` seconds.
replan_advice advise_replan(const cluster_description& measured, const plan& current, const model_config& cfg,
                            const training_setup& setup, long steps_left, double switch_s,
                            const replan_policy& policy = {});

}  // namespace corolla::schedule
