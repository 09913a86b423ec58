// api/swarm_prefix_board.hpp — which swarm session a new request's prompt
// can start on. The API's swarm slots each open their own session, but they
// are sessions of one node: a server starts a new one on the KV pages of
// another of that node's sessions (span.open shareFrom), running or parked
// (span.close keep). So requests after one system prompt compute it once
// per server, not once each, and a chat's next turn computes only what is
// new. The board knows what each running request's session holds (its
// prompt, once computed) and what each finished one it kept holds (prompt
// and reply), and decides with schedule/prompt_reuse.hpp: start on the
// session holding the most of the prompt, or wait for a running one that
// is still computing at least a page more of it (requests arriving
// together).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
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
  std::uint64_t waiting = 0;          ///< generations waiting for another's prompt now
  std::uint64_t kept = 0;             ///< finished generations whose sessions were parked
  std::uint64_t dropped = 0;          ///< parked sessions let go (too many kept, superseded, or gone)
};

class swarm_prefix_board {
 public:
  /// Shares at least `min_tokens` (shorter prefixes are computed: tying a
  /// request to another's route is not worth less than a page), waits at
  /// most `max_wait` for another's prompt, keeps at most `keep` finished
  /// generations' sessions (parked; 0: none).
  explicit swarm_prefix_board(std::int64_t min_tokens = 16,
                              std::chrono::milliseconds max_wait = std::chrono::seconds(30), std::size_t keep = 0);

  /// Request `id` with `prompt` starts now: returns where (the prefix of the
  /// session, running or kept, holding the most of the prompt, its tokens
  /// cut to what they have in common; empty = compute it all), after
  /// waiting while a running generation computes at least a page more of
  /// it. `id` is then running until finished() or leave(). Only sessions
  /// of requests of the same `cache_domain` are started on or waited for
  /// (schedule::session_filter; "" is the default domain).
  swarm_prefix enter(const std::string& id, const std::vector<std::int32_t>& prompt,
                     const std::string& cache_domain = {});
  /// Request `id`'s session now holds its prompt: `held` (empty: nothing to
  /// offer; nobody waits for it). Returns the kept session it continued
  /// (its prompt began with all that one held: a chat's next turn), now
  /// superseded and let go from the board, for the caller to close (empty
  /// when none).
  swarm_prefix computed(const std::string& id, swarm_prefix held);

  /// What finished() decided.
  struct finish {
    bool keep = false;                ///< park the session: it is on the board
    std::vector<swarm_prefix> close;  ///< kept sessions let go, for the caller to close
  };
  /// Request `id` ended: its session holds `held`, the positions of `ids`.
  /// `start_missed`: the start enter() offered gave it nothing (that
  /// session is gone from its servers, or its route is not usable), so a
  /// kept one is let go.
  finish finished(const std::string& id, swarm_prefix held, std::vector<std::int32_t> ids, bool start_missed);
  /// Request `id` ended without finished() (it failed): nobody starts on it.
  void leave(const std::string& id);
  /// Lets every kept session go (the engine stops), for the caller to close.
  std::vector<swarm_prefix> drop_all_kept();

  prefix_board_stats stats() const;

 private:
  /// Lets kept session `id` go; its prefix goes to `close`.
  void drop_kept(const std::string& id, std::vector<swarm_prefix>& close);
  /// Forgets running request `id` (not a kept one).
  void forget(const std::string& id);

  std::int64_t min_tokens_;
  std::chrono::milliseconds max_wait_;
  std::size_t keep_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  schedule::session_ids prompts_;  ///< running requests' prompts
  schedule::session_ids cached_;   ///< the ids each session on the board holds (running and kept)
  std::map<std::string, swarm_prefix> held_;
  /// The cache domain of each request from enter() until it leaves the
  /// board (left, finished unkept, or its kept session dropped): also
  /// while it offers nothing (computed() with nothing held). A session
  /// without one is started on by nobody.
  std::map<std::string, std::string> domains_;
  std::list<std::string> kept_;    ///< finished requests' parked sessions, the most recent first
  /// What each running request started on: the session, and whether it
  /// continues that (kept) session whole.
  struct start_record {
    std::string from;
    bool continues = false;
  };
  std::map<std::string, start_record> starts_;
  prefix_board_stats stats_;
};

}  // namespace corolla::api
