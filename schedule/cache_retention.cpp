// schedule/cache_retention.cpp — which kept cache goes first
// (schedule/cache_retention.hpp).
#include "schedule/cache_retention.hpp"

#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <tuple>

namespace corolla::schedule {

std::string next_to_let_go(const std::list<std::string>& kept, const session_ids& cached,
                           const session_domain& domain_of, retention_limit limit) {
  if (kept.empty()) throw std::invalid_argument("next_to_let_go: nothing is kept");
  if (kept.size() == 1) return kept.front();
  struct holding {
    std::int64_t tokens = 0;
    std::int64_t sessions = 0;
    std::int64_t rank_of_oldest = 0;  ///< 0 for the least recently finished of all
    const std::string* oldest = nullptr;
  };
  // By domain; a session without one is keyed by its own id behind a byte
  // no domain key starts with here, so it never joins a named domain.
  std::map<std::string, holding> by_domain;
  std::int64_t rank = 0;
  // Least recently finished first. The most recent counts in its domain's
  // share but is no candidate.
  const auto newest = std::prev(kept.rend());
  for (auto it = kept.rbegin(); it != kept.rend(); ++it, ++rank) {
    const std::string* d = domain_of ? domain_of(*it) : nullptr;
    holding& h = by_domain[d ? "d" + *d : "s" + *it];
    if (!h.oldest && it != newest) {
      h.oldest = &*it;
      h.rank_of_oldest = rank;
    }
    ++h.sessions;
    if (auto c = cached.find(*it); c != cached.end()) h.tokens += static_cast<std::int64_t>(c->second.size());
  }
  const holding* pick = nullptr;
  auto share = [limit](const holding& h) {
    return limit == retention_limit::count ? std::tuple(h.sessions, h.tokens, -h.rank_of_oldest)
                                           : std::tuple(h.tokens, h.sessions, -h.rank_of_oldest);
  };
  for (const auto& [key, h] : by_domain)
    if (h.oldest && (!pick || share(h) > share(*pick))) pick = &h;
  return *pick->oldest;
}

}  // namespace corolla::schedule
