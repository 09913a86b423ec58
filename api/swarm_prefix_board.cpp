#include "api/swarm_prefix_board.hpp"

#include <algorithm>

#include "schedule/cache_retention.hpp"

namespace corolla::api {

swarm_prefix_board::swarm_prefix_board(std::int64_t min_tokens, std::chrono::milliseconds max_wait, std::size_t keep)
    : min_tokens_(std::max<std::int64_t>(min_tokens, 1)), max_wait_(max_wait), keep_(keep) {}

swarm_prefix swarm_prefix_board::enter(const std::string& id, const std::vector<std::int32_t>& prompt,
                                       const std::string& cache_domain) {
  using how = schedule::prompt_start::how;
  std::unique_lock lock(mutex_);
  // Only sessions of the request's own cache domain.
  const schedule::session_filter same_domain = schedule::same_domain(domains_, cache_domain);
  const auto deadline = std::chrono::steady_clock::now() + max_wait_;
  schedule::prompt_start plan;
  bool waited = false, timed_out = false;
  for (;;) {
    // Any session on the board, running or kept, may be started on; a kept
    // one the prompt wholly begins with is continued (a chat's next turn).
    plan = schedule::plan_prompt_start(prompt, {kept_.begin(), kept_.end()}, cached_, true, same_domain);
    if (plan.tokens < min_tokens_ || !held_.count(plan.session)) plan = {};
    // Someone computing a page more of this prompt than any session holds:
    // its pages come soon, and computing them twice is what this avoids.
    const auto wait = schedule::prompt_to_wait_for(prompt, prompts_, cached_, plan.tokens, min_tokens_, same_domain);
    if (!wait || timed_out) break;
    if (!waited) ++stats_.waiting;
    waited = true;
    timed_out = changed_.wait_until(lock, deadline) == std::cv_status::timeout;  // then plans once more
  }
  if (waited) {
    ++stats_.waits;
    --stats_.waiting;
  }
  swarm_prefix start;
  if (plan.kind != how::compute) {
    start = held_.at(plan.session);
    start.tokens = std::min(start.tokens, plan.tokens);
    ++stats_.shared_sessions;
    stats_.shared_tokens += static_cast<std::uint64_t>(start.tokens);
    starts_[id] = {plan.session, plan.kind == how::continue_retained};
  }
  prompts_[id] = prompt;
  domains_[id] = cache_domain;
  return start;
}

swarm_prefix swarm_prefix_board::computed(const std::string& id, swarm_prefix held) {
  std::vector<swarm_prefix> superseded;
  {
    std::lock_guard lock(mutex_);
    const auto p = prompts_.find(id);
    if (p == prompts_.end()) return {};
    if (held.empty()) {
      forget(id);  // nothing to offer: those waiting for it stop waiting
    } else {
      const auto n = std::min<std::size_t>(static_cast<std::size_t>(held.tokens), p->second.size());
      cached_[id].assign(p->second.begin(), p->second.begin() + static_cast<std::ptrdiff_t>(n));
      held.tokens = static_cast<std::int64_t>(n);
      held_[id] = std::move(held);
      // A kept session this one continues whole is superseded: this one
      // holds all it held (and will be kept longer).
      const auto s = starts_.find(id);
      if (s != starts_.end() && s->second.continues &&
          std::find(kept_.begin(), kept_.end(), s->second.from) != kept_.end())
        drop_kept(s->second.from, superseded);
    }
  }
  changed_.notify_all();
  return superseded.empty() ? swarm_prefix{} : std::move(superseded.front());
}

swarm_prefix_board::finish swarm_prefix_board::finished(const std::string& id, swarm_prefix held,
                                                        std::vector<std::int32_t> ids, bool start_missed) {
  finish out;
  {
    std::lock_guard lock(mutex_);
    // The kept session offered gave nothing: no one else should try it.
    if (const auto s = starts_.find(id); s != starts_.end() && start_missed &&
                                         std::find(kept_.begin(), kept_.end(), s->second.from) != kept_.end())
      drop_kept(s->second.from, out.close);
    forget(id);
    if (keep_ > 0 && !held.empty() && static_cast<std::int64_t>(ids.size()) >= min_tokens_) {
      held.tokens = std::min<std::int64_t>(held.tokens, static_cast<std::int64_t>(ids.size()));
      ids.resize(static_cast<std::size_t>(held.tokens));
      cached_[id] = std::move(ids);
      held_[id] = std::move(held);
      kept_.push_front(id);
      ++stats_.kept;
      out.keep = true;
      // The domain holding the most kept sessions lets its least recently
      // finished one go (schedule/cache_retention.hpp).
      while (kept_.size() > keep_)
        drop_kept(schedule::next_to_let_go(kept_, cached_, schedule::domain_in(domains_),
                                           schedule::retention_limit::count),
                  out.close);
    } else {
      domains_.erase(id);
    }
  }
  changed_.notify_all();
  return out;
}

void swarm_prefix_board::leave(const std::string& id) {
  {
    std::lock_guard lock(mutex_);
    if (std::find(kept_.begin(), kept_.end(), id) != kept_.end()) return;
    forget(id);
    domains_.erase(id);
  }
  changed_.notify_all();
}

std::vector<swarm_prefix> swarm_prefix_board::drop_all_kept() {
  std::vector<swarm_prefix> close;
  std::lock_guard lock(mutex_);
  while (!kept_.empty()) {
    const std::string id = kept_.back();  // drop_kept removes it from kept_: not a reference into it
    drop_kept(id, close);
  }
  return close;
}

void swarm_prefix_board::drop_kept(const std::string& id, std::vector<swarm_prefix>& close) {
  kept_.remove(id);
  if (const auto h = held_.find(id); h != held_.end()) close.push_back(std::move(h->second));
  held_.erase(id);
  cached_.erase(id);
  domains_.erase(id);
  ++stats_.dropped;
}

void swarm_prefix_board::forget(const std::string& id) {
  prompts_.erase(id);
  cached_.erase(id);
  held_.erase(id);
  starts_.erase(id);
}

prefix_board_stats swarm_prefix_board::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace corolla::api
