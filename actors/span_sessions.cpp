// actors/span_sessions.cpp — a span server's sessions (actors/span_sessions.hpp).
#include "actors/span_sessions.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/span_push.hpp"
#include "actors/swarm_wire.hpp"

namespace corolla::span_detail {

namespace {

/// `session` ended another way (closed, expired): no longer parked.
void forget_parked(span_server_state& st, const std::string& session) {
  const auto it = st.parked_held.find(session);
  if (it == st.parked_held.end()) return;
  st.parked_tokens -= it->second;
  st.parked_held.erase(it);
  st.parked.remove(session);
}

/// Parks `session` (nothing queued or awaited: the caller ended those) if
/// something could start on it: open on the current engine, holding
/// tokens, without deep prompts; then closes the oldest parked sessions
/// while the parked ones' pages exceed half the budget. False: not parked
/// (the caller closes it).
bool park(span_server_state& st, const std::string& session) {
  if (st.parked_held.count(session)) return true;
  std::optional<span_session_info> info;
  for (auto& s : st.engine->sessions())
    if (s.id == session) info = std::move(s);
  if (!info || info->length == 0 || info->prompt_positions > 0) return false;
  const std::int64_t held = info->held_tokens;
  st.parked.push_front(session);
  st.parked_held[session] = held;
  st.parked_tokens += held;
  st.last_used[session] = clock_type::now();  // a whole idle period from now
  ++st.stats.sessions_parked;
  while (st.parked_tokens > st.engine->cache_tokens() / 2 && close_oldest_parked(st)) {
  }
  return true;
}

/// The tokens session `o.session_id` (just opened by `from_node`) starts
/// with on the pages of `o.share_from`: 0 unless that session is the same
/// node's (a stranger learns nothing of others' sessions, not even whether
/// they exist) and the engine can share (same blocks, no deep prompts).
std::int64_t share_prefix(span_server_state& st, const span_open& o, const std::string& from_node) {
  auto owner = st.owners.find(o.share_from);
  if (owner == st.owners.end() || owner->second != from_node || o.share_tokens <= 0) return 0;
  auto shared = st.engine->share_prefix(o.session_id, o.share_from, o.share_tokens);
  if (!shared) {
    spdlog::debug("span server: session {} starts without {}'s pages: {}", o.session_id, o.share_from,
                  shared.error().message);
    return 0;
  }
  if (*shared > 0) {
    ++st.stats.sessions_shared;
    st.stats.shared_tokens += static_cast<std::uint64_t>(*shared);
  }
  return *shared;
}

}  // namespace

/// The engine a session runs on: the retiring one for sessions opened
/// before the last move, the current one otherwise.
span_engine& engine_of(span_server_state& st, const std::string& session) {
  if (st.retiring && st.retiring->session_length(session)) return *st.retiring;
  return *st.engine;
}

/// Lets the retiring engine go once its last session has ended.
void release_retiring(span_server_state& st) {
  if (st.retiring && st.retiring->session_count() == 0) {
    spdlog::info("span server: the last session on blocks [{}, {}) ended; those blocks are released",
                 st.retiring->first(), st.retiring->last());
    st.retiring.reset();
  }
}

caf::error to_caf(const span_error& e) { return error_from_wire(span_errc_name(e.code), e.message); }

std::int64_t tokens_left(const span_server_state& st) {
  const std::vector<std::string> parked(st.parked.begin(), st.parked.end());
  return st.engine->cache_tokens_left() + (parked.empty() ? 0 : st.engine->reclaimable_tokens(parked));
}

span_info info_of(const span_server_state& st) {
  const span_engine& e = *st.engine;
  span_info i;
  i.model = st.options.model;
  i.first = e.first();
  i.last = e.last();
  i.n_blocks = e.config().n_layers;
  i.hidden_size = static_cast<int>(e.config().hidden_size);
  i.max_positions = e.config().max_positions;
  i.cache_tokens = e.cache_tokens();
  i.cache_tokens_left = tokens_left(st);
  i.step_s_per_block = st.step_s_per_block;
  i.sessions = static_cast<std::uint32_t>(e.session_count() - st.parked.size());
  i.rtt_ms = st.next_rtt_ms;
  i.draining = st.draining;
  i.awaiting_pushes = static_cast<std::uint32_t>(st.awaited.size());
  i.weights = weight_format_name(st.engine->blocks().inference_format());
  i.adapters = e.adapters();
  i.adapter_digests = e.adapter_digests();
  return i;
}

/// A session belongs to the node that opened it: every server of a route
/// learns the next hop's session id, so ids are no secret. A step or close
/// from another node is refused (the session is untouched); an id that is
/// not open gets the request's usual answer.
caf::error check_owner(const span_server_state& st, const std::string& session, const std::string& from) {
  auto it = st.owners.find(session);
  if (it == st.owners.end() || it->second == from) return {};
  return error_from_wire("not_owner", "session '" + session + "' belongs to the node that opened it");
}

bool is_parked(const span_server_state& st, const std::string& session) { return st.parked_held.count(session) > 0; }

bool close_oldest_parked(span_server_state& st) {
  if (st.parked.empty()) return false;
  const std::string id = st.parked.back();
  forget_parked(st, id);
  st.last_used.erase(id);
  st.owners.erase(id);
  if (st.engine->close_session(id)) ++st.stats.parked_closed;
  return true;
}

void make_room(span_server_state& st, std::int64_t rows, std::size_t steps) {
  if (st.parked.empty()) return;
  const std::int64_t need = rows + static_cast<std::int64_t>(steps) * st.engine->pool().page_tokens();
  while (st.engine->cache_tokens_left() < need && close_oldest_parked(st)) {
  }
}

void close_parked(span_server_state& st) {
  if (!st.parked.empty()) spdlog::info("span server: closing {} parked session(s)", st.parked.size());
  while (close_oldest_parked(st)) {
  }
}

void expire_idle(span_server_state& st) {
  const auto now = clock_type::now();
  for (auto it = st.last_used.begin(); it != st.last_used.end();) {
    if (now - it->second < st.options.session_idle_timeout) {
      ++it;
      continue;
    }
    end_wait(st, it->first, "unknown_session", "session " + it->first + " expired");
    st.queue.forget(it->first);
    drop_early(st, it->first);
    const bool was_parked = is_parked(st, it->first);
    forget_parked(st, it->first);
    if (engine_of(st, it->first).close_session(it->first)) {
      ++(was_parked ? st.stats.parked_closed : st.stats.sessions_expired);
      spdlog::info("span server: closed session {} after {} s without a request", it->first,
                   std::chrono::duration_cast<std::chrono::seconds>(now - it->second).count());
    }
    it = st.last_used.erase(it);
  }
  release_retiring(st);
  expire_early(st);
  // Owners of sessions that ended any way (closed, expired, ended by a
  // second move) are forgotten, so a later session may reuse the id.
  for (auto it = st.owners.begin(); it != st.owners.end();) {
    const bool open = st.engine->session_length(it->first) ||
                      (st.retiring && st.retiring->session_length(it->first));
    it = open ? std::next(it) : st.owners.erase(it);
  }
  // (A stale owner until then is harmless: span.open overwrites it, and a
  // step or close of an id that is not open fails anyway.)
}

void on_open(span_server_state& st, remote_message& m, caf::response_promise& rp) {
  auto o = decode_span_open(m.body);
  if (!o) return rp.deliver(o.error());
  if (st.draining)
    return rp.deliver(error_from_wire("draining", "this server is shutting down: it finishes its open "
                                                  "sessions and takes no new ones"));
  if (o->deep_prompts != (m.tensors.size() == 1) || m.tensors.size() > 1)
    return rp.deliver(make_error(errc::bad_message,
                                 "span.open carries one tensor exactly when deepPrompts is set (got " +
                                     std::to_string(m.tensors.size()) + ")"));
  // An id still open on the blocks before a move is taken too (the
  // engine checks its own); an owner left from an ended session
  // (not swept yet) is not.
  if (st.retiring && st.retiring->session_length(o->session_id))
    return rp.deliver(error_from_wire("duplicate_session", "session '" + o->session_id + "' is already open"));
  const Tensor prompts = o->deep_prompts ? m.tensors[0] : Tensor();
  if (auto r = st.engine->open_session(o->session_id, o->max_length, o->first, o->last, prompts, o->adapter); !r)
    return rp.deliver(to_caf(r.error()));
  st.last_used[o->session_id] = clock_type::now();
  st.owners[o->session_id] = m.from_node;
  ++st.stats.sessions_opened;
  const std::int64_t shared = o->share_from.empty() ? 0 : share_prefix(st, *o, m.from_node);
  span_info opened = info_of(st);  // the cache left after the shared pages
  opened.shared_tokens = shared;
  return rp.deliver(answer(span_request::open, encode_body(opened)));
}

void on_close(span_server_state& st, remote_message& m, caf::response_promise& rp) {
  auto c = decode_span_close(m.body);
  if (!c) return rp.deliver(c.error());
  const std::string& id = c->session_id;
  if (auto err = check_owner(st, id, m.from_node)) return rp.deliver(std::move(err));
  const bool was_parked = is_parked(st, id);
  st.queue.forget(id);
  end_wait(st, id, "unknown_session", "session " + id + " was closed");
  drop_early(st, id);
  // Kept: parked on the current engine (a session still on the blocks
  // before a move, one of a draining server, or one nothing could start on
  // is closed instead). Parking counts as its client's close.
  if (c->keep && !st.draining && park(st, id)) {
    if (!was_parked) ++st.stats.sessions_closed;
    return rp.deliver(answer(span_request::close));
  }
  st.last_used.erase(id);
  st.owners.erase(id);
  forget_parked(st, id);
  if (auto r = engine_of(st, id).close_session(id); !r) return rp.deliver(to_caf(r.error()));
  if (!was_parked) ++st.stats.sessions_closed;
  release_retiring(st);
  rp.deliver(answer(span_request::close));
}

}  // namespace corolla::span_detail
