// schedule/process_match.cpp — see process_match.hpp.
#include "schedule/process_match.hpp"

#include <algorithm>

namespace corolla::schedule {

int shared_buckets(const std::set<std::string>& needs, const std::set<std::string>& holds) {
  return static_cast<int>(std::count_if(needs.begin(), needs.end(), [&](const std::string& b) { return holds.count(b) > 0; }));
}

std::vector<int> match_processes(const std::vector<std::set<std::string>>& needs,
                                 const std::vector<std::set<std::string>>& holds) {
  std::vector<int> out(needs.size(), -1);
  std::vector<bool> taken(holds.size(), false);
  const std::size_t pairs = std::min(needs.size(), holds.size());
  for (std::size_t k = 0; k < pairs; ++k) {
    int best = -1;
    std::size_t best_rank = 0, best_process = 0;
    for (std::size_t r = 0; r < needs.size(); ++r) {
      if (out[r] >= 0) continue;
      for (std::size_t p = 0; p < holds.size(); ++p) {
        if (taken[p]) continue;
        const int shared = shared_buckets(needs[r], holds[p]);
        if (shared > best) {  // strict: the first (lowest rank, then process) of equals stays
          best = shared;
          best_rank = r;
          best_process = p;
        }
      }
    }
    out[best_rank] = static_cast<int>(best_process);
    taken[best_process] = true;
  }
  return out;
}

}  // namespace corolla::schedule
