// Where a new generation's prompt starts (schedule/prompt_reuse.hpp).
#include "schedule/prompt_reuse.hpp"

#include <algorithm>

namespace corolla::schedule {
namespace {

/// The longest common prefix of `held` and `prompt`, at most `limit` tokens.
std::size_t common_prefix(const std::vector<std::int32_t>& held, const std::vector<std::int32_t>& prompt,
                          std::size_t limit) {
  limit = std::min({limit, held.size(), prompt.size()});
  std::size_t n = 0;
  while (n < limit && held[n] == prompt[n]) ++n;
  return n;
}

}  // namespace

std::size_t reusable_tokens(const std::vector<std::int32_t>& prompt) { return prompt.empty() ? 0 : prompt.size() - 1; }

prompt_start plan_prompt_start(const std::vector<std::int32_t>& prompt, const std::list<std::string>& retained,
                               const session_ids& cached, bool share, const session_filter& usable) {
  using how = prompt_start::how;
  const std::size_t limit = reusable_tokens(prompt);
  prompt_start whole{how::continue_retained}, cut{how::continue_retained}, pages{how::share};
  for (const std::string& id : retained) {  // the most recently finished first
    const auto it = cached.find(id);
    if (it == cached.end() || (usable && !usable(id))) continue;
    const auto n = static_cast<std::int64_t>(common_prefix(it->second, prompt, limit));
    prompt_start& p = static_cast<std::size_t>(n) == it->second.size() ? whole : cut;
    if (n > p.tokens) p.session = id, p.tokens = n;
  }
  if (!share) {
    const prompt_start& best = whole.tokens >= cut.tokens ? whole : cut;
    return best.tokens > 0 ? best : prompt_start{};
  }
  for (const auto& [id, held] : cached) {
    if (usable && !usable(id)) continue;
    const auto n = static_cast<std::int64_t>(common_prefix(held, prompt, limit));
    if (n > pages.tokens) pages.session = id, pages.tokens = n;
  }
  if (whole.tokens > 0 && whole.tokens >= pages.tokens) return whole;
  if (pages.tokens > 0) return pages;
  return {};
}

std::optional<prompt_wait> prompt_to_wait_for(const std::vector<std::int32_t>& prompt, const session_ids& prompts,
                                              const session_ids& cached, std::int64_t now, std::int64_t page_tokens,
                                              const session_filter& usable) {
  const std::size_t limit = reusable_tokens(prompt);
  std::optional<prompt_wait> best;
  for (const auto& [id, theirs] : prompts) {
    if (usable && !usable(id)) continue;
    const auto n = static_cast<std::int64_t>(common_prefix(theirs, prompt, limit));
    const auto held = cached.find(id);
    const auto has = held == cached.end() ? 0 : static_cast<std::int64_t>(held->second.size());
    if (n >= now + page_tokens && has < n && (!best || n > best->tokens)) best = prompt_wait{id, n};
  }
  return best;
}

}  // namespace corolla::schedule
