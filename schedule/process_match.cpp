// schedule/process_match.cpp — see process_match.hpp.
#include "schedule/process_match.hpp"

#include <algorithm>

namespace corolla::schedule {

double shared_bytes(const std::set<std::string>& needs, const std::set<std::string>& holds, const bucket_bytes& bytes) {
  double shared = 0;
  for (const std::string& b : needs) {
    if (!holds.count(b)) continue;
    const auto it = bytes.find(b);
    shared += it == bytes.end() ? 1.0 : it->second;
  }
  return shared;
}

std::vector<int> match_processes(const std::vector<std::set<std::string>>& needs,
                                 const std::vector<std::set<std::string>>& holds, const bucket_bytes& bytes) {
  std::vector<int> out(needs.size(), -1);
  std::vector<bool> taken(holds.size(), false);
  const std::size_t pairs = std::min(needs.size(), holds.size());
  for (std::size_t k = 0; k < pairs; ++k) {
    double best = -1;
    std::size_t best_rank = 0, best_process = 0;
    for (std::size_t r = 0; r < needs.size(); ++r) {
      if (out[r] >= 0) continue;
      for (std::size_t p = 0; p < holds.size(); ++p) {
        if (taken[p]) continue;
        const double shared = shared_bytes(needs[r], holds[p], bytes);
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
