// The state of one link and the steps that change it (actors/link_state.hpp).
#include "actors/link_state.hpp"

#include <algorithm>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"

namespace corolla::link_detail {

link_state::~link_state() {
  // Backstop for a link that terminated without shutdown() (killed): the
  // directory must not route to it and the connection must not leak.
  if (gate) gate->close();
  if (phase != link_phase::closed && ctx) {
    if (transport && args.relay_peer.empty()) transport->close(args.conn);
  }
}

caf::actor self_handle(link_actor* self) { return caf::actor_cast<caf::actor>(self); }

/// The transport for a link to a peer of class `peer_nic`, and whether to
/// offer the peer RDMA: a link starts on ZeroMQ/TCP and moves to an RDMA
/// queue pair when both ends have RDMA ports of the same kind and this node
/// opened its device (the transport reports the move with on_rdma).
net::transport_choice choose_transport(const std::vector<net::nic_info>& local, const std::string& peer_nic,
                                       const std::string& rdma_device, bool& offer) {
  net::transport_choice c = net::select_transport(local, peer_nic);
  offer = false;
  if (c.transport != "rdma") return c;
  if (rdma_device.empty())
    return {"tcp", "both ends have " + peer_nic + " RDMA ports (" + c.reason +
                       "), but this node has no RDMA device open"};
  offer = true;
  return {"tcp", "moving to RDMA on " + rdma_device + " (" + c.reason + ")"};
}

/// Hands `m` to the transport, stamped with our node id (or drops it
/// silently while a partition cuts this peer off: node_context::drops). Errors:
/// errc::invalid_argument when a tensor cannot travel (undefined, not on the
/// host, an int8 encoding of a non-f32 tensor: encode() throws, and an
/// exception must not end the link), errc::send_failed when the transport
/// refused it (closed connection, full queue).
caf::error send_wire(link_actor* self, net::message& m) {
  auto& st = self->state;
  const auto refused = [&] {
    return make_error(errc::send_failed,
                      "transport refused a message to " + st.label() + " (connection closed or send queue full)");
  };
  if (!st.transport) return refused();
  if (st.ctx->drops(st.peer)) return {};  // a harness's partition: lost on the way, as on a cut network
  m.sender_node = st.ctx->node_id;
  m.relay_to = st.args.relay_peer;
  const auto bytes = payload_bytes(m);
  try {
    if (!st.transport->send(st.args.conn, m)) return refused();
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, std::string("message to ") + st.label() + " cannot be encoded: " + e.what());
  }
  st.messages_sent += 1;
  st.bytes_sent += bytes;
  st.window_sent += bytes;
  return {};
}

void send_control(link_actor* self, net::message_kind kind, std::uint64_t correlation, std::uint64_t sent_at_ns) {
  net::message m;
  m.kind = kind;
  m.correlation_id = correlation;
  m.sent_at_ns = sent_at_ns;
  send_wire(self, m);
}

void send_error(link_actor* self, std::uint64_t correlation, const std::string& code,
                const std::string& text) {
  net::message m;
  m.kind = net::message_kind::error;
  m.correlation_id = correlation;
  m.error_code = code;
  m.error_message = text;
  send_wire(self, m);
}

void send_hello(link_actor* self, net::message_kind kind) {
  auto& st = self->state;
  st.last_hello = clock::now();
  net::message m;
  m.kind = kind;
  m.body = net::encode_hello(st.ctx->hello(kind == net::message_kind::hello ? st.requested_profile : ""));
  m.sent_at_ns = steady_now_ns();
  send_wire(self, m);
}

void notify(link_actor* self, const caf::message& what) {
  auto& st = self->state;
  if (st.ctx->stopping) return;  // a stopping node does not report its own links closing
  for (const auto& s : st.ctx->directory.subscribers(st.peer)) caf::anon_send(s, what);
}

void fail_pending(link_actor* self, const caf::error& why) {
  auto& st = self->state;
  for (auto& [id, p] : st.pending) p.promise.deliver(why);
  st.pending.clear();
}

void fail_waiters(link_actor* self, const caf::error& why) {
  for (auto& w : self->state.hello_waiters) w.deliver(why);
  self->state.hello_waiters.clear();
}

/// How long a link leaving with a goodbye lets the transport write what it
/// still holds: a second, plus twice the emulated latency and jitter of its
/// profile.
std::chrono::milliseconds goodbye_drain(const link_state& st) {
  return std::chrono::milliseconds(1000) +
         std::chrono::milliseconds(static_cast<long>(2000 * (st.profile.latency_s + st.profile.jitter_s)));
}

