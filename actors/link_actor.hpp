// actors/link_actor.hpp — the actor owning one connection to one peer
// (internal; the embedding API is actors/node.hpp).
//
// Protocol of a link actor (messages other actors and the transport send it):
//   (inbound_atom, net::message)          a message decoded from its connection
//   (disconn_atom) / (reconn_atom)         the transport lost / re-established the TCP connection
//   (tx_atom, std::string target, remote_message)
//                                          send to actor `target` on the peer; a request
//                                          (the message carries a request id) is answered with
//                                          the peer's remote_message or a caf::error
//   (post_atom, std::string target, std::string sender, remote_message, bool counted)
//                                          one-way send for node::post while the link's gate
//                                          (actors/link_gate.hpp) cannot take it (`counted`: in
//                                          the gate's outbound_queued)
//   (hello_atom) -> std::string            the peer's node id once the hello exchange is done
//   (stats_atom) -> link_stats             a snapshot of RTT, rates and counters
//   (goodbye_atom)                         tell the peer we are stopping, then terminate
//   (close_atom, std::string reason)       close the connection and terminate
//   (rdma_atom, bool up, std::string why)  the connection's path changed (RDMA up, or TCP and why)
//
// Lifecycle: handshaking -> up <-> down -> closed. A link that connected
// (outgoing) survives its peer's death and re-runs the hello when the DEALER
// reconnects; a link for an accepted connection closes after being down for
// link_settings::retire_after (the peer reconnects on a new connection).
// Heartbeats go out every heartbeat_interval in both directions; no traffic
// for peer_timeout, a lost connection or a goodbye makes the peer "down"
// (peer_down to subscribers), traffic from it again makes it "up" (peer_up).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"

namespace corolla {

using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using disconn_atom = caf::atom_constant<caf::atom("disconn")>;
using reconn_atom = caf::atom_constant<caf::atom("reconn")>;
using tx_atom = caf::atom_constant<caf::atom("tx")>;
using post_atom = caf::atom_constant<caf::atom("post")>;
using goodbye_atom = caf::atom_constant<caf::atom("goodbye")>;
using close_atom = caf::atom_constant<caf::atom("close")>;
/// node::stop -> remote proxy: answered once every message the proxy got
/// before it has been handed to its link (so a goodbye cannot overtake them).
using flush_atom = caf::atom_constant<caf::atom("flush")>;
/// Transport -> link: the connection's CurveZMQ handshake failed (reason).
using auth_atom = caf::atom_constant<caf::atom("authfail")>;
/// Transport -> link: (rdma_atom, bool up, std::string reason) the
/// connection moved to RDMA, or stays on / went back to TCP.
using rdma_atom = caf::atom_constant<caf::atom("rdma")>;
/// node::reshape_links -> link: (reshape_atom) shape this link's sends as
/// node_context::reshaped() says now (or as the link was set up, when it
/// says nothing).
using reshape_atom = caf::atom_constant<caf::atom("reshape")>;

/// Which side of the connection a link is on.
enum class link_role {
  outgoing,  ///< this node connected (DEALER): sends the hello, reconnects
  accepted,  ///< the peer connected to our ROUTER: answers the hello
};

/// How to start a link actor.
struct link_args {
  link_role role = link_role::outgoing;
  net::connection_id conn = 0;  ///< the transport connection the link owns
  std::string endpoint;         ///< outgoing: the endpoint dialled; accepted: the routing id
  /// Outgoing: shaping for this link as text ("" = the node's profile); it is
  /// also requested from the peer for its replies.
  std::string profile;
  /// Outgoing: how long the first hello exchange may take before the link
  /// gives up (its hello waiters get errc::handshake_timeout).
  std::chrono::milliseconds connect_timeout{5000};
  /// Outgoing under CurveZMQ: the peer's public key (Z85) that was dialled;
  /// the node id in its hello must belong to that key.
  std::string server_key;
  /// Non-empty: a relayed link (actors/relay.hpp) with node `relay_peer`,
  /// whose messages travel over `conn`, the connection to a relay, which
  /// passes them on. Shaping, RDMA and closing the connection are the
  /// relay link's business, never this one's; a relayed link has no
  /// CurveZMQ key of its own (the relay is trusted with the peer's id).
  std::string relay_peer;
};

/// Spawns a link actor for `args.conn` and records it in the directory as
/// the owner of that connection (or, relayed, of (conn, relay_peer)) before
/// returning (so the transport's next event for it finds it). Safe from any
/// thread.
caf::actor spawn_link(const std::shared_ptr<node_context>& ctx, link_args args);

/// Dials `endpoint` ("tcp://HOST:PORT") on the node's transport, with the
/// listening peer's CurveZMQ key `server_key`, and spawns the outgoing link
/// for it (`args` gives the rest: timeout, profile, the key the hello must
/// match). Errors: errc::invalid_argument (an endpoint that is not
/// tcp://HOST:PORT, a profile that does not parse, a key the transport
/// refuses), errc::stopped.
caf::expected<caf::actor> dial_link(const std::shared_ptr<node_context>& ctx, const std::string& endpoint,
                                    const std::string& server_key, link_args args);

}  // namespace corolla
