// Relaying between nodes that cannot reach each other (actors/relay.hpp).
#include "actors/relay.hpp"

#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/link_actor.hpp"

namespace corolla {
namespace {

/// Answers the sender of `m` (over `conn`) that its message to `m.relay_to`
/// cannot go through: a hello gets hello_reject, a request an error, both
/// appearing to come from the target (relay_from) so that the sender's
/// relayed link for it takes them. Anything else is dropped.
void refuse(node_context& ctx, net::zmq_transport& t, net::connection_id conn, const net::message& m, errc code,
            const std::string& why) {
  if (m.kind != net::message_kind::hello && m.kind != net::message_kind::request) return;
  net::message r;
  r.kind = m.kind == net::message_kind::hello ? net::message_kind::hello_reject : net::message_kind::error;
  r.sender_node = ctx.node_id;
  r.target_actor = m.sender_actor;
  r.correlation_id = m.correlation_id;
  r.error_code = errc_name(code);
  r.error_message = why;
  r.relay_from = m.relay_to;
  t.send(conn, r);
}

/// Bytes a message counts against its sender's quota: its body and its
/// tensors; none for the link's own hellos, heartbeats and goodbye (a
/// sender over its quota keeps its links alive).
double message_bytes(const net::message& m) {
  using k = net::message_kind;
  if (m.kind != k::request && m.kind != k::response && m.kind != k::error && m.kind != k::oneway) return 0;
  double bytes = static_cast<double>(m.body.size());
  for (const Tensor& t : m.tensors) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

/// Whether `from` may send `bytes` more through this relay now (its token
/// bucket, net/rate_limit.hpp). When a new sender comes and there are many
/// buckets, those of senders idle long enough to be full again are dropped.
bool within_quota(node_context& ctx, const std::string& from, double bytes) {
  if (ctx.relay_rate <= 0) return true;
  const auto now = net::token_bucket::clock::now();
  auto it = ctx.relay_quota.find(from);
  if (it == ctx.relay_quota.end()) {
    if (ctx.relay_quota.size() > 1024)
      std::erase_if(ctx.relay_quota, [&](const auto& q) { return q.second.full(now); });
    it = ctx.relay_quota.try_emplace(from, ctx.relay_rate, 8 * ctx.relay_rate, now).first;
  }
  return it->second.take(bytes, now);
}

}  // namespace

void relay_pass_on(node_context& ctx, net::connection_id conn, net::message&& m) {
  auto t = ctx.transport();
  if (!t) return;
  const std::string from = ctx.directory.peer_of(conn);
  if (from.empty()) return;  // no hello on this connection yet: nobody to answer
  const std::string here = "relay " + ctx.node_id;
  if (!ctx.relay_service)
    return refuse(ctx, *t, conn, m, errc::not_connected, "node " + ctx.node_id + " does not relay (node " + m.relay_to +
                                                             " is not reachable through it)");
  if (!m.relay_from.empty() || m.relay_to == ctx.node_id || m.relay_to == from)
    return refuse(ctx, *t, conn, m, errc::invalid_argument,
                  here + " passes on only messages from its own peers to other peers");
  if (ctx.drops(from) || ctx.drops(m.relay_to)) return;  // partitioned: never arrived
  const net::connection_id to = ctx.directory.direct_connection(m.relay_to);
  if (to == 0)
    return refuse(ctx, *t, conn, m, errc::not_connected, here + " has no connection to node " + m.relay_to);
  if (const double bytes = message_bytes(m); bytes > 0 && !within_quota(ctx, from, bytes)) {
    if (ctx.relay_refused.fetch_add(1, std::memory_order_relaxed) == 0)
      spdlog::warn("{}: node {} sends more than {:.0f} Mbit/s through it: refusing what goes over", here, from,
                   ctx.relay_rate * 8 / 1e6);
    return refuse(ctx, *t, conn, m, errc::send_failed,
                  fmt::format("{} passes on at most {:.3g} Mbit/s from each node (in bursts of 8 s of it): node {} is "
                              "over it",
                              here, ctx.relay_rate * 8 / 1e6, from));
  }
  const std::string target = m.relay_to;
  net::message fwd = std::move(m);
  fwd.relay_to.clear();
  fwd.relay_from = from;
  fwd.peer_key.clear();
  if (!t->send(to, fwd)) {
    fwd.relay_to = target;  // for the answer: which relayed link it concerns
    return refuse(ctx, *t, conn, fwd, errc::send_failed, here + " could not queue a message for node " + target);
  }
  ctx.relayed_messages.fetch_add(1, std::memory_order_relaxed);
}

void relay_deliver(const std::shared_ptr<node_context>& ctx, net::connection_id conn, net::message&& m) {
  m.peer_key.clear();  // the relay's key, not the sender's
  auto link = ctx->directory.relayed_link(conn, m.relay_from);
  if (!link) {
    if (ctx->stopping) return;
    const std::string via = ctx->directory.peer_of(conn);
    if (!ctx->accept_relayed || via.empty() || !ctx->directory.trusts_relay(via)) {
      // Only a relay this node chose may bring it new peers: any other
      // peer could claim to relay for anyone (and take their sessions).
      const std::string why = ctx->accept_relayed
                                  ? "node " + ctx->node_id + " takes relayed links only through relays it chose"
                                  : "node " + ctx->node_id + " accepts no relayed links";
      spdlog::debug("node {}: dropping a relayed {} from {} via {}: {}", ctx->node_id, net::kind_name(m.kind),
                    m.relay_from, via.empty() ? "an unknown connection" : via, why);
      if (auto t = ctx->transport(); t && m.kind == net::message_kind::hello) {
        net::message r;
        r.kind = net::message_kind::hello_reject;
        r.sender_node = ctx->node_id;
        r.error_code = errc_name(errc::auth_refused);
        r.error_message = why;
        r.relay_to = m.relay_from;  // back through the relay to the sender
        t->send(conn, r);
      }
      return;
    }
    link_args args;
    args.role = link_role::accepted;
    args.conn = conn;
    args.relay_peer = m.relay_from;
    args.endpoint = m.relay_from + " (relayed)";
    link = spawn_link(ctx, std::move(args));
  }
  caf::anon_send(link, inbound_atom::value, std::move(m));
}

}  // namespace corolla
