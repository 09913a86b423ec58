// actors/span_server.hpp — the volunteer server's actor: a span of blocks
// (model/span_engine.hpp) behind the name "span" on a node.
//
// Requests (remote_message types, bodies in actors/swarm_wire.hpp):
//   span.info                       -> SpanInfo
//   span.open   SpanOpen            -> SpanInfo (cache left after opening)
//   span.step   SpanStep, hidden    -> output [n, D] (tensor 0)
//   span.close  SpanClose           -> empty answer
//   span.forward / span.backward    -> output / (grad_input[, grad_prompts])
// Errors keep the engine's code on the wire ("unknown_session",
// "cache_full", "bad_position", "invalid_argument", ...) and the session
// stays usable; a malformed body is "bad_message".
//
// One-row decode steps of different sessions that are waiting in the mailbox
// together run as one batch (span_engine::decode_batch); the batch waits
// briefly for sessions of the last batches whose next step is still on its
// way (schedule/decode_gathering.hpp). The actor is
// detached (its own thread): compute never blocks CAF's worker pool.
// Sessions unused for session_idle_timeout are closed (a client that died
// does not hold KV pages forever).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include "actors/span_stats.hpp"
#include "model/span_engine.hpp"
#include "schedule/decode_gathering.hpp"

namespace corolla {

class node;

/// How a span server runs.
struct span_server_options {
  /// Model id announced in span.info (clients check it against theirs).
  std::string model;
  /// Sessions idle this long are closed and their KV pages freed.
  std::chrono::milliseconds session_idle_timeout{std::chrono::minutes(5)};
  /// How long a queue of one-row steps waits for the sessions of the last
  /// batches that have not sent their next step yet (so concurrent sessions
  /// do not split into batches that each read every weight).
  swarm::gathering_policy gathering{};
};

/// Spawns the server actor over `engine` and publishes it on `n` as "span".
/// Errors: the name is taken (errc::already_published).
caf::expected<caf::actor> start_span_server(node& n, std::shared_ptr<span_engine> engine,
                                            span_server_options options);

/// The RTTs (ms, by node id) the server measured to the servers of the block
/// after its span; span.info announces them from now on (for routing
/// between consecutive servers, which push to each other).
void set_next_rtts(const caf::actor& server, std::map<std::string, double> rtt_ms);

/// Starts draining `server` (a graceful shutdown): span.open is refused
/// from now on (`draining`), sessions already open go on. Returns how many
/// sessions are still open (on the current and a retiring engine); call
/// again to follow them down to 0. Errors: the server did not answer
/// within `timeout`.
caf::expected<std::size_t> drain_span_server(caf::actor_system& system, const caf::actor& server,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(5));

/// The server's counters and state now (actors/span_stats.hpp). Errors: it
/// did not answer within `timeout`.
caf::expected<span_server_stats> span_server_stats_of(caf::actor_system& system, const caf::actor& server,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(2));

/// Makes `server` serve `engine` from now on (a server moving to other
/// blocks). New sessions open on `engine`; sessions opened before keep
/// running on the old engine, which stays loaded until the last of them
/// closes or expires (a serving-both phase, so a move costs its clients
/// nothing). A second move while the old engine still drains ends the
/// oldest sessions (unknown_session; clients fail over). Blocks until the
/// switch is done (at most `timeout`).
caf::error swap_span_engine(caf::actor_system& system, const caf::actor& server, std::shared_ptr<span_engine> engine,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace corolla
