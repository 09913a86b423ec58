// net/zmq_transport.hpp — ZeroMQ over TCP: one I/O thread owns every socket.
//
// A node listens on one ROUTER socket and opens one DEALER per peer it
// connects to; a connection is usable in both directions (replies to a
// DEALER peer go back through the ROUTER with its routing id), so a peer
// that does not listen (behind NAT) still works. Other threads (actors)
// never touch sockets: they push work onto a queue and wake the I/O thread
// through an eventfd it polls together with the sockets. Encoding happens on
// the caller's thread, decoding on the I/O thread; tensors are sent without
// copying. Shaping (net/shaping.hpp) delays outgoing messages per connection.
// Messages leave in lanes (net/outbox.hpp): order is kept between two
// actors, and large messages go in fragments (net/fragment.hpp) that small
// ones pass between, so a big transfer delays no heartbeat or request.
// A connection offered RDMA (offer_rdma) moves its messages to an RC queue
// pair on options.rdma_device, driven by the same I/O thread
// (net/rdma_link.hpp); ZeroMQ carries the upgrade and takes over again if the
// RDMA path fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <caf/expected.hpp>

#include "net/codec.hpp"
#include "net/message.hpp"
#include "net/rdma_verbs.hpp"
#include "net/shaping.hpp"

namespace corolla::net {

/// Identifies one connection for the lifetime of a transport (never reused).
using connection_id = std::uint64_t;

/// CurveZMQ settings: with `enabled`, every connection is authenticated and
/// encrypted; the listening side accepts only the public keys in `allowed`.
struct curve_options {
  bool enabled = false;
  std::string public_key;   ///< Z85 (40 chars)
  std::string secret_key;   ///< Z85 (40 chars)
  std::vector<std::string> allowed;  ///< Z85 public keys of peers allowed in
};

/// Loads "<dir>/node.key" (secret) / "<dir>/node.pub" (public) and the
/// allow-list "<dir>/allowed" (one Z85 key per line, '#' comments),
/// creating a key pair when none exists. Throws std::runtime_error with the
/// file named for unreadable or malformed files.
curve_options load_curve_dir(const std::string& dir);

/// Whether `text` is a CurveZMQ public key as peers are given one: 40 Z85
/// characters that decode to 32 bytes.
bool is_curve_key(const std::string& text);

struct transport_options {
  /// Endpoint to bind, e.g. "tcp://127.0.0.1:0" (port 0 = any free port;
  /// endpoint() reports the chosen one). Empty = connect-only.
  std::string listen = "tcp://127.0.0.1:0";
  /// Routing id this node presents on its outgoing connections (its node
  /// id). Not presented under CurveZMQ: the peer's ROUTER makes one up, so
  /// no other key can take a connection over by presenting the same id.
  std::string identity;
  /// Messages queued per socket by ZeroMQ; the transport itself holds at
  /// most as many again per connection (shaping delay, a full socket) before
  /// send() returns false.
  int send_hwm = 1000;
  int recv_hwm = 1000;
  std::int64_t max_frame_bytes = std::int64_t{1} << 30;  ///< ZMQ_MAXMSGSIZE
  decode_limits limits;
  /// Compute the XXH3 checksum of every outgoing tensor frame (receivers
  /// verify checksums that are present, per limits.verify_checksums).
  bool send_checksums = true;
  curve_options curve;
  /// After any activity the I/O thread keeps polling without sleeping for
  /// this long (yielding the core between polls, so threads that have work
  /// run first), so the next message or send is picked up without a thread
  /// wake-up, which costs tens of microseconds across cores on virtual
  /// machines. Costs at most this much CPU per burst of traffic; 0 = always
  /// sleep in the poll.
  int busy_poll_us = 50;
  /// Messages larger than this (plus 1/16) leave in fragments of this size
  /// that interleave with the connection's other messages
  /// (net/outbox.hpp, net/fragment.hpp): heartbeats and small requests
  /// never wait behind a large tensor. 0 = never fragment (every message
  /// waits for the ones before it); else at least 4096.
  std::size_t fragment_bytes = std::size_t{1} << 20;
  link_profile default_profile;         ///< shaping of new connections
  /// An opened RDMA device (net::rdma::open_verbs_device, or a test's
  /// fake fabric): connections offered RDMA (offer_rdma) by either side
  /// move their messages to an RC queue pair on it. Null: offers from peers
  /// are refused and every message goes over ZeroMQ.
  std::shared_ptr<rdma::device> rdma_device;
  std::uint64_t shaping_seed = 0;
};

/// What the I/O thread reports. Called on the I/O thread: handlers must be
/// quick and must not block (hand work to an actor).
struct transport_events {
  /// A message decoded from `conn`.
  std::function<void(connection_id conn, message&& m)> on_message;
  /// Frames from `conn` that failed validation (the reason), already dropped.
  std::function<void(connection_id conn, const std::string& reason)> on_bad_message;
  /// A new incoming connection (first message from an unknown routing id).
  std::function<void(connection_id conn, const std::string& routing_id)> on_accept;
  /// The TCP connection behind `conn` dropped (peer closed, reset, killed);
  /// DEALER connections keep reconnecting until close(). Reported once per
  /// established connection (after on_connect, or after the first message of
  /// an incoming one).
  std::function<void(connection_id conn)> on_disconnect;
  /// A DEALER connection (re)established its TCP connection (handshake
  /// done, CurveZMQ included). Also raised for an incoming connection whose
  /// peer was reported by on_disconnect and then sends again with the same
  /// routing id (a reconnected or restarted peer): it keeps its id.
  std::function<void(connection_id conn)> on_connect;
  /// CurveZMQ refused a peer (its public key is not allowed).
  /// `conn` is the outgoing connection whose handshake failed, or 0 when
  /// this node refused a peer connecting to it.
  std::function<void(connection_id conn, const std::string& reason)> on_auth_failure;
  /// The connection's messages now travel over an RDMA queue pair (`up`),
  /// or an offer was refused or the RDMA path failed (`!up`, with why; the
  /// connection carries on over ZeroMQ). A failure also raises
  /// on_disconnect and on_connect: messages on the failed path may be lost.
  std::function<void(connection_id conn, bool up, const std::string& reason)> on_rdma;
};

class zmq_transport {
 public:
  /// Binds (if options.listen is set) and starts the I/O thread. Errors: the
  /// endpoint cannot be bound, bad curve keys.
  static caf::expected<std::unique_ptr<zmq_transport>> start(transport_options options,
                                                             transport_events events);
  /// Stops the I/O thread (after connections closed with a drain time have
  /// drained or run out of it) and closes every socket (linger 0).
  ~zmq_transport();

