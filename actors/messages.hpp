// actors/messages.hpp — what actors exchange with the runtime: the payload of
// cross-process calls, peer failure notifications, link statistics, and the
// atoms of the runtime's own protocol between its actors.
//
// These types live only inside one process (CAF never serialises them): the
// link actor converts a remote_message to a net::message and back, so
// tensors cross the wire as raw frames and never through CAF's serializer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include "kernels/tensor.hpp"
#include "net/message.hpp"

namespace corolla {

/// The message a remote (or local) actor receives from another node and
/// answers with: an application type name, a Cap'n Proto body and tensors.
/// Send it to the caf::actor returned by node::remote_actor() with send()
/// (one way) or request() (the reply is a remote_message or a caf::error).
struct remote_message {
  std::string type;                ///< application message type, e.g. "echo"
  std::vector<std::uint8_t> body;  ///< Cap'n Proto flat-array message of `type`, or empty
  std::vector<Tensor> tensors;     ///< host tensors; travel as raw frames, shared not copied
  /// Wire encoding per tensor (empty = all raw). int8_block quantises f32
  /// tensors on the wire (lossy), the receiver gets f32 back.
  std::vector<net::tensor_encoding> encodings;
  /// Filled in by the runtime on delivery: the node the message came from
  /// ("" when it never left this process).
  std::string from_node;
  /// Filled in by the runtime on delivery: the published name of the sending
  /// actor on its node, "" for an unnamed sender.
  std::string from_actor;
};

/// Sent to peer subscribers (node::monitor_peer) when a peer stops
/// answering: missed heartbeats, a lost connection, or its goodbye. Like a
/// CAF down message, but the peer may come back (then peer_up follows).
struct peer_down {
  std::string peer;    ///< node id of the peer
  std::string reason;  ///< for humans: "no traffic for 1200 ms", "connection lost", ...
};

/// Sent to peer subscribers when a peer becomes reachable: after the first
/// hello, and again when traffic resumes after a peer_down.
struct peer_up {
  std::string peer;      ///< node id of the peer
  std::string endpoint;  ///< where it listens ("" when it does not listen)
};

/// A snapshot of one link (one peer, one NIC class), see node::link_stats().
struct link_stats {
  std::uint64_t link = 0;    ///< which link (its actor's id: unique in the node's life)
  std::string peer;          ///< peer node id ("" while the hello is pending)
  std::string endpoint;      ///< the peer's listen endpoint, else the one we dialled
  std::string nic_class;     ///< NIC class of the link ("ethernet", "ib", ...)
  /// The transport carrying the link ("tcp" or "rdma") and why
  /// (net::select_transport over this host's NICs and the peer's class, then
  /// the outcome of the RDMA offer; "" while the hello is pending).
  std::string transport, transport_reason;
  std::string profile;       ///< shaping of what this node sends on the link
  bool outgoing = false;     ///< this node connected (and reconnects)
  bool up = false;           ///< hello done and the peer is not reported down
  double rtt_us = 0;         ///< heartbeat round-trip time, moving average (0 = no sample yet)
  double rtt_last_us = 0;    ///< the latest heartbeat round-trip time
  std::uint64_t rtt_samples = 0;
  /// Achieved rates in bytes per second, moving averages over the heartbeat
  /// intervals that carried traffic (idle intervals do not pull them down).
  double send_bytes_per_s = 0;
  double recv_bytes_per_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;        ///< payload bytes (bodies and tensors, as encoded on the wire)
  std::uint64_t messages_sent = 0, messages_received = 0;  ///< all kinds, heartbeats included
  std::uint64_t pending_requests = 0;                      ///< requests awaiting their answer
};

/// A node's traffic over all its links, ended ones included (node::traffic).
struct node_traffic {
  std::uint64_t bytes_sent = 0, bytes_received = 0;        ///< payload bytes
  std::uint64_t messages_sent = 0, messages_received = 0;  ///< all kinds, heartbeats included
};

// Atoms of the runtime's protocol (names are at most 10 characters).

/// node::connect_async: request (hello_atom) from a link -> std::string peer
/// id once the hello exchange is done.
using hello_atom = caf::atom_constant<caf::atom("hello")>;
/// Request (stats_atom) from a link -> link_stats.
using stats_atom = caf::atom_constant<caf::atom("stats")>;
/// (corrupt_atom, bool on) from the node's control actor to a published
/// actor (faultlab's `corrupt`): wrong outputs from now on, or correct ones
/// again. Local only: peers reach actors with remote_message, never this.
using corrupt_atom = caf::atom_constant<caf::atom("corrupt")>;
/// (stall_atom, bool on) from the node's control actor to a published actor
/// (faultlab's `hang`): the work it watches stops making progress while the
/// node stays up (a stuck kernel), or goes on again. Local only.
using stall_atom = caf::atom_constant<caf::atom("stall")>;
/// (lose_atom, std::string type, int count) from the node's control actor
/// to its training mailbox (faultlab's `lose`): the next `count` messages
/// of `type` that arrive are dropped, as if lost on the way. Local only.
using lose_atom = caf::atom_constant<caf::atom("lose")>;

}  // namespace corolla

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::remote_message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::peer_down)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::peer_up)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::link_stats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::net::message)
