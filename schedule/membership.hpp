// schedule/membership.hpp — which machines of a cluster file an elastic job
// runs on. The file describes every machine the job may use; some are
// absent: standby machines that have not joined yet (`--standby`), and
// machines the job lost. The planner plans on the present ones, with what
// the job has measured of them so far; a machine that joins (or comes
// back) adds itself to the description, and the running plan is priced on
// the grown description under its new worker numbering. Pure:
// descriptions in, descriptions and plans out; cluster_members keeps who
// of the file is there and which joined machine stands for which worker
// (bookkeeping, no I/O).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::schedule {

/// `file` without the workers named in `absent` (without_workers: file
/// order kept, workers numbered again from 0), carrying over what
/// `learned` (an earlier present description of the same file, or null)
/// measured of the workers both hold: measured links between two present
/// workers, and a straggler's replaced FLOP/s with its nominal figure.
/// Throws model_error naming a worker of `absent` the file does not have,
/// or when no worker is left.
cluster_description present_workers(const cluster_description& file, const std::set<std::string>& absent,
                                    const cluster_description* learned = nullptr);

/// `p`, a plan over the workers of `from`, with its workers (every stage's
/// and the idle) numbered as in `to`, by worker name: the same layout on
/// a description that gained (or lost, elsewhere) workers. Throws
/// model_error naming a worker of the plan that `to` does not have.
plan renumber_plan(const plan& p, const cluster_description& from, const cluster_description& to);

/// A machine that offers itself to a running job: its node and the name
/// it offers to run as (a worker of the cluster file, or any label), and
/// optionally what it is (`machine`: a machine of no worker of the file
/// describes itself, schedule::with_machine's TOML; its name is then
/// "<its node name>/0").
struct machine_offer {
  std::string node_id;
  std::string name;
  std::string machine;
};

/// The machines of an elastic `--cluster` job. The file describes every
/// machine the job may use; some are absent (standby machines not there
/// yet, machines lost). A machine joins naming an absent worker of the
/// file; from the next re-plan that pays off, the ranks the planner places
/// on that worker run on it.
class cluster_members {
 public:
  /// Throws std::invalid_argument naming a worker of `absent` that the
  /// file lacks, or when `absent` leaves no worker.
  cluster_members(cluster_description file, std::set<std::string> absent);

  const cluster_description& file() const { return file_; }
  const std::set<std::string>& absent() const { return absent_; }
  /// The present workers' description, carrying what `learned` measured.
  cluster_description present(const cluster_description* learned = nullptr) const;

  /// Pooled machines that offer themselves as an absent worker of the
  /// file and have not joined (one per worker name). A machine that is no
  /// worker of the file and describes itself (machine_offer::machine)
  /// first becomes one: the file grows by its node (with_machine), absent
  /// until it joins. Of each other new offer (and each description that
  /// does not fit the file), once, a line saying why it waits goes to
  /// `waits`.
  std::vector<machine_offer> candidates(const std::vector<machine_offer>& pool, std::vector<std::string>* waits = nullptr);
  /// The present description once `joining` joined (what `learned`
  /// measured carried over).
  cluster_description with_joined(const std::vector<machine_offer>& joining, const cluster_description& learned) const;
  /// `joining` joined: present from now on, their ranks on their machines.
  void join(const std::vector<machine_offer>& joining);
  /// Workers lost (by name): absent again; a joined one's machine no longer
  /// stands for it (it may offer itself again).
  void lose(const std::vector<std::string>& names);

  /// The joined machine running worker `name`, or null (the launcher runs it).
  const machine_offer* machine_of(const std::string& name) const;
  /// Every joined machine, by the worker name it runs as.
  const std::map<std::string, machine_offer>& joined() const { return joined_; }

 private:
  cluster_description file_;
  std::set<std::string> absent_;
  std::map<std::string, machine_offer> joined_;  ///< by worker name
  std::set<std::string> told_;                   ///< node ids already told why they wait
};

}  // namespace corolla::schedule
