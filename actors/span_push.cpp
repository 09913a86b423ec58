// actors/span_push.cpp — see actors/span_push.hpp.
#include "actors/span_push.hpp"

#include <algorithm>
#include <utility>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/swarm_wire.hpp"

namespace corolla::span_detail {

remote_message answer(std::string type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors) {
  remote_message r;
  r.type = std::move(type);
  r.body = std::move(body);
  r.tensors = std::move(tensors);
  return r;
}

/// `out` followed by `trail` (a posted route's, span_step::trail), the
/// output int8-compressed on the wire when asked (the trail stays exact).
remote_message with_trail(std::string type, std::vector<std::uint8_t> body, Tensor out, const std::vector<Tensor>& trail,
                          bool compress) {
  remote_message m = answer(std::move(type), std::move(body), {std::move(out)});
  m.tensors.insert(m.tensors.end(), trail.begin(), trail.end());
  if (compress) {
    m.encodings.assign(m.tensors.size(), net::tensor_encoding::raw);
    m.encodings[0] = net::tensor_encoding::int8_block;
  }
  return m;
}

/// Tells the step's next hop that the step failed here, so the step waiting
/// there for this push fails at once, not after its waitMs (on a posted
/// route nobody else would hear of it). Best effort: one-way, and only
/// over a link that is up.
void notify_next(span_server_state& st, const span_step& step, const std::string& why) {
  if (step.push_to.node.empty() || !st.runtime->peer_is_up(step.push_to.node)) return;
  remote_message m = answer(span_request::push, encode_body(span_step{.session_id = step.push_to.session_id,
                                                                      .start = step.start,
                                                                      .step_id = step.step_id,
                                                                      .upstream_problem = why.empty() ? "failed" : why,
                                                                      .owner = step.owner}));
  (void)st.runtime->post(step.push_to.node, "span", std::move(m), "span");
}

/// Answers a step with an error, telling its next hop too.
void fail_step(span_server_state& st, const span_step& step, caf::response_promise& rp, caf::error err) {
  notify_next(st, step, error_message(err));
  rp.deliver(std::move(err));
}

/// Sends `out` (and a posted route's trail) on to the step's next hop
/// (span.push), dialling it first when no link is up (that step then goes
/// unpushed: the client carries it).
span_step_done push_on(span_server_state& st, const span_step& step, const Tensor& out, const std::vector<Tensor>& trail) {
  const push_target& to = step.push_to;
  node& n = *st.runtime;
  if (!n.peer_is_up(to.node)) {
    const auto now = clock_type::now();
    std::erase_if(st.dialled, [&](const auto& d) { return now - d.second > forget_dial_after; });
    auto it = st.dialled.find(to.endpoint);
    if (to.endpoint.rfind("tcp://", 0) == 0 && (it == st.dialled.end() || now - it->second > redial_after) &&
        (it != st.dialled.end() || st.dialled.size() < max_dialled)) {
      st.dialled[to.endpoint] = now;
      connect_options c;
      c.server_key = to.public_key;
      if (auto link = n.connect_async(to.endpoint, c); !link)
        return {false, "cannot dial the next server at " + to.endpoint + ": " + error_message(link.error())};
    }
    return {false, "no link to the next server " + to.node + " yet"};
  }
  remote_message m = with_trail(span_request::push,
                                encode_body(span_step{.session_id = to.session_id,
                                                      .start = step.start,
                                                      .step_id = step.step_id,
                                                      .owner = step.owner}),
                                out, trail, step.compress_output);
  // Straight to the transport from this thread while the link is up
  // (node::post): the push is the step's critical path.
  if (auto err = n.post(to.node, "span", std::move(m), "span")) return {false, error_message(err)};
  return {true, {}};
}

/// Answers the session's waiting request (if any) with an error and forgets it.
void end_wait(span_server_state& st, const std::string& session, const char* code, const std::string& why) {
  auto a = st.awaited.find(session);
  if (a == st.awaited.end()) return;
  a->second.promise.deliver(error_from_wire(code, why));
  st.awaited.erase(a);
}

/// Drops the session's early pushes for steps up to `last_step_id` (all of
/// them with the default).
void drop_early(span_server_state& st, const std::string& session, std::uint64_t last_step_id) {
  for (auto e = st.early.lower_bound(early_key{session, 0, {}, {}});
       e != st.early.end() && std::get<0>(e->first) == session && std::get<1>(e->first) <= last_step_id;) {
    st.early_bytes -= e->second.bytes();
    e = st.early.erase(e);
  }
}

/// Drops early pushes older than early_push_ttl.
void expire_early(span_server_state& st) {
  const auto now = clock_type::now();
  for (auto e = st.early.begin(); e != st.early.end();) {
    if (now - e->second.at <= early_push_ttl) {
      ++e;
      continue;
    }
    st.early_bytes -= e->second.bytes();
    e = st.early.erase(e);
  }
}

/// Keeps a push whose step's request is still on its way, within the
/// count and byte limits (the oldest go first); a second push for the same
/// key, or one over the byte limit alone, is dropped.
void keep_early(span_server_state& st, early_key key, early_push p) {
  const std::size_t bytes = p.bytes();
  if (st.early.count(key) || bytes > max_early_push_bytes) return;
  expire_early(st);
  while (!st.early.empty() && (st.early.size() >= max_early_pushes || st.early_bytes + bytes > max_early_push_bytes)) {
    auto oldest = std::min_element(st.early.begin(), st.early.end(),
                                   [](const auto& x, const auto& y) { return x.second.at < y.second.at; });
    st.early_bytes -= oldest->second.bytes();
    st.early.erase(oldest);
  }
  st.early.emplace(std::move(key), std::move(p));
  st.early_bytes += bytes;
}

/// The early push filed under `key`, taken out of the store (none: empty).
std::optional<early_push> take_early(span_server_state& st, const early_key& key) {
  auto e = st.early.find(key);
  if (e == st.early.end()) return std::nullopt;
  early_push p = std::move(e->second);
  st.early_bytes -= p.bytes();
  st.early.erase(e);
  return p;
}

}  // namespace corolla::span_detail
