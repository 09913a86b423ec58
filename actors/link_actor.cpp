#include "actors/link_actor.hpp"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "net/log_limit.hpp"
#include "net/rdma.hpp"

namespace corolla {
namespace {

using clock = std::chrono::steady_clock;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using hs_timeout_atom = caf::atom_constant<caf::atom("hstimeout")>;

/// Error code an acceptor answers with when a message arrives before the
/// hello (the peer restarted under a live connection): the connector
/// repeats its hello.
constexpr const char* hello_required = "hello_required";

/// Exponential moving average; the first sample is taken as it is.
struct moving_average {
  double value = 0;
  bool seeded = false;
  void add(double x, double alpha) {
    value = seeded ? alpha * x + (1 - alpha) * value : x;
    seeded = true;
  }
};

constexpr double rtt_alpha = 0.2;
constexpr double rate_alpha = 0.3;

struct pending_request {
  caf::response_promise promise;
  clock::time_point since;
};

enum class link_phase { handshaking, up, down, closed };

struct link_state {
  ~link_state();

  std::shared_ptr<node_context> ctx;
  std::shared_ptr<net::zmq_transport> transport;
  link_args args;
  link_phase phase = link_phase::handshaking;
  bool ever_up = false;

  std::string peer;           // node id from the hello
  std::string peer_key;       // CurveZMQ key the hello was authenticated with ("" without CurveZMQ)
  std::string peer_endpoint;  // the peer's listen endpoint from the hello
  std::string peer_nic;
  /// Warnings caused by what the peer sends (unknown actors, its error
  /// reports): a few per second, then counted.
  net::log_limiter peer_log;
  /// What the peer's hello announced: its capabilities and the largest
  /// frame it accepts (0 = not announced). Sends beyond them are refused
  /// here, with a reason, instead of vanishing at the peer.
  std::vector<std::string> peer_capabilities;
  std::uint64_t peer_max_message_bytes = 0;
  net::transport_choice transport_choice;
  bool offer_rdma = false;  // both ends could use RDMA: the connector offers it after the hello
  std::string requested_profile;  // asked of the peer for its replies
  net::link_profile profile;      // what we apply to our sends
  net::link_profile setup_profile;  // what the link was set up with (a reshape back to none restores it)

  clock::time_point created = clock::now();
  clock::time_point last_rx = clock::now();
  clock::time_point down_since{};
  clock::time_point last_sweep = clock::now();
  clock::time_point last_hello{};
  bool leaving = false;    // a last message sent, closing after a grace period
  bool drain = false;      // leaving with the peer up: the transport writes what it holds first
  caf::error leave_error;  // why, for requests that arrive meanwhile

  std::unordered_map<std::uint64_t, pending_request> pending;
  std::uint64_t next_correlation = 1;
  std::vector<caf::response_promise> hello_waiters;

  // statistics
  moving_average rtt_us, send_rate, recv_rate;
  double rtt_last_us = 0;
  std::uint64_t rtt_samples = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0, messages_sent = 0, messages_received = 0;
  std::uint64_t window_sent = 0, window_received = 0;
  clock::time_point window_start = clock::now();

  std::string label() const { return peer.empty() ? args.endpoint : peer; }

