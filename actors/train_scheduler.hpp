// actors/train_scheduler.hpp — the scheduler actor of an elastic training
// job. It holds what the job runs on (the grid or the cluster plan), who is
// in it (the launcher's ranks, machines that joined, a cluster file's
// present and absent workers) and what has been measured (links, workers'
// compute, the cost of a switch), and decides on each event what the job
// runs next:
//
//   launcher -> sched   started_atom, train_layout, t       grid started at t
//   coord    -> sched   step_atom, dist_step_report         every step's report
//   coord    -> sched   request verdict_atom, drain_query   -> drain_verdict
//                       (a drain step: do links, speeds or joined machines
//                       make another plan pay? then the job stops there;
//                       the coordinator actor asks and goes on with the
//                       answer, never blocking; the scheduler monitors who
//                       asked: a verdict whose asker ended, or whose grid
//                       changed, is answered at once with no drain, so the
//                       pending answer holds the ended actor, and its node's
//                       shutdown, no longer)
//   sched    -> lobby   request pool_atom -> vector<string> (with joins: who
//                       is pooled, asked at each verdict; flat_pool)
//   launcher -> sched   request drained_atom, last          -> grid_decision
//   launcher -> sched   request failed_atom, lost, reason   -> grid_decision
//
// The decisions are schedule/'s (regrid, advise_replan, with_measurements,
// membership, the planner); this actor keeps the state they are made on,
// so the launcher only executes: it runs rank processes, commits
// snapshots and prints. Errors are values: a decision that the job cannot
// go on carries the reason (`grid_decision::stop`).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include "actors/train_job.hpp"
#include "model/config.hpp"
#include "schedule/cluster.hpp"
#include "schedule/cost_model.hpp"
#include "schedule/membership.hpp"
#include "schedule/planner.hpp"

namespace caf {
class actor_system;
class actor_system_config;
}  // namespace caf

namespace corolla {

namespace sched_msg {
using started_atom = caf::atom_constant<caf::atom("schstart")>;
using step_atom = caf::atom_constant<caf::atom("schstep")>;
using verdict_atom = caf::atom_constant<caf::atom("schverdict")>;
using drained_atom = caf::atom_constant<caf::atom("schdrained")>;
using failed_atom = caf::atom_constant<caf::atom("schfailed")>;
/// To the lobby: the machines pooled now, as flat_pool writes them.
using pool_atom = caf::atom_constant<caf::atom("lobbypool")>;
}  // namespace sched_msg

/// How long a verdict waits for the lobby's pool.
inline constexpr std::chrono::seconds lobby_answer_timeout{10};

/// A pool as a pool_atom answer: node id, name and machine of each, in order.
std::vector<std::string> flat_pool(const std::vector<schedule::machine_offer>& pool);
/// The pool of a pool_atom answer (a trailing partial triple is ignored).
std::vector<schedule::machine_offer> pool_of_flat(const std::vector<std::string>& flat);

/// What the scheduler starts from.
struct scheduler_setup {
  train_layout layout;  ///< the first grid
  int steps = 0, batch = 0, micro_batch = 0;
  model_config cfg;
  schedule::training_setup training;
  int min_ranks = 1;
  /// --cluster: the file, the workers not there at start (--standby) and
  /// the first plan; `planner` plans on a description (the flags' batch,
  /// micro-batch and sequence).
  std::optional<schedule::cluster_description> file;
  std::set<std::string> standby;
  std::optional<schedule::plan> plan;
  std::function<schedule::plan(const schedule::cluster_description&)> planner;
  bool probing = false;  ///< --cluster --probe-every: re-plan on measured links and speeds
  bool joins = false;    ///< a lobby is open: machines may join
  /// With joins: the lobby actor (answers pool_atom; detached, since it
  /// lives in another actor system), asked for the pool at each verdict.
  /// Null: a verdict takes the drain_query's pool as given.
  caf::actor pool;
};

/// Which machine runs each rank of a grid: the launcher's own processes,
/// or machines that joined.
struct rank_machines {
  /// --pp/--dp: ranks [0, local) are the launcher's, ranks from `local` on
  /// run on `joined` in order.
  int local = 0;
  std::vector<schedule::machine_offer> joined;
  /// --cluster: the joined machine of each worker it stands for.
  bool by_worker = false;
  std::map<std::string, schedule::machine_offer> workers;

  /// The joined machine running `rank` of `l`, or null (the launcher's).
  const schedule::machine_offer* of(const train_layout& l, int rank) const;
  bool any() const { return by_worker ? !workers.empty() : !joined.empty(); }
};

/// A drain step's question: its report and, with a lobby, who is pooled
/// (`pool_ok` false when the lobby did not answer: nobody can join now).
/// A scheduler with a pool actor (scheduler_setup::pool) fills the pool in
/// itself.
struct drain_query {
  dist_step_report report;
  bool pool_ok = false;
  std::vector<schedule::machine_offer> pool;
};

/// The answer at a drain step; `notes` are lines for stderr, in order.
struct drain_verdict {
  bool drain = false;
  std::vector<std::string> notes;
};

/// What the job runs next, and why.
struct grid_decision {
  /// Non-empty: the job cannot go on; the whole error message.
  std::string stop;
  /// --pp/--dp: the grid. --cluster: the plan on `machines` (the launcher
  /// lays it out), and the grid stays empty.
  train_layout layout;
  std::optional<schedule::cluster_description> machines;
  std::optional<schedule::plan> plan;
  rank_machines where;
  /// The re-plan event: what changed (planned re-plans), the cost model's
  /// step as running and re-planned, and what is left to plan on.
  std::vector<std::string> changes;
  std::string cause;
  double predicted_from_s = 0, predicted_to_s = 0;
  int ranks_left = 0;
  std::string left_unit = "rank(s)";
  std::vector<std::string> notes;  ///< lines for stderr, in order
};

/// The scheduler actor and the actor system it runs in; the calls below
/// are the launcher's side of the protocol (blocking requests).
class train_scheduler {
 public:
  /// Throws std::invalid_argument for a bad --standby.
  explicit train_scheduler(scheduler_setup setup);
  ~train_scheduler();
  train_scheduler(const train_scheduler&) = delete;
  train_scheduler& operator=(const train_scheduler&) = delete;

  caf::actor actor() const { return actor_; }
  /// Grid `l` is starting now (its first step will tell what a switch costs).
  void started(const train_layout& l);
  /// Every step's report (asynchronous).
  void step(const dist_step_report& r);
  /// At a drain step: whether the job stops there for another plan (the
  /// coordinator asks the actor itself; this is the blocking form).
  drain_verdict verdict(const drain_query& q);
  /// The job drained after step `last`: the plan the verdict chose.
  grid_decision drained(int last);
  /// Ranks `lost` (of the running grid) failed with `reason`: the grid of
  /// what is left.
  grid_decision failed(const std::vector<int>& lost, const std::string& reason);

 private:
  template <class R, class... Ts>
  R ask(Ts&&... xs);
  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor actor_;
};

}  // namespace corolla

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::train_layout)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::dist_step_report)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::drain_query)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::drain_verdict)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::grid_decision)
