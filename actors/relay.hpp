// actors/relay.hpp — relaying between nodes that cannot reach each other
// (internal; the embedding API is node_options::relay_service /
// accept_relayed and node::connect_via in actors/node.hpp).
//
// A server behind NAT (`corolla serve --no-listen`) has no listening
// socket. It keeps an outbound connection to a relay: any node started with
// relay_service. A client reaches it through the relay: it opens a *relayed
// link* over its own connection to the relay (node::connect_via), whose
// messages carry relay_to = the server's node id. The relay passes each one
// on, on the transport's I/O thread (no actor hop), over its direct
// connection to that node, with relay_to cleared and relay_from = the node
// the message came from as the relay's link authenticated it. The receiver
// hands it to its relayed link for (connection, relay_from), creating an
// accepted one for a new peer only when it accepts relayed links and the
// connection is to a relay it chose (node::accept_relayed_from): any other
// peer could claim to relay for any node id. From then on a
// relayed link is an ordinary link (hello, heartbeats, requests, peer_down)
// whose frames happen to travel two connections.
//
// What a relay refuses, it answers at once (a hello with hello_reject, a
// request with an error, both naming the relay), so a client fails over
// instead of waiting for a timeout: no relay service, no direct connection
// to the target, a message that was relayed already (no chains).
//
// Trust: the relay sees the traffic and vouches for the sender's id; under
// CurveZMQ each of the two connections is authenticated and encrypted, but
// a relayed link has no key of its own (docs/swarm_serving.md, "Servers
// behind NAT").
#pragma once

#include <memory>

#include "actors/node_context.hpp"

namespace corolla {

/// Called on the I/O thread for a message from `conn` with relay_to set:
/// passes it on, or answers the sender why not.
void relay_pass_on(node_context& ctx, net::connection_id conn, net::message&& m);

/// Called on the I/O thread for a message from `conn` with relay_from set:
/// hands it to the relayed link for that peer (spawning an accepted one if
/// this node accepts relayed links), or refuses it.
void relay_deliver(const std::shared_ptr<node_context>& ctx, net::connection_id conn, net::message&& m);

}  // namespace corolla
