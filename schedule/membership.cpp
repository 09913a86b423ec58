// schedule/membership.cpp — see schedule/membership.hpp.
#include "schedule/membership.hpp"

#include <map>
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

}  // namespace corolla::schedule