  /// The bound endpoint with the real port ("tcp://127.0.0.1:41234"), or "".
  std::string endpoint() const;

  /// Opens a DEALER to `endpoint` (asynchronous; thread-safe). Messages sent
  /// before the TCP connection is up are queued (up to the HWM).
  /// `server_public_key` (Z85) is the listening peer's CurveZMQ public key,
  /// required when options.curve.enabled (std::invalid_argument otherwise,
  /// or for a malformed key). An endpoint ZeroMQ cannot connect to is
  /// reported by on_disconnect(conn) and the connection is closed.
  connection_id connect(const std::string& endpoint, const std::string& server_public_key = "");
  /// Queues `m` for `conn` (thread-safe). Returns false (and drops it) for an
  /// unknown or closed connection or a full queue.
  bool send(connection_id conn, const message& m);
  /// Changes the shaping of messages sent on `conn` from now on.
  void set_profile(connection_id conn, const link_profile& p);
  /// Closes `conn` (thread-safe); further sends fail. With `drain` 0,
  /// messages still waiting in the transport or in ZeroMQ for it are
  /// dropped. With a drain time (a node saying goodbye), they still go out:
  /// the connection closes once the transport's queue for it is empty, or
  /// when the time is up, and ZeroMQ may take the rest of it (linger) to
  /// write what it holds; destroying the transport waits for that too. An
  /// incoming connection cannot be cut from this side (ZeroMQ has no such
  /// call): its routing id is forgotten, and a later message from that peer
  /// is a new connection.
  void close(connection_id conn, std::chrono::milliseconds drain = std::chrono::milliseconds{0});
  /// Asks the peer to move `conn` to RDMA (asynchronous; thread-safe): an
  /// RC queue pair on options.rdma_device is set up through control
  /// messages on the connection, then both directions switch without
  /// reordering (net/rdma_link.hpp). The outcome arrives as on_rdma.
  void offer_rdma(connection_id conn);
  /// Name of the RDMA device ("mlx5_0:1"), "" without one.
  std::string rdma_device() const;

  /// Bytes and messages sent/received so far (all connections); the
  /// rdma_ counters count the messages that went over RDMA, the fragment_
  /// ones the fragments of large messages (a fragmented message counts once
  /// in messages_ when it is complete).
  struct counters {
    std::uint64_t messages_sent = 0, messages_received = 0, bytes_sent = 0, bytes_received = 0,
                  bad_messages = 0, rdma_messages_sent = 0, rdma_messages_received = 0, fragments_sent = 0,
                  fragments_received = 0;
  };
  counters stats() const;

 private:
  struct impl;
  explicit zmq_transport(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla::net
