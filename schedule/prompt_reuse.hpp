// schedule/prompt_reuse.hpp — where a new generation's prompt starts, given
// the KV caches a decode batcher holds (actors/decode_batcher.hpp): the
// caches of running generations and of finished ones kept for reuse, each
// known by the token ids it holds. A generation can continue a finished
// generation's cache itself, start on another's pages (shared whole pages,
// the last one copied: kv_sequence::share_prefix), or compute its prompt;
// and it can wait for a running generation still computing the same prefix
// instead of computing it too. Pure: ids in, a decision out; the batcher
// carries it out.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace corolla::schedule {

/// Token ids by session: what each cache holds, or each generation's prompt.
using session_ids = std::unordered_map<std::string, std::vector<std::int32_t>>;

/// Which sessions a new generation may start on or wait for (false: as if
/// it were not there). Empty: every one. A server keeps requests of
/// different cache domains (`cache_salt`) apart with it: none starts on,
/// or waits for, another's cache, so neither `cached_tokens` nor its time
/// to the first token tells it anything of the other's prompt.
using session_filter = std::function<bool(const std::string& session)>;

/// The filter of a generation of cache domain `domain`, given each
/// session's (`domains`: session -> domain, a map or an unordered map,
/// borrowed): sessions of the same domain only; one without an entry is
/// usable by nobody.
template <class Domains>
session_filter same_domain(const Domains& domains, const std::string& domain) {
  return [&domains, &domain](const std::string& session) {
    const auto it = domains.find(session);
    return it != domains.end() && it->second == domain;
  };
}

/// The domain whose caches a generation of cache domain `domain` computing
/// with LoRA adapter `adapter` ("": none) may start on: the same salt and
/// the same adapter (keys and values an adapter computed are of no use to
/// another, and a server refuses to share them: span_engine::share_prefix).
/// Length-prefixed, so no salt spells another adapter's domain.
inline std::string adapter_domain(const std::string& domain, const std::string& adapter) {
  return std::to_string(adapter.size()) + ":" + adapter + domain;
}

/// How a new generation's prompt starts.
struct prompt_start {
  enum class how {
    compute,            ///< from nothing
    continue_retained,  ///< continuing a finished generation's cache (cut back to `tokens`)
    share,              ///< on the pages of `session`'s first `tokens` tokens
  } kind = how::compute;
  std::string session;      ///< the cache continued or shared
  std::int64_t tokens = 0;  ///< prompt tokens not computed then
};

/// The most of `prompt` a cache may spare: all of it but its last token
/// (whose logits are the first sample's).
std::size_t reusable_tokens(const std::vector<std::int32_t>& prompt);

/// The best start for `prompt`. `retained`: the finished generations kept,
/// the most recently finished first; `cached`: the ids every session's
/// cache holds (retained ones included). With `share`, a retained cache
/// the prompt wholly begins with is continued (nothing of it is lost: a
/// chat's next turn), else the prompt starts on the pages of whichever
/// session holds the most of it (that cache stays as it is: a system
/// prompt serves every request after it). Without, the retained cache
/// holding the most of the prompt is continued, cut back to what they share.
/// Sessions `usable` refuses are left out.
prompt_start plan_prompt_start(const std::vector<std::int32_t>& prompt, const std::list<std::string>& retained,
                               const session_ids& cached, bool share, const session_filter& usable = {});

/// A running generation to wait for: its session, and the prompt tokens
/// starting on its pages will spare once its cache holds them.
struct prompt_wait {
  std::string session;
  std::int64_t tokens = 0;
};

/// The running generation (`prompts`: the prompt of each) whose prompt
/// begins as `prompt` does for at least `page_tokens` more tokens than the
/// `now` a cache spares already, and whose cache (`cached`) does not hold
/// them yet: waiting for it spares computing them twice (requests after one
/// system prompt arriving together). The one sparing the most; none when
/// less than a page would be gained (not worth the wait). Sessions `usable`
/// refuses are left out.
std::optional<prompt_wait> prompt_to_wait_for(const std::vector<std::int32_t>& prompt, const session_ids& prompts,
                                              const session_ids& cached, std::int64_t now, std::int64_t page_tokens,
                                              const session_filter& usable = {});

}  // namespace corolla::schedule
