// schedule/replan.hpp — the elastic scheduler's decision when links change
// under a running job: fold measured link rates into the cluster
// description, price the running layout on what was measured, plan again,
// and say whether moving pays off. Pure: descriptions in, a decision out.
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

/// One probe of the link between two workers (by rank in the description).
struct link_measurement {
  int from = 0, to = 0;  ///< worker ranks: the prober and its peer
  /// Bytes per second both ways averaged; 0 = too fast to tell with the
  /// probe's payload (at least as fast as anything the probe can see).
  double bandwidth = 0;
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
};

/// Which measurements have said the same thing `policy.confirmations`
/// times in a row: a link slower than planned (or than measured before),
/// or one measured slow before that is back. Keeps the streaks between
/// probes.
class link_watch {
 public:
  /// The measurements of `m` that are sustained changes against `c`; a
  /// link whose probe says nothing new loses its streak.
  std::vector<link_measurement> sustained(const cluster_description& c, const std::vector<link_measurement>& m,
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
