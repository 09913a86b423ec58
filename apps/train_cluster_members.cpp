// apps/train_cluster_members.cpp — see apps/train_cluster_members.hpp.
#include "apps/train_cluster_members.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "schedule/membership.hpp"

namespace corolla::app {

cluster_members::cluster_members(schedule::cluster_description file, std::set<std::string> absent)
    : file_(std::move(file)), absent_(std::move(absent)) {
  for (const std::string& name : absent_)
    if (std::none_of(file_.workers.begin(), file_.workers.end(),
                     [&](const schedule::worker_spec& w) { return w.name == name; }))
      throw std::invalid_argument("--standby: " + file_.origin + " has no worker '" + name + "'");
  if (absent_.size() >= file_.workers.size())
    throw std::invalid_argument("--standby names every worker of " + file_.origin + ": none is left to start on");
}

schedule::cluster_description cluster_members::present(const schedule::cluster_description* learned) const {
  return schedule::present_workers(file_, absent_, learned);
}

std::vector<lobby_worker> cluster_members::candidates(const std::vector<lobby_worker>& pool) {
  std::vector<lobby_worker> out;
  std::set<std::string> taken;  // one machine per worker name
  for (const lobby_worker& w : pool) {
    const bool joined = std::any_of(joined_.begin(), joined_.end(),
                                    [&](const auto& j) { return j.second.node_id == w.node_id; });
    if (joined) continue;
    if (absent_.count(w.name) && !taken.count(w.name)) {
      taken.insert(w.name);
      out.push_back(w);
      continue;
    }
    if (!told_.insert(w.node_id).second) continue;
    std::string names;
    for (const std::string& a : absent_) names += (names.empty() ? "" : ", ") + a;
    std::fprintf(stderr,
                 "elastic: worker %s (node %s) waits: a --cluster job takes a machine as an absent worker of %s, "
                 "named with --join-name (absent: %s)\n",
                 w.name.c_str(), w.node_id.c_str(), file_.name.c_str(), names.empty() ? "none" : names.c_str());
  }
  return out;
}

schedule::cluster_description cluster_members::with_joined(const std::vector<lobby_worker>& joining,
                                                           const schedule::cluster_description& learned) const {
  std::set<std::string> still = absent_;
  for (const lobby_worker& w : joining) still.erase(w.name);
  return schedule::present_workers(file_, still, &learned);
}

void cluster_members::join(const std::vector<lobby_worker>& joining) {
  for (const lobby_worker& w : joining) {
    absent_.erase(w.name);
    joined_[w.name] = w;
  }
}

void cluster_members::lose(const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    absent_.insert(n);
    if (auto it = joined_.find(n); it != joined_.end()) {
      told_.erase(it->second.node_id);
      joined_.erase(it);
    }
  }
}

const lobby_worker* cluster_members::machine_of(const std::string& name) const {
  auto it = joined_.find(name);
  return it == joined_.end() ? nullptr : &it->second;
}

}  // namespace corolla::app
