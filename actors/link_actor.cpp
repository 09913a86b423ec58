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
#include "actors/link_state.hpp"
#include "net/endpoint.hpp"
#include "net/log_limit.hpp"
#include "net/rdma.hpp"

namespace corolla {
namespace {

using namespace link_detail;
using link_detail::clock;  // not ::clock from <ctime>

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
  remote_message rm = delivered(m, st.peer);
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
            if (auto err = check_peer_accepts(self->state.terms, reply)) {
              spdlog::warn("answering {} with an error: {}", self->state.label(), error_message(err));
              send_error(self, correlation, error_code(err), error_message(err));
              return;
            }
            net::message r = wire_message(net::message_kind::response, reply);
            r.correlation_id = correlation;
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
  promise.deliver(delivered(m, st.peer));
}

void on_inbound(link_actor* self, net::message& m) {
  auto& st = self->state;
  if (st.phase == link_phase::closed || st.leaving) return;
  if (st.ctx->drops(st.peer.empty() ? m.sender_node : st.peer)) return;  // partitioned: never arrived
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
        if (st.args.role == link_role::outgoing && st.offer_rdma && st.transport && !relayed(st))
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

/// Sends `rm` to actor `target` on the peer as actor `sender`: a request
/// when `promise` waits for an answer, else one-way (problems logged).
void send_data(link_actor* self, const std::string& target, std::string sender, remote_message& rm,
               caf::response_promise* promise) {
  auto& st = self->state;
  auto refuse = [&](caf::error why) {
    if (promise)
      promise->deliver(std::move(why));
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
  if (auto err = check_peer_accepts(st.terms, rm)) {
    refuse(std::move(err));
    return;
  }
  net::message m = wire_message(promise ? net::message_kind::request : net::message_kind::oneway, rm);
  m.target_actor = target;
  m.sender_actor = std::move(sender);
  m.correlation_id = promise ? st.next_correlation++ : 0;
  m.sent_at_ns = steady_now_ns();
  if (auto err = send_wire(self, m)) {
    refuse(std::move(err));
    return;
  }
  if (promise) st.pending.emplace(m.correlation_id, pending_request{std::move(*promise), clock::now()});
}

void on_send(link_actor* self, std::string& target, remote_message& rm) {
  auto promise = self->make_response_promise();
  std::string sender = self->state.ctx->directory.name_of(caf::actor_cast<caf::actor_addr>(promise.source()));
  send_data(self, target, std::move(sender), rm, promise.async() ? nullptr : &promise);
}

void on_tick(link_actor* self) {
  auto& st = self->state;
  const auto& s = st.ctx->settings;
  self->delayed_send(self, s.heartbeat_interval, tick_atom::value);
  const auto now = clock::now();
  // What the gate passed without this actor counts as traffic too.
  const auto [gate_received, gate_sent] = st.gate->take_window();
  st.window_received += gate_received;
  st.window_sent += gate_sent;
  st.last_rx = std::max(st.last_rx, st.gate->last_received());

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
  if (relayed(st)) {
    s.transport = "relay";
    s.transport_reason = "through node " + st.ctx->directory.peer_of(st.args.conn);
  }
  s.outgoing = st.args.role == link_role::outgoing;
  s.up = st.phase == link_phase::up;
  s.rtt_us = st.rtt_us.value;
  s.rtt_last_us = st.rtt_last_us;
  s.rtt_samples = st.rtt_samples;
  s.send_bytes_per_s = st.send_rate.value;
  s.recv_bytes_per_s = st.recv_rate.value;
  const auto gate = st.gate->totals();
  s.bytes_sent = st.bytes_sent + gate.bytes_sent;
  s.bytes_received = st.bytes_received + gate.bytes_received;
  s.messages_sent = st.messages_sent + gate.messages_sent;
  s.messages_received = st.messages_received + gate.messages_received;
  s.pending_requests = st.pending.size();
  return s;
}

caf::behavior link_behavior(link_actor* self, std::shared_ptr<node_context> ctx, link_args args,
                            std::shared_ptr<link_gate> gate) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.gate = std::move(gate);
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
  if (!relayed(st)) st.transport->set_profile(st.args.conn, st.profile);
  if (st.args.role == link_role::outgoing) {
    send_hello(self, net::message_kind::hello);
    self->delayed_send(self, st.args.connect_timeout, hs_timeout_atom::value);
  } else {
    self->delayed_send(self, st.ctx->settings.accept_hello_timeout, hs_timeout_atom::value);
  }
  self->delayed_send(self, st.ctx->settings.heartbeat_interval, tick_atom::value);

  return {
      [self](inbound_atom, net::message& m) {
        on_inbound(self, m);
        // Handed over, the node's I/O thread may deliver the connection's
        // next one-way message itself (relayed links get theirs from the
        // relay's link, uncounted).
        if (!relayed(self->state)) self->state.gate->inbound_queued.fetch_sub(1, std::memory_order_release);
      },
      [self](tx_atom, std::string& target, remote_message& rm) { on_send(self, target, rm); },
      [self](post_atom, std::string& target, std::string& sender, remote_message& rm, bool counted) {
        send_data(self, target, std::move(sender), rm, nullptr);
        if (counted) self->state.gate->outbound_queued.fetch_sub(1, std::memory_order_release);
      },
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
        if (st.transport && !relayed(st)) st.transport->set_profile(st.args.conn, st.profile);
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
        const caf::error why = make_error(errc::stopped, "node '" + st.ctx->node_id + "' is stopping");
        if (st.phase == link_phase::down) {
          // Nothing would reach the peer: no goodbye, no grace to wait out.
          close_link(self, "node stopping", why);
          return;
        }
        send_control(self, net::message_kind::goodbye);
        st.drain = true;
        close_link_after_grace(self, "node stopping", why);
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
  const std::string relay_peer = args.relay_peer;
  auto gate = std::make_shared<link_gate>();
  auto link = ctx->system.spawn(link_behavior, ctx, std::move(args), gate);
  if (relay_peer.empty())
    ctx->directory.bind_connection(conn, link, std::move(gate));
  else
    ctx->directory.bind_relayed(conn, relay_peer, link);
  return link;
}

caf::expected<caf::actor> dial_link(const std::shared_ptr<node_context>& ctx, const std::string& endpoint,
                                    const std::string& server_key, link_args args) {
  if (const std::string why = net::tcp_endpoint_problem(endpoint); !why.empty())
    return make_error(errc::invalid_argument, why);
  if (!args.profile.empty()) {
    try {
      net::parse_link_profile(args.profile);
    } catch (const std::exception& e) {
      return make_error(errc::invalid_argument, "invalid link profile '" + args.profile + "': " + e.what());
    }
  }
  auto transport = ctx->transport();
  if (!transport) return make_error(errc::stopped, "node '" + ctx->node_id + "' is stopped");
  args.role = link_role::outgoing;
  args.endpoint = endpoint;
  try {
    args.conn = transport->connect(endpoint, server_key);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, e.what());
  }
  return spawn_link(ctx, std::move(args));
}

}  // namespace corolla
