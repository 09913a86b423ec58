// api/swarm_prefix_board.hpp — which running swarm generation's servers a
// new request's prompt can start on. The API's swarm slots each open their
// own session, but they are sessions of one node: a server starts a new one
// on the KV pages of another of that node's sessions (span.open shareFrom),
// so requests after one system prompt compute it once per server, not once
// each. The board knows what each running generation's session holds (its
// prompt, once computed) and decides with schedule/prompt_reuse.hpp: start
// on the session holding most of the prompt, or wait for a running one that
// is still computing at least a page more of it (requests arriving
// together).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/swarm_client.hpp"
#include "schedule/prompt_reuse.hpp"

namespace corolla::api {

/// What the board has done so far.
struct prefix_board_stats {
  std::uint64_t shared_sessions = 0;  ///< generations started on another's pages
  std::uint64_t shared_tokens = 0;    ///< prompt tokens they were offered
  std::uint64_t waits = 0;            ///< generations that waited for another's prompt
};

class swarm_prefix_board {
 public:
  /// Shares at least `min_tokens` (shorter prefixes are computed: pinning a
  /// request to another's route is not worth less than a page), waits at
  /// most `max_wait` for another's prompt.
  explicit swarm_prefix_board(std::int64_t min_tokens = 16,
                              std::chrono::milliseconds max_wait = std::chrono::seconds(30));

  /// Request `id` with `prompt` starts now: returns where (the prefix of the
  /// running generation holding the most of the prompt, its tokens cut to
  /// what they have in common; empty = compute it all), after waiting while
  /// a running generation computes at least a page more of it. `id` is then
  /// running until leave().
  swarm_prefix enter(const std::string& id, const std::vector<std::int32_t>& prompt);
  /// Request `id`'s session now holds its prompt: `held`. Empty: it has
  /// nothing to offer (a replacement still being rebuilt, or its session
  /// closing); nobody waits for it or starts on it any more.
  void computed(const std::string& id, swarm_prefix held);
  /// Request `id` ended (its session closes next): nobody starts on it.
  void leave(const std::string& id);

  prefix_board_stats stats() const;

 private:
  std::int64_t min_tokens_;
  std::chrono::milliseconds max_wait_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  schedule::session_ids prompts_;  ///< running requests' prompts
  schedule::session_ids cached_;   ///< the prompt ids each running session holds
  std::map<std::string, swarm_prefix> held_;
  prefix_board_stats stats_;
};

}  // namespace corolla::api
