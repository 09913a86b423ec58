// schedule/cache_retention.hpp — which kept cache a server lets go first.
// Finished generations' caches are kept for later prompts that start the
// same way (schedule/prompt_reuse.hpp) until their count or the room they
// take runs out; then one goes. Least-recently-finished alone would let one
// client's burst of requests flush every other client's caches. Here the
// cache domain (a `cache_salt`, a tenant: api/http_api.cpp) that holds the
// most of what ran out (kept caches when their count did, kept tokens when
// the room did) gives up its least recently finished cache: a domain that
// floods the server evicts its own caches first, and one that holds less
// than the others keeps what it has. The most recently finished cache is
// never the one while another is kept (a chat's next turn is the likeliest
// reuse). With one domain this is least-recently-finished. Pure:
// descriptions in, a decision out.
#pragma once

#include <functional>
#include <list>
#include <string>

#include "schedule/prompt_reuse.hpp"

namespace corolla::schedule {

/// The cache domain of session `id`; null when it has none (it is then a
/// domain of its own).
using session_domain = std::function<const std::string*(const std::string& id)>;

/// Each session's domain from `domains` (session -> domain, a map or an
/// unordered map, borrowed); a session without an entry has none.
template <class Domains>
session_domain domain_in(const Domains& domains) {
  return [&domains](const std::string& id) -> const std::string* {
    const auto it = domains.find(id);
    return it == domains.end() ? nullptr : &it->second;
  };
}

/// What ran out, and so what a domain's share is counted in.
enum class retention_limit {
  count,  ///< the number of kept caches: a domain's kept sessions (ties: its tokens)
  room,   ///< KV room: a domain's kept tokens (ties: its sessions)
};

/// The kept session to let go next. `kept`: the kept sessions, the most
/// recently finished first (not empty); `cached`: the token ids each cache
/// holds (a session without an entry counts as holding none). The domain
/// holding the most (by `limit`) gives up its least recently finished
/// session; remaining ties go to the domain whose least recently finished
/// session finished first. The most recently finished session is left out
/// while another is kept.
std::string next_to_let_go(const std::list<std::string>& kept, const session_ids& cached,
                           const session_domain& domain_of, retention_limit limit);

}  // namespace corolla::schedule