  static inline const char* name = "corolla.link";
};

link_state::~link_state() {
  // Backstop for a link that terminated without shutdown() (killed): the
  // directory must not route to it and the connection must not leak.
  if (phase != link_phase::closed && ctx) {
    if (transport) transport->close(args.conn);
  }
}

using link_actor = caf::stateful_actor<link_state>;

/// Bytes of body and tensor frames as they travel: an int8_block tensor
/// counts its int8 values and f32 scales, not the f32 tensor it stands for
/// (the decoded message still names each tensor's wire encoding).
std::uint64_t payload_bytes(const net::message& m) {
  std::uint64_t n = m.body.size();
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    if (!t.defined()) continue;
    const bool int8 = i < m.encodings.size() && m.encodings[i] == net::tensor_encoding::int8_block;
    const auto numel = static_cast<std::uint64_t>(t.numel());
    n += int8 ? numel + sizeof(float) * ((numel + net::int8_wire_block_size - 1) / net::int8_wire_block_size)
              : t.nbytes();
  }
  return n;
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

/// Hands `m` to the transport, stamped with our node id. Errors:
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
  m.sender_node = st.ctx->node_id;
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

void send_control(link_actor* self, net::message_kind kind, std::uint64_t correlation = 0,
                  std::uint64_t sent_at_ns = 0) {
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
  if (!st.peer.empty() && st.ctx->directory.remove_link(st.peer, self->address()))
    notify(self, caf::make_message(peer_down{st.peer, reason}));
  // The node's totals keep this link's traffic (after the link left the
  // directory: a reader may miss it for a moment, never count it twice).
  st.ctx->ended_traffic.add(st.bytes_sent, st.bytes_received, st.messages_sent, st.messages_received);
  fail_pending(self, why);
  fail_waiters(self, why);
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
  if (st.ctx->settings.curve && accepted && key.empty())
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
    if (st.ctx->directory.remove_link(st.peer, self->address()))
      notify(self, caf::make_message(peer_down{st.peer, "replaced by node " + h->node_id}));
    fail_pending(self, make_error(errc::peer_down, "peer " + st.peer + " was replaced by " + h->node_id));
    st.phase = link_phase::handshaking;
  }
  st.peer = h->node_id;
  st.peer_endpoint = h->listen_endpoint;
  st.peer_nic = h->nic_class.empty() ? st.ctx->settings.nic_class : h->nic_class;
  st.peer_capabilities = h->capabilities;
  st.peer_max_message_bytes = h->max_message_bytes;
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

/// Whether the peer, by its hello, takes `rm`: every frame within its
/// announced largest message, and int8 tensors only when it announced
/// "int8-tensors".
caf::error check_peer_accepts(const link_state& st, const remote_message& rm) {
  const auto has = [&](const char* cap) {
    return std::find(st.peer_capabilities.begin(), st.peer_capabilities.end(), cap) != st.peer_capabilities.end();
  };
  const std::uint64_t limit = st.peer_max_message_bytes;
  if (limit > 0 && rm.body.size() > limit)
    return make_error(errc::send_failed, "a body of " + std::to_string(rm.body.size()) + " bytes exceeds the " +
                                             std::to_string(limit) + "-byte messages peer " + st.peer + " accepts");
  for (std::size_t i = 0; i < rm.tensors.size(); ++i) {
    const Tensor& t = rm.tensors[i];
    if (!t.defined()) continue;  // the encoder names this one
    const bool int8 = i < rm.encodings.size() && rm.encodings[i] == net::tensor_encoding::int8_block;
    if (int8 && !has("int8-tensors"))
      return make_error(errc::send_failed, "peer " + st.peer + " does not take int8 tensors (no int8-tensors in its hello)");
    // An int8 frame holds one byte per value plus an f32 scale per block.
    const std::uint64_t bytes =
        int8 ? static_cast<std::uint64_t>(t.numel()) + 4 * (static_cast<std::uint64_t>(t.numel()) / net::int8_wire_block_size + 1)
             : t.nbytes();
    if (limit > 0 && bytes > limit)
      return make_error(errc::send_failed, "tensor " + std::to_string(i) + " of " + std::to_string(bytes) +
                                               " bytes exceeds the " + std::to_string(limit) + "-byte messages peer " +
                                               st.peer + " accepts");
  }
  return {};
}

void on_request(link_actor* self, net::message& m) {
  auto& st = self->state;
  const bool is_request = m.kind == net::message_kind::request;
  // Who sent it is who said hello on this link: a message naming another
  // node is forged (it would pass for that node's with the actors that
  // check, e.g. a swarm session's owner) and is refused.
  if (!m.sender_node.empty() && m.sender_node != st.peer) {
    const std::string why = "message names node '" + m.sender_node + "' but this link's hello came from '" + st.peer + "'";
    if (st.peer_log.allow()) spdlog::warn("{} from {}: {}{}", net::kind_name(m.kind), st.label(), why, st.peer_log.note());
    send_error(self, is_request ? m.correlation_id : 0, errc_name(errc::bad_message), why);
    return;
  }
  auto target = st.ctx->directory.find(m.target_actor);
  if (!target) {
    const std::string why = "no actor named '" + m.target_actor + "' on node '" + st.ctx->node_id + "'";
    if (st.peer_log.allow())
      spdlog::warn("{} from {} (type '{}'): {}{}", net::kind_name(m.kind), st.label(), m.type, why, st.peer_log.note());
    send_error(self, is_request ? m.correlation_id : 0, errc_name(errc::unknown_actor), why);
    return;
  }
  remote_message rm;
  rm.type = std::move(m.type);
  rm.body = std::move(m.body);
  rm.tensors = std::move(m.tensors);
  rm.encodings = std::move(m.encodings);
  rm.from_node = st.peer;
  rm.from_actor = std::move(m.sender_actor);
  if (!is_request) {
    caf::anon_send(target, std::move(rm));
    return;
  }
  const auto correlation = m.correlation_id;
  // The target answers whenever it likes; the requester's own timeout
  // bounds the wait on its side.
  self->request(target, caf::infinite, std::move(rm))
      .then(
          [self, correlation](remote_message& reply) {
            // A reply the requester said it cannot take becomes an error it can.
            if (auto err = check_peer_accepts(self->state, reply)) {
              spdlog::warn("answering {} with an error: {}", self->state.label(), error_message(err));
              send_error(self, correlation, error_code(err), error_message(err));
              return;
            }
            net::message r;
            r.kind = net::message_kind::response;
            r.correlation_id = correlation;
            r.type = std::move(reply.type);
            r.body = std::move(reply.body);
            r.tensors = std::move(reply.tensors);
            r.encodings = std::move(reply.encodings);
            if (auto err = send_wire(self, r)) {
              spdlog::warn("could not send a response to {}: {}", self->state.label(), error_message(err));
              // The requester still gets an answer when the reply itself was the problem.
              if (error_code(err) == "invalid_argument") send_error(self, correlation, error_code(err), error_message(err));
            }
          },
          [self, correlation](caf::error& e) {
            send_error(self, correlation, error_code(e), error_message(e));
          });
}

void on_answer(link_actor* self, net::message& m) {
  auto& st = self->state;
  auto it = st.pending.find(m.correlation_id);
  if (it == st.pending.end()) {
    if (m.kind == net::message_kind::error) {
      if (m.error_code == hello_required) {
        // The peer restarted under a live connection: introduce ourselves again.
        if (st.args.role == link_role::outgoing) send_hello(self, net::message_kind::hello);
        return;
      }
      if (st.peer_log.allow())
        spdlog::warn("peer {} reports: {}: {}{}", st.label(), m.error_code, m.error_message, st.peer_log.note());
    } else {
      spdlog::debug("late response {} from {} (its request timed out)", m.correlation_id, st.label());
    }
    return;
  }
  auto promise = std::move(it->second.promise);
  st.pending.erase(it);
  if (m.kind == net::message_kind::error) {
    promise.deliver(error_from_wire(m.error_code, m.error_message));
    return;
  }
  remote_message rm;
  rm.type = std::move(m.type);
  rm.body = std::move(m.body);
  rm.tensors = std::move(m.tensors);
  rm.encodings = std::move(m.encodings);
  rm.from_node = st.peer;
  rm.from_actor = std::move(m.sender_actor);
  promise.deliver(std::move(rm));
}

void on_inbound(link_actor* self, net::message& m) {
  auto& st = self->state;
  if (st.phase == link_phase::closed || st.leaving) return;
  const auto now = clock::now();
  st.last_rx = now;
  st.messages_received += 1;
  const auto bytes = payload_bytes(m);
  st.bytes_received += bytes;
  st.window_received += bytes;

  using k = net::message_kind;
  const bool handshake = m.kind == k::hello || m.kind == k::hello_ack || m.kind == k::hello_reject;
  if (!handshake && st.phase == link_phase::down) {
    // Traffic again after a peer_down (a stalled peer resumed).
    became_up(self);
  }
  if (!handshake && st.phase == link_phase::handshaking) {
    spdlog::debug("{} from {} before the hello, asking for one", net::kind_name(m.kind), st.label());
    if (m.kind == k::heartbeat || m.kind == k::request || m.kind == k::oneway)
      send_error(self, m.kind == k::request ? m.correlation_id : 0, hello_required,
                 "node '" + st.ctx->node_id + "' has no hello from this connection");
    return;
  }
  switch (m.kind) {
    case k::hello:
      if (adopt_hello(self, m, true)) {
        send_hello(self, k::hello_ack);
        became_up(self);
      }
      return;
    case k::hello_ack:
      if (adopt_hello(self, m, true)) {
        became_up(self);
        if (st.args.role == link_role::outgoing && st.offer_rdma && st.transport)
          st.transport->offer_rdma(st.args.conn);
      }
      return;
    case k::hello_reject: {
      const std::string why = m.error_message.empty() ? "no reason given" : m.error_message;
      spdlog::error("peer {} refused our hello: {}", st.label(), why);
      close_link(self, "refused our hello: " + why,
                 m.error_code == errc_name(errc::protocol_mismatch)
                     ? make_error(errc::protocol_mismatch, "peer at " + st.args.endpoint + " refused the hello: " + why)
                     : error_from_wire(m.error_code, "peer at " + st.args.endpoint + " refused the hello: " + why));
      return;
    }
    case k::heartbeat:
      send_control(self, k::heartbeat_ack, m.correlation_id, m.sent_at_ns);
      return;
    case k::heartbeat_ack: {
      const auto now_ns = steady_now_ns();
      if (m.sent_at_ns == 0 || m.sent_at_ns > now_ns) return;
      const double sample = static_cast<double>(now_ns - m.sent_at_ns) / 1e3;
      st.rtt_last_us = sample;
      st.rtt_us.add(sample, rtt_alpha);
      st.rtt_samples += 1;
      return;
    }
    case k::request:
    case k::oneway:
      on_request(self, m);
      return;
    case k::response:
    case k::error:
      on_answer(self, m);
      return;
    case k::goodbye:
      became_down(self, "peer said goodbye (node stopping)");
      if (st.args.role == link_role::accepted)
        close_link(self, "peer said goodbye", make_error(errc::peer_down, "peer " + st.label() + " stopped"));
      return;
  }
}

void on_send(link_actor* self, std::string& target, remote_message& rm) {
  auto& st = self->state;
  auto promise = self->make_response_promise();
  const bool is_request = !promise.async();
  auto refuse = [&](caf::error why) {
    if (is_request)
      promise.deliver(std::move(why));
    else
      spdlog::warn("dropping a message for {}@{}: {}", target, st.label(), error_message(why));
  };
  if (st.leaving) {
    refuse(st.leave_error);
    return;
  }
  if (st.phase == link_phase::handshaking) {
    refuse(make_error(errc::not_connected, "link to " + st.label() + " is still connecting"));
    return;
  }
  if (st.phase == link_phase::down) {
    refuse(make_error(errc::peer_down, "peer " + st.label() + " is down"));
    return;
  }
  if (auto err = check_peer_accepts(st, rm)) {
    refuse(std::move(err));
    return;
  }
  net::message m;
  m.kind = is_request ? net::message_kind::request : net::message_kind::oneway;
  m.target_actor = target;
  m.sender_actor = st.ctx->directory.name_of(caf::actor_cast<caf::actor_addr>(promise.source()));
  m.correlation_id = is_request ? st.next_correlation++ : 0;
  m.type = std::move(rm.type);
  m.body = std::move(rm.body);
  m.tensors = std::move(rm.tensors);
  m.encodings = std::move(rm.encodings);
  m.sent_at_ns = steady_now_ns();
  if (auto err = send_wire(self, m)) {
    refuse(std::move(err));
    return;
  }
  if (is_request) st.pending.emplace(m.correlation_id, pending_request{std::move(promise), clock::now()});
}

void on_tick(link_actor* self) {
  auto& st = self->state;
  const auto& s = st.ctx->settings;
  self->delayed_send(self, s.heartbeat_interval, tick_atom::value);
  const auto now = clock::now();

  const double window_s = std::chrono::duration<double>(now - st.window_start).count();
  if (window_s > 0) {
    if (st.window_sent > 0) st.send_rate.add(static_cast<double>(st.window_sent) / window_s, rate_alpha);
    if (st.window_received > 0) st.recv_rate.add(static_cast<double>(st.window_received) / window_s, rate_alpha);
  }
  st.window_sent = st.window_received = 0;
  st.window_start = now;

  if (st.leaving) return;
  const bool outgoing = st.args.role == link_role::outgoing;
  if (st.phase == link_phase::up || (st.phase == link_phase::down && !outgoing))
    send_control(self, net::message_kind::heartbeat, 0, steady_now_ns());
  const bool unanswered = st.phase == link_phase::down || st.phase == link_phase::handshaking;
  if (unanswered && outgoing && now - st.last_hello >= std::chrono::seconds(1)) {
    // The peer may be a new process behind the same endpoint, or a stalled
    // one, or our first hello was lost: introduce ourselves again (a live
    // peer answers with a harmless hello_ack). Once a second, so little
    // queues up for a dead peer; the transport's reconnect event triggers a
    // hello at once anyway.
    send_hello(self, net::message_kind::hello);
  }
  if (st.phase == link_phase::up && now - st.last_rx > s.peer_timeout) {
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - st.last_rx).count();
    became_down(self, "no traffic for " + std::to_string(silent) + " ms (missed heartbeats)");
  }
  if (st.phase == link_phase::down && st.args.role == link_role::accepted &&
      now - st.down_since > s.retire_after) {
    close_link(self, "down for too long", make_error(errc::peer_down, "peer " + st.label() + " is gone"));
    return;
  }
  if (now - st.last_sweep > std::chrono::seconds(5)) {
    st.last_sweep = now;
    for (auto it = st.pending.begin(); it != st.pending.end();) {
      if (now - it->second.since > s.request_ttl) it = st.pending.erase(it);
      else ++it;
    }
  }
}

link_stats make_stats(link_actor* self) {
  auto& st = self->state;
  link_stats s;
  s.link = self->id();
  s.peer = st.peer;
  s.endpoint = st.peer_endpoint.empty() ? st.args.endpoint : st.peer_endpoint;
  s.nic_class = st.peer_nic.empty() ? st.ctx->settings.nic_class : st.peer_nic;
  s.profile = net::describe(st.profile);
  s.transport = st.transport_choice.transport;
  s.transport_reason = st.transport_choice.reason;
  s.outgoing = st.args.role == link_role::outgoing;
  s.up = st.phase == link_phase::up;
  s.rtt_us = st.rtt_us.value;
  s.rtt_last_us = st.rtt_last_us;
  s.rtt_samples = st.rtt_samples;
  s.send_bytes_per_s = st.send_rate.value;
  s.recv_bytes_per_s = st.recv_rate.value;
  s.bytes_sent = st.bytes_sent;
  s.bytes_received = st.bytes_received;
  s.messages_sent = st.messages_sent;
  s.messages_received = st.messages_received;
  s.pending_requests = st.pending.size();
  return s;
}

caf::behavior link_behavior(link_actor* self, std::shared_ptr<node_context> ctx, link_args args) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.transport = st.ctx->transport();
  st.args = std::move(args);
  st.profile = st.ctx->settings.profile;
  if (st.args.role == link_role::outgoing) {
    st.requested_profile = st.ctx->settings.profile_text;
    if (!st.args.profile.empty()) {
      try {
        st.profile = net::parse_link_profile(st.args.profile);
        st.requested_profile = st.args.profile;
      } catch (const std::exception& e) {
        spdlog::warn("link to {}: ignoring profile '{}': {}", st.args.endpoint, st.args.profile, e.what());
      }
    }
  }
  st.setup_profile = st.profile;
  if (auto r = st.ctx->reshaped()) st.profile = *r;
  self->set_default_handler(caf::drop);
  self->set_exit_handler([self](caf::exit_msg& m) {
    shutdown(self, "node stopping", make_error(errc::stopped, "node '" + self->state.ctx->node_id + "' is stopping"));
    self->quit(m.reason);
  });
  if (!st.transport) {
    shutdown(self, "node stopped", make_error(errc::stopped, "node is stopped"));
    self->quit();
    return {};
  }
  st.transport->set_profile(st.args.conn, st.profile);
  if (st.args.role == link_role::outgoing) {
    send_hello(self, net::message_kind::hello);
    self->delayed_send(self, st.args.connect_timeout, hs_timeout_atom::value);
  } else {
    self->delayed_send(self, st.ctx->settings.accept_hello_timeout, hs_timeout_atom::value);
  }
  self->delayed_send(self, st.ctx->settings.heartbeat_interval, tick_atom::value);

