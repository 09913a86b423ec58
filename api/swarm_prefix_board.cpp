#include "api/swarm_prefix_board.hpp"

#include <algorithm>

namespace corolla::api {

swarm_prefix_board::swarm_prefix_board(std::int64_t min_tokens, std::chrono::milliseconds max_wait)
    : min_tokens_(std::max<std::int64_t>(min_tokens, 1)), max_wait_(max_wait) {}

namespace {

/// The prefix `plan` starts on, cut to the tokens it shares (empty unless
/// it shares a session on the board).
swarm_prefix board_start(const schedule::prompt_start& plan, const std::map<std::string, swarm_prefix>& held) {
  swarm_prefix out;
  if (plan.kind != schedule::prompt_start::how::share) return out;
  const auto it = held.find(plan.session);
  if (it == held.end()) return out;
  out = it->second;
  out.tokens = std::min(out.tokens, plan.tokens);
  return out;
}

}  // namespace

swarm_prefix swarm_prefix_board::enter(const std::string& id, const std::vector<std::int32_t>& prompt) {
  std::unique_lock lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + max_wait_;
  swarm_prefix start;
  bool waited = false, timed_out = false;
  for (;;) {
    start = board_start(schedule::plan_prompt_start(prompt, {}, cached_, true), held_);
    if (start.tokens < min_tokens_) start = {};
    // Someone computing a page more of this prompt than any session holds:
    // its pages come soon, and computing them twice is what this avoids.
    const auto wait = schedule::prompt_to_wait_for(prompt, prompts_, cached_, std::max<std::int64_t>(start.tokens, 0),
                                                   min_tokens_);
    if (!wait || timed_out) break;
    waited = true;
    timed_out = changed_.wait_until(lock, deadline) == std::cv_status::timeout;  // then plans once more
  }
  if (waited) ++stats_.waits;
  if (!start.empty()) {
    ++stats_.shared_sessions;
    stats_.shared_tokens += static_cast<std::uint64_t>(start.tokens);
  }
  prompts_[id] = prompt;
  return start;
}

void swarm_prefix_board::computed(const std::string& id, swarm_prefix held) {
  {
    std::lock_guard lock(mutex_);
    const auto p = prompts_.find(id);
    if (p == prompts_.end()) return;
    if (held.empty()) {
      // Nothing to offer: those waiting for it stop waiting.
      prompts_.erase(p);
      cached_.erase(id);
      held_.erase(id);
    } else {
      const auto n = std::min<std::size_t>(static_cast<std::size_t>(held.tokens), p->second.size());
      cached_[id].assign(p->second.begin(), p->second.begin() + static_cast<std::ptrdiff_t>(n));
      held.tokens = static_cast<std::int64_t>(n);
      held_[id] = std::move(held);
    }
  }
  changed_.notify_all();
}

void swarm_prefix_board::leave(const std::string& id) {
  {
    std::lock_guard lock(mutex_);
    prompts_.erase(id);
    cached_.erase(id);
    held_.erase(id);
  }
  changed_.notify_all();
}

prefix_board_stats swarm_prefix_board::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace corolla::api
