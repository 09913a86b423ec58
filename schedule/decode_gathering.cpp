#include "schedule/decode_gathering.hpp"

#include <algorithm>
#include <set>

namespace corolla::swarm {

void decode_gathering::ran(const std::vector<std::string>& sessions, double seconds) {
  recent_.push_back(sessions);
  while (static_cast<int>(recent_.size()) > std::max(policy_.remember_batches, 0)) recent_.pop_front();
  last_seconds_ = seconds;
}

void decode_gathering::forget(const std::string& session) {
  for (auto& batch : recent_) std::erase(batch, session);
}

void decode_gathering::expect(const std::string& session) {
  if (recent_.empty()) return;
  auto& last = recent_.back();
  if (std::find(last.begin(), last.end(), session) == last.end()) last.push_back(session);
}

std::vector<std::string> decode_gathering::missing(const std::vector<std::string>& queued) const {
  const std::set<std::string> in(queued.begin(), queued.end());
  std::set<std::string> out;
  for (const auto& batch : recent_)
    for (const auto& s : batch)
      if (!in.count(s)) out.insert(s);
  return {out.begin(), out.end()};
}

std::chrono::microseconds decode_gathering::wait(const std::vector<std::string>& queued,
                                                 std::chrono::microseconds waited) const {
  if (missing(queued).empty()) return std::chrono::microseconds(0);
  const auto budget = std::min(policy_.max_wait, std::chrono::microseconds(static_cast<std::int64_t>(
                                                     policy_.wait_fraction * last_seconds_ * 1e6)));
  return std::max(budget - waited, std::chrono::microseconds(0));
}

}  // namespace corolla::swarm