/// Closes the connection, leaves the directory and fails everything pending
/// with `why`. Idempotent; the caller quits afterwards.
void shutdown(link_actor* self, const std::string& reason, const caf::error& why) {
  auto& st = self->state;
  if (st.phase == link_phase::closed) return;
  st.phase = link_phase::closed;
  st.gate->close();
  if (!st.peer.empty() && st.ctx->directory.remove_link(st.peer, self->address()))
    notify(self, caf::make_message(peer_down{st.peer, reason}));
  // The node's totals keep this link's traffic (after the link left the
  // directory: a reader may miss it for a moment, never count it twice).
  const auto gate = st.gate->totals();
  st.ctx->ended_traffic.add(st.bytes_sent + gate.bytes_sent, st.bytes_received + gate.bytes_received,
                            st.messages_sent + gate.messages_sent, st.messages_received + gate.messages_received);
  fail_pending(self, why);
  fail_waiters(self, why);
  if (relayed(st)) {
    // The connection is the relay's: it stays open for its own link.
    st.ctx->directory.unbind_relayed(st.args.conn, st.args.relay_peer, self->address());
    st.transport.reset();
    return;
  }
  if (!st.peer.empty()) st.ctx->directory.set_direct(st.peer, st.args.conn, false);
  st.ctx->directory.unbind_connection(st.args.conn, self->address());
  // Leaving on purpose (goodbye) with the peer up: what was sent before
  // still goes out, within a bound, even when the machine is too busy for
  // the grace period.
  if (st.transport) st.transport->close(st.args.conn, st.drain ? goodbye_drain(st) : std::chrono::milliseconds{0});
  // Release the transport now: the node joins its I/O thread once the last
  // link has let go of it.
  st.transport.reset();
}

void close_link(link_actor* self, const std::string& reason, const caf::error& why) {
  shutdown(self, reason, why);
  self->quit();
}

/// Like close_link, but the connection stays open for a moment so that the
/// message just sent (goodbye, hello_reject) leaves: closing a connection
/// drops what the transport has not written yet. Everything waiting on the
/// link fails now; the link ignores traffic until it closes.
void close_link_after_grace(link_actor* self, const std::string& reason, const caf::error& why) {
  auto& st = self->state;
  if (st.leaving || st.phase == link_phase::closed) return;
  st.leaving = true;
  st.leave_error = why;
  st.gate->close();
  fail_pending(self, why);
  fail_waiters(self, why);
  const auto grace = std::chrono::milliseconds(50) +
                     std::chrono::milliseconds(static_cast<long>(1000 * (st.profile.latency_s + st.profile.jitter_s)));
  self->delayed_send(self, grace, close_atom::value, reason);
}

void became_up(link_actor* self) {
  auto& st = self->state;
  const bool first = !st.ever_up;
  st.phase = link_phase::up;
  st.ever_up = true;
  st.last_rx = clock::now();
  if (!relayed(st)) {
    st.ctx->directory.set_direct(st.peer, st.args.conn, true);
    st.gate->open(st.terms);
  }
  if (st.ctx->directory.link_up(st.peer, st.peer_nic, self_handle(self))) {
    if (first)
      spdlog::info("link to {} ({}) is up", st.peer, st.peer_endpoint.empty() ? st.args.endpoint : st.peer_endpoint);
    else
      spdlog::info("peer {} is back", st.peer);
    notify(self, caf::make_message(peer_up{st.peer, st.peer_endpoint}));
  }
  // The peer came back on this connection: older links to it that are down
  // are superseded.
  for (const auto& stale : st.ctx->directory.stale_links(st.peer, self->address()))
    caf::anon_send(stale, close_atom::value, std::string("superseded by a new connection"));
  for (auto& w : st.hello_waiters) w.deliver(st.peer);
  st.hello_waiters.clear();
}

/// The peer stopped answering: requests in flight fail now with peer_down,
/// whether the connection was lost or the heartbeats stopped. Heartbeats are
/// answered by the peer's link actors, not by the actors doing its work, so a
/// busy peer keeps answering them; one that misses them is hung (SIGSTOP, a
/// dead host, a cut network) and its requesters should fail over at once
/// instead of waiting for their own timeouts (Petals: 3 minutes). An answer
/// that still arrives later is dropped as a late response.
void became_down(link_actor* self, const std::string& reason) {
  auto& st = self->state;
  fail_pending(self, make_error(errc::peer_down, "peer " + st.label() + ": " + reason));
  if (st.phase != link_phase::up) return;
  st.phase = link_phase::down;
  st.gate->close();
  st.down_since = clock::now();
  // A goodbye is a peer stopping on purpose: worth a line, not a warning.
  if (reason.find("goodbye") != std::string::npos)
    spdlog::info("peer {} is down: {}", st.label(), reason);
  else
    spdlog::warn("peer {} is down: {}", st.label(), reason);
  if (st.ctx->directory.link_down(st.peer, self->address()))
    notify(self, caf::make_message(peer_down{st.peer, reason}));
}