  return {
      [self](inbound_atom, net::message& m) { on_inbound(self, m); },
      [self](tx_atom, std::string& target, remote_message& rm) { on_send(self, target, rm); },
      [self](tick_atom) {
        if (self->state.phase != link_phase::closed) on_tick(self);
      },
      [self](hs_timeout_atom) {
        auto& st = self->state;
        if (st.phase != link_phase::handshaking || st.ever_up) return;
        const auto ms = st.args.role == link_role::outgoing ? st.args.connect_timeout
                                                           : st.ctx->settings.accept_hello_timeout;
        const std::string why = st.args.role == link_role::outgoing
                                    ? "no answer to our hello from " + st.args.endpoint + " within " +
                                          std::to_string(ms.count()) + " ms"
                                    : "no hello within " + std::to_string(ms.count()) + " ms";
        spdlog::warn("closing connection {}: {}", st.args.endpoint, why);
        close_link(self, why, make_error(errc::handshake_timeout, why));
      },
      [self](disconn_atom) {
        auto& st = self->state;
        if (st.phase == link_phase::up || st.phase == link_phase::down)
          became_down(self, "connection lost");
      },
      [self](auth_atom, const std::string& reason) {
        auto& st = self->state;
        // Only a connect still waiting for its first hello gives up: ZeroMQ
        // would retry the same refused handshake until the timeout.
        if (st.args.role != link_role::outgoing || st.phase != link_phase::handshaking || st.ever_up) return;
        const std::string why = "peer at " + st.args.endpoint + " refused the CurveZMQ handshake: " + reason;
        spdlog::error("{}", why);
        close_link(self, why, make_error(errc::auth_refused, why));
      },
      [self](rdma_atom, bool up, std::string& reason) {
        auto& st = self->state;
        if (up) {
          spdlog::info("link to {} runs over RDMA: {}", st.label(), reason);
          st.transport_choice = {"rdma", reason};
        } else {
          if (st.transport_choice.transport == "rdma" || st.offer_rdma)
            spdlog::warn("link to {} stays on TCP: {}", st.label(), reason);
          st.transport_choice = {"tcp", reason};
        }
      },
      [self](reconn_atom) {
        if (self->state.args.role == link_role::outgoing && self->state.phase != link_phase::closed)
          send_hello(self, net::message_kind::hello);
      },
      [self](hello_atom) -> caf::result<std::string> {
        auto& st = self->state;
        if (st.ever_up && !st.peer.empty()) return st.peer;
        auto promise = self->make_response_promise();
        st.hello_waiters.push_back(promise);
        return caf::delegated<std::string>{};
      },
      [self](stats_atom) { return make_stats(self); },
      [self](reshape_atom) {
        auto& st = self->state;
        const auto r = st.ctx->reshaped();
        st.profile = r ? *r : st.setup_profile;
        if (st.transport) st.transport->set_profile(st.args.conn, st.profile);
        spdlog::info("link to {}: sends shaped {}", st.peer.empty() ? st.args.endpoint : st.peer,
                     net::describe(st.profile));
      },
      [self](goodbye_atom) {
        auto& st = self->state;
        if (st.leaving) return;
        if (st.phase != link_phase::up && st.phase != link_phase::down) {
          close_link(self, "node stopping", make_error(errc::stopped, "node '" + st.ctx->node_id + "' is stopping"));
          return;
        }
        send_control(self, net::message_kind::goodbye);
        st.drain = st.phase == link_phase::up;  // a peer that is down would only make the close wait
        close_link_after_grace(self, "node stopping",
                               make_error(errc::stopped, "node '" + st.ctx->node_id + "' is stopping"));
      },
      [self](close_atom, std::string& reason) {
        spdlog::info("closing link to {}: {}", self->state.label(), reason);
        auto& st = self->state;
        close_link(self, reason,
                   st.leaving ? st.leave_error
                              : make_error(errc::peer_down, "link to " + st.label() + " closed: " + reason));
      },
  };
}

}  // namespace

caf::actor spawn_link(const std::shared_ptr<node_context>& ctx, link_args args) {
  const auto conn = args.conn;
  auto link = ctx->system.spawn(link_behavior, ctx, std::move(args));
  ctx->directory.bind_connection(conn, link);
  return link;
}

}  // namespace corolla
