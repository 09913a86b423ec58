// actors/span_sessions.hpp — a span server's sessions (actors/span_server.cpp):
// which engine each runs on, opening one (on another session's pages with
// shareFrom) and closing or parking it, its owner, idle expiry, and what
// span.info reports. Internal to the span server (docs/protocol.md,
// docs/swarm_serving.md "Sessions and the paged KV cache").
//
// Parked sessions: a client closing a session with `keep` (span.close)
// ends its steps but lets the server keep its KV pages for that node's
// later sessions (span.open shareFrom: a chat's next turn starts on the
// last turn's pages). They are the first memory the server takes back: the
// oldest go whenever a step needs their pages, when they would hold more
// than half the budget, when the server drains or moves, and like any
// session after the idle timeout.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>
#include <caf/response_promise.hpp>

#include "actors/messages.hpp"
#include "actors/span_server_state.hpp"

namespace corolla::span_detail {

/// The engine a session runs on: the retiring one for sessions opened
/// before the last move, the current one otherwise.
span_engine& engine_of(span_server_state& st, const std::string& session);
/// Lets the retiring engine go once its last session has ended.
void release_retiring(span_server_state& st);
/// The engine's error as the wire's.
caf::error to_caf(const span_error& e);
/// Tokens a new session can count on: the free pages' and those only
/// parked sessions hold (taken back as soon as a step needs them).
std::int64_t tokens_left(const span_server_state& st);
/// What span.info answers.
span_info info_of(const span_server_state& st);
/// A step or close of `session` from node `from`: refused unless `from`
/// opened it (an id that is not open gets the request's usual answer).
caf::error check_owner(const span_server_state& st, const std::string& session, const std::string& from);

/// span.open (and shareFrom) and span.close (and keep), answered on `rp`.
void on_open(span_server_state& st, remote_message& m, caf::response_promise& rp);
void on_close(span_server_state& st, remote_message& m, caf::response_promise& rp);
/// Closes sessions idle for the options' timeout (parked ones too), and
/// forgets the owners of sessions that ended.
void expire_idle(span_server_state& st);

/// Whether `session` is parked.
bool is_parked(const span_server_state& st, const std::string& session);
/// Closes parked sessions, oldest first, until the current engine has room
/// for `rows` more rows of `steps` steps (each may start a page) or none is
/// left.
void make_room(span_server_state& st, std::int64_t rows, std::size_t steps);
/// Closes the oldest parked session; false when none is parked.
bool close_oldest_parked(span_server_state& st);
/// Closes every parked session (the server drains or moves).
void close_parked(span_server_state& st);

}  // namespace corolla::span_detail