/// Adopts the identity in a hello or hello_ack; false (after refusing and
/// closing) when it is unacceptable.
bool adopt_hello(link_actor* self, const net::message& m, bool answer_with_reject) {
  auto& st = self->state;
  auto refuse = [&](errc code, const std::string& why) {
    spdlog::error("refusing peer {} ({}): {}", m.sender_node.empty() ? st.args.endpoint : m.sender_node,
                  st.args.endpoint, why);
    if (answer_with_reject) {
      net::message r;
      r.kind = net::message_kind::hello_reject;
      r.error_code = errc_name(code);
      r.error_message = why;
      send_wire(self, r);
    }
    if (answer_with_reject)
      close_link_after_grace(self, "hello refused: " + why, make_error(code, why));
    else
      close_link(self, "hello refused: " + why, make_error(code, why));
    return false;
  };
  auto h = net::decode_hello(m.body);
  if (!h) return refuse(errc::bad_message, "malformed hello: " + error_message(h.error()));
  if (h->protocol_version != net::protocol_version)
    return refuse(errc::protocol_mismatch,
                  "incompatible protocol version: peer '" + h->node_id + "' speaks version " +
                      std::to_string(h->protocol_version) + ", node '" + st.ctx->node_id +
                      "' speaks version " + std::to_string(net::protocol_version));
  if (h->node_id.empty()) return refuse(errc::bad_message, "hello without a node id");
  // Under CurveZMQ a node id belongs to the key that first presented it:
  // the key that authenticated an accepted connection (a hello over the
  // connection's RDMA path carries none: the connection's), or the one
  // dialled.
  const bool accepted = st.args.role == link_role::accepted;
  std::string key = accepted ? m.peer_key : st.args.server_key;
  if (accepted && key.empty()) key = st.peer_key;
  // A relayed hello is vouched for by the relay's authenticated link only.
  if (relayed(st)) key.clear();
  if (st.ctx->settings.curve && accepted && key.empty() && !relayed(st))
    return refuse(errc::auth_refused, "hello without a CurveZMQ key on a connection that must have one");
  if (!key.empty()) {
    const std::string owner = st.ctx->directory.bind_key(h->node_id, key);
    if (owner.empty())
      return refuse(errc::auth_refused, "CurveZMQ key " + key.substr(0, 8) + "... already speaks for " +
                                            std::to_string(registry::max_ids_per_key) + " node ids");
    if (owner != key)
      return refuse(errc::auth_refused, "node id '" + h->node_id + "' belongs to CurveZMQ key " + owner.substr(0, 8) +
                                            "..., not to " + key.substr(0, 8) + "...");
    st.peer_key = key;
  }
  if (!st.peer.empty() && st.peer != h->node_id) {
    // The process behind the endpoint changed identity (restarted without a
    // fixed node id): the old peer is gone for good.
    spdlog::warn("{} now answers as node {} (was {})", st.args.endpoint, h->node_id, st.peer);
    st.gate->close();
    if (!relayed(st)) st.ctx->directory.set_direct(st.peer, st.args.conn, false);
    if (st.ctx->directory.remove_link(st.peer, self->address()))
      notify(self, caf::make_message(peer_down{st.peer, "replaced by node " + h->node_id}));
    fail_pending(self, make_error(errc::peer_down, "peer " + st.peer + " was replaced by " + h->node_id));
    st.phase = link_phase::handshaking;
  }
  st.peer = h->node_id;
  st.peer_endpoint = h->listen_endpoint;
  st.peer_nic = h->nic_class.empty() ? st.ctx->settings.nic_class : h->nic_class;
  st.terms = peer_terms{st.peer, st.args.conn, h->capabilities, h->max_message_bytes};
  auto choice = choose_transport(st.ctx->settings.nics, st.peer_nic,
                                 st.transport ? st.transport->rdma_device() : "", st.offer_rdma);
  // A repeated hello (both sides may send one when the connection comes up)
  // leaves a running RDMA path alone; the transport reports its end.
  if (st.transport_choice.transport != "rdma") st.transport_choice = std::move(choice);
  spdlog::debug("link to {} uses {}: {}", st.peer, st.transport_choice.transport, st.transport_choice.reason);
  // A connector may ask us to shape our replies like its link; we do when
  // this node has no profile of its own.
  if (st.args.role == link_role::accepted && st.ctx->settings.profile.unshaped()) {
    for (const auto& cap : h->capabilities) {
      if (cap.rfind("shape=", 0) != 0) continue;
      try {
        st.setup_profile = net::parse_link_profile(cap.substr(6));
        if (st.ctx->reshaped()) continue;  // the node was reshaped at runtime: that shaping holds
        st.profile = st.setup_profile;
        if (st.transport) st.transport->set_profile(st.args.conn, st.profile);
        spdlog::info("shaping replies to {} as requested: {}", st.peer, net::describe(st.profile));
      } catch (const std::exception& e) {
        spdlog::warn("ignoring shaping requested by {}: {}", st.peer, e.what());
      }
    }
  }
  return true;
}

}  // namespace corolla::link_detail
