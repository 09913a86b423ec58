// apps/train_cluster_members.hpp — the machines of an elastic `--cluster`
// job (apps/train_elastic.cpp). The cluster file describes every machine
// the job may use; `--standby` names workers that are not there at start,
// and workers the job loses are absent again. A machine joins with
// `corolla train --join ENDPOINT --join-name WORKER`, naming an absent
// worker of the file (apps/train_lobby.hpp); from the next re-plan that
// pays off (schedule::advise_replan on the grown description) the ranks
// the planner places on that worker run on the joined machine. The
// scheduling decisions are schedule/'s (schedule/membership.hpp); this
// keeps who is who.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "apps/train_lobby.hpp"
#include "schedule/cluster.hpp"

namespace corolla::app {

class cluster_members {
 public:
  /// Throws std::invalid_argument naming a worker of `absent` that the file lacks.
  cluster_members(schedule::cluster_description file, std::set<std::string> absent);

  const schedule::cluster_description& file() const { return file_; }
  const std::set<std::string>& absent() const { return absent_; }
  /// The present workers' description, carrying what `learned` measured.
  schedule::cluster_description present(const schedule::cluster_description* learned = nullptr) const;

  /// Pooled workers that offer themselves as an absent worker of the file
  /// (their --join-name) and have not joined; stderr says once of each
  /// other new offer why it waits.
  std::vector<lobby_worker> candidates(const std::vector<lobby_worker>& pool);
  /// The present description once `joining` joined (what `learned`
  /// measured carried over).
  schedule::cluster_description with_joined(const std::vector<lobby_worker>& joining,
                                            const schedule::cluster_description& learned) const;
  /// `joining` joined: present from now on, their ranks on their machines.
  void join(const std::vector<lobby_worker>& joining);
  /// Workers lost (by name): absent again; a joined one's machine no longer
  /// stands for it (it may offer itself again).
  void lose(const std::vector<std::string>& names);

  /// The joined machine running worker `name`, or null (this launcher runs it).
  const lobby_worker* machine_of(const std::string& name) const;
  /// Whether any worker runs on a joined machine.
  bool any_joined() const { return !joined_.empty(); }

 private:
  schedule::cluster_description file_;
  std::set<std::string> absent_;
  std::map<std::string, lobby_worker> joined_;  ///< by worker name
  std::set<std::string> told_;                  ///< node ids already told why they wait
};

}  // namespace corolla::app
