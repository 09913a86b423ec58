// schedule/membership.cpp — see schedule/membership.hpp.
#include "schedule/membership.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/error.hpp"

namespace corolla::schedule {

namespace {

/// Worker rank by name in `c`.
std::map<std::string, int> ranks_by_name(const cluster_description& c) {
  std::map<std::string, int> out;
  for (const worker_spec& w : c.workers) out[w.name] = w.rank;
  return out;
}

}  // namespace

cluster_description present_workers(const cluster_description& file, const std::set<std::string>& absent,
                                    const cluster_description* learned) {
  const std::map<std::string, int> in_file = ranks_by_name(file);
  std::vector<int> gone;
  for (const std::string& name : absent) {
    auto it = in_file.find(name);
    if (it == in_file.end()) throw model_error(file.origin + " has no worker '" + name + "'");
    gone.push_back(it->second);
  }
  cluster_description out = gone.empty() ? file : without_workers(file, gone);
  if (!learned) return out;
  const std::map<std::string, int> present = ranks_by_name(out), was = ranks_by_name(*learned);
  for (const auto& [pair, link] : learned->measured)
    if (present.count(pair.first) && present.count(pair.second)) out.measured[pair] = link;
  for (const auto& [name, nominal] : learned->nominal_flops) {
    auto at = present.find(name);
    if (at == present.end()) continue;
    out.nominal_flops[name] = nominal;
    out.workers[static_cast<std::size_t>(at->second)].flops =
        learned->workers[static_cast<std::size_t>(was.at(name))].flops;
  }
  return out;
}

plan renumber_plan(const plan& p, const cluster_description& from, const cluster_description& to) {
  const std::map<std::string, int> in_to = ranks_by_name(to);
  auto map = [&](int r) {
    const std::string& name = from.workers.at(static_cast<std::size_t>(r)).name;
    auto it = in_to.find(name);
    if (it == in_to.end()) throw model_error("the plan's worker '" + name + "' is not in " + to.origin);
    return it->second;
  };
  auto map_cluster = [&](int c) {
    if (c < 0) return c;
    const std::string& name = from.clusters.at(static_cast<std::size_t>(c)).name;
    for (std::size_t i = 0; i < to.clusters.size(); ++i)
      if (to.clusters[i].name == name) return static_cast<int>(i);
    throw model_error("the plan's cluster '" + name + "' is not in " + to.origin);
  };
  plan out = p;
  for (stage_plan& s : out.stages) {
    for (int& r : s.workers) r = map(r);
    s.cluster = map_cluster(s.cluster);  // clusters are numbered again too; NIC classes are not
  }
  out.idle.clear();
  // Every worker of `to` the plan does not use is idle (a worker that
  // joined too).
  std::set<int> used;
  for (const stage_plan& s : out.stages) used.insert(s.workers.begin(), s.workers.end());
  for (const worker_spec& w : to.workers)
    if (!used.count(w.rank)) out.idle.push_back(w.rank);
  return out;
}

cluster_members::cluster_members(cluster_description file, std::set<std::string> absent)
    : file_(std::move(file)), absent_(std::move(absent)) {
  for (const std::string& name : absent_)
    if (std::none_of(file_.workers.begin(), file_.workers.end(),
                     [&](const worker_spec& w) { return w.name == name; }))
      throw std::invalid_argument("--standby: " + file_.origin + " has no worker '" + name + "'");
  if (absent_.size() >= file_.workers.size())
    throw std::invalid_argument("--standby names every worker of " + file_.origin + ": none is left to start on");
}

cluster_description cluster_members::present(const cluster_description* learned) const {
  return present_workers(file_, absent_, learned);
}

std::vector<machine_offer> cluster_members::candidates(const std::vector<machine_offer>& pool,
                                                       std::vector<std::string>* waits) {
  std::vector<machine_offer> out;
  std::set<std::string> taken;  // one machine per worker name
  for (const machine_offer& w : pool) {
    const bool joined = std::any_of(joined_.begin(), joined_.end(),
                                    [&](const auto& j) { return j.second.node_id == w.node_id; });
    if (joined) continue;
    const bool in_file = std::any_of(file_.workers.begin(), file_.workers.end(),
                                     [&](const worker_spec& s) { return s.name == w.name; });
    if (!in_file && !w.machine.empty() && !told_.count(w.node_id)) {
      // A machine the file does not know, describing itself: the file grows.
      try {
        cluster_description grown = with_machine(file_, w.machine, "the machine of worker " + w.name);
        if (grown.workers.back().name != w.name)
          throw model_error("it offers to run as '" + w.name + "', but its description's worker is '" +
                            grown.workers.back().name + "'");
        file_ = std::move(grown);
        absent_.insert(w.name);
      } catch (const std::exception& e) {
        told_.insert(w.node_id);
        if (waits) waits->push_back("worker " + w.name + " (node " + w.node_id + ") cannot join: " + e.what());
        continue;
      }
    }
    if (absent_.count(w.name) && !taken.count(w.name)) {
      taken.insert(w.name);
      out.push_back(w);
      continue;
    }
    if (!told_.insert(w.node_id).second) continue;
    std::string names;
    for (const std::string& a : absent_) names += (names.empty() ? "" : ", ") + a;
    if (waits)
      waits->push_back("worker " + w.name + " (node " + w.node_id + ") waits: a --cluster job takes a machine as an " +
                       "absent worker of " + file_.name + ", named with --join-name (absent: " +
                       (names.empty() ? std::string("none") : names) + ")");
  }
  return out;
}

cluster_description cluster_members::with_joined(const std::vector<machine_offer>& joining,
                                                 const cluster_description& learned) const {
  std::set<std::string> still = absent_;
  for (const machine_offer& w : joining) still.erase(w.name);
  return present_workers(file_, still, &learned);
}

void cluster_members::join(const std::vector<machine_offer>& joining) {
  for (const machine_offer& w : joining) {
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

const machine_offer* cluster_members::machine_of(const std::string& name) const {
  auto it = joined_.find(name);
  return it == joined_.end() ? nullptr : &it->second;
}

}  // namespace corolla::schedule
