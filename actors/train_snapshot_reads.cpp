// actors/train_snapshot_reads.cpp — see train_snapshot_reads.hpp.
#include "actors/train_snapshot_reads.hpp"

#include <algorithm>
#include <set>

namespace corolla {

namespace {

bool lists(const snapshot_listing& l, const std::string& name) {
  return std::any_of(l.tensors.begin(), l.tensors.end(), [&](const auto& t) { return t.first == name; });
}

}  // namespace

std::map<std::pair<std::string, int>, std::vector<std::string>> plan_snapshot_reads(
    const std::map<int, chosen_copy>& chosen, const std::vector<snapshot_listing>& local, const std::string& self,
    const std::vector<shard_want>& wanted) {
  std::map<std::pair<std::string, int>, std::vector<std::string>> reads;
  std::set<std::string> params_taken;
  for (const shard_want& w : wanted)
    for (const snapshot_listing& l : local)
      if (chosen.count(l.owner) && !params_taken.count(w.bucket) && lists(l, "params." + w.bucket)) {
        reads[{self, l.owner}].push_back("params." + w.bucket);
        params_taken.insert(w.bucket);
      }
  for (const auto& [owner, copy] : chosen) {
    const auto mine = std::find_if(local.begin(), local.end(), [o = owner](const snapshot_listing& l) { return l.owner == o; });
    for (const shard_want& w : wanted) {
      if (!params_taken.count(w.bucket) && lists(copy.listing, "params." + w.bucket)) {
        reads[{copy.node, owner}].push_back("params." + w.bucket);
        params_taken.insert(w.bucket);
      }
      const auto r = copy.listing.ranges.find(w.bucket);
      if (r == copy.listing.ranges.end() || r->second.lo >= w.hi || w.lo >= r->second.hi) continue;
      const bool here = mine != local.end() && lists(*mine, "m." + w.bucket) && lists(*mine, "v." + w.bucket);
      auto& names = reads[{here ? self : copy.node, owner}];
      names.push_back("m." + w.bucket);
      names.push_back("v." + w.bucket);
    }
  }
  return reads;
}

}  // namespace corolla
