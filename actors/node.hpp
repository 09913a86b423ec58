// actors/node.hpp — a corolla node: one CAF actor system plus one ZeroMQ
// transport, whose actors reach the actors of other nodes by (node id,
// actor name). Include actors/corolla.hpp in programs that embed a node.
//
// Threading: every member function is thread-safe. The blocking ones
// (connect, request, stats, links, stop) wait on a scoped actor and must
// not be called from inside an actor's message handler (that would block a
// CAF worker); actors use connect_async / remote_actor + request instead.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"

namespace corolla::net::rdma {
class device;  // net/rdma_verbs.hpp
}

namespace corolla {

struct node_context;

/// How to start a node. Every default works on one machine.
struct node_options {
  /// ZeroMQ endpoint to listen on; port 0 picks a free port (see
  /// node::endpoint()). Empty: connect-only (peers can still answer over
  /// the connections this node opens).
  std::string listen = "tcp://127.0.0.1:0";
  /// Node id; empty = generated ("n-" and 8 hex digits).
  std::string node_id;
  /// Shaping of what this node sends (net/shaping.hpp): "none", a class
  /// ("ib", "roce", "ethernet", "wan", "consumer") or numbers
  /// ("bw=100Mbit,lat=20ms"). A node without a profile shapes its replies on
  /// a connection as the connecting node asks in its hello.
  std::string link_profile = "none";
  /// Directory with CurveZMQ keys (node.key, node.pub, allowed; see
  /// net::load_curve_dir): when set, every link is authenticated and
  /// encrypted, and only allowed public keys may connect. Empty = no curve.
  std::string curve_dir;
  /// Heartbeats go out on every link this often.
  std::chrono::milliseconds heartbeat_interval{200};
  /// A peer that sends nothing for this long is reported down (peer_down).
  /// With the defaults a killed or hung peer is reported within 1.4 s.
  std::chrono::milliseconds peer_timeout{1200};
  /// NIC class announced in hellos and recorded on links; empty = this
  /// host's fastest active class from sysfs (net::node_nic_class: "ib",
  /// "roce", else "ethernet").
  std::string nic_class;
  /// CAF scheduler threads; 0 = one per core.
  std::size_t scheduler_threads = 0;
  /// How idle scheduler threads wait for work: "sharing" (one queue, idle
  /// threads block on a condition variable: a message wakes one at once) or
  /// "stealing" (CAF's default: per-thread queues, idle threads poll, every
  /// 50 us for a while, then every 10 ms). Sharing is the default: a swarm
  /// hop or a pipeline stage is a chain of hand-offs between actors that
  /// are mostly idle, where polling adds a wake-up delay to each and burns
  /// the cores the busy processes need (bench swarm's two-hop decode step:
  /// 1.72 ms stealing, 1.07 ms sharing, on this project's 2-core VM).
  std::string scheduler_policy = "sharing";
  /// Largest message (one frame) accepted from a peer, in bytes.
  std::int64_t max_message_bytes = std::int64_t{1} << 30;
  /// Microseconds the transport's I/O thread keeps polling (yielding the
  /// core between polls) after traffic before it sleeps; see
  /// net::transport_options::busy_poll_us. 0 = always sleep.
  int busy_poll_us = 50;
  /// Open this host's RDMA device (the best active InfiniBand, else RoCE,
  /// verbs port) so links to peers of the same class move to RDMA queue
  /// pairs; without one, or with false, every link stays on ZeroMQ/TCP.
  bool open_rdma = true;
  /// An RDMA device to use instead (tests pass a net::rdma::fake_fabric
  /// device); its port is added to this node's NICs.
  std::shared_ptr<net::rdma::device> rdma_device;
  /// Publish the "echo" actor (corolla ping and liveness checks use it).
  bool publish_echo = true;
  /// Pass messages on between peers that cannot reach each other: servers
  /// behind NAT keep a connection to such a relay and clients reach them
  /// through it (actors/relay.hpp). Off: relayed messages are refused.
  /// Such a node also publishes the "reach" actor, which dials peers back
  /// to tell them whether they can be reached (actors/dialback.hpp).
  bool relay_service = false;
  /// With relay_service: bytes per second each peer may send through this
  /// relay on average, in bursts of up to 8 seconds of it (a token bucket
  /// per sender, net/rate_limit.hpp); what goes over is refused, so that
  /// nobody takes a volunteer's uplink as a free proxy. 0 = no limit.
  double relay_rate = 32e6;
  /// Accept links relayed to this node by the relays it chose
  /// (accept_relayed_from; a node behind NAT turns this on); off: relayed
  /// hellos are refused.
  bool accept_relayed = false;
  /// When set, publish the "control" actor (actors/node_control.hpp), which
  /// obeys a local harness that holds this token (faultlab's throttle).
  std::string control_token;
};

/// Per-connection options of node::connect.
struct connect_options {
  /// How long the connection and the hello exchange may take.
  std::chrono::milliseconds timeout{5000};
  /// Shaping of this link ("" = the node's profile). The peer is asked to
  /// shape its replies the same way.
  std::string link_profile;
  /// CurveZMQ: the Z85 public key of the peer (required when the node uses
  /// curve, ignored otherwise).
  std::string server_key;
};

/// A running node. Created by start(); stopped by stop() or its destructor.
class node {
 public:
  /// Starts the actor system (configured here, never from the command line
  /// or a caf-application.ini) and the transport, publishes "echo".
  /// Errors: an invalid profile, unreadable curve keys, an endpoint that
  /// cannot be bound (errc::invalid_argument with the reason).
  static caf::expected<std::unique_ptr<node>> start(node_options options);

  /// Stops the node (see stop()), then waits for every actor of its system
  /// to terminate: unpublished actors the program spawned must end (or be
  /// sent an exit) before the node is destroyed.
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// This node's id.
  const std::string& id() const;
  /// The endpoint it listens on, with the real port ("" = connect-only).
  std::string endpoint() const;
  /// Its CurveZMQ public key (Z85), "" without curve.
  const std::string& public_key() const;
  /// Its actor system: spawn your own actors here.
  caf::actor_system& system();

  /// Makes `a` reachable from other nodes as `name`. Errors:
  /// errc::already_published, errc::invalid_argument.
  caf::error publish(const std::string& name, const caf::actor& a);
  /// Withdraws `name`; later requests for it get errc::unknown_actor.
  bool unpublish(const std::string& name);
  /// The names of every local actor published on this node.
  std::vector<std::string> published_names() const;
  /// The local actor published as `name`, or an invalid handle.
  caf::actor local_actor(const std::string& name) const;

  /// Connects to the node listening at `endpoint` and runs the hello
  /// exchange; returns the peer's node id. Blocks up to options.timeout.
  /// Errors: errc::handshake_timeout, errc::protocol_mismatch (incompatible
  /// versions, also logged on both sides), errc::invalid_argument,
  /// errc::stopped.
  caf::expected<std::string> connect(const std::string& endpoint, connect_options options = {});
  /// Non-blocking connect for actors: returns the link actor at once; ask it
  /// `request(link, timeout, hello_atom::value)` for the peer's node id (a
  /// std::string, or the error above).
  caf::expected<caf::actor> connect_async(const std::string& endpoint, connect_options options = {});
  /// Opens a link to node `peer` through `relay`, a peer this node is
  /// connected to that offers relay_service (and to which `peer` keeps a
  /// connection): how clients reach servers behind NAT. Blocking like
  /// connect(); returns `peer` once its hello arrived. options.timeout
  /// applies; profile and key do not (the relay link's hold). Errors:
  /// errc::not_connected (no link to the relay, or the relay has none to
  /// the peer), errc::auth_refused (the peer accepts no relayed links),
  /// errc::handshake_timeout, errc::invalid_argument.
  caf::expected<std::string> connect_via(const std::string& relay, const std::string& peer,
                                         connect_options options = {});
  /// connect_via without waiting: the new (or existing) relayed link.
  caf::expected<caf::actor> connect_via_async(const std::string& relay, const std::string& peer,
                                              connect_options options = {});
  /// Messages this node passed on as a relay so far.
  std::uint64_t relayed_messages() const;
  /// Messages refused because their sender went over relay_rate.
  std::uint64_t relay_refused() const;
  /// With node_options::accept_relayed: new relayed links may reach this
  /// node through `relay` (a peer it connected to as its relay). Relayed
  /// hellos over any other peer's connection are dropped: a peer could
  /// otherwise claim to relay for any node id.
  void accept_relayed_from(const std::string& relay);
  /// Closes every link to `peer` (subscribers get peer_down).
  void disconnect(const std::string& peer);

  /// A handle for actor `name` on node `peer` (this node's id gives the
  /// local actor). Send it remote_message with send() or request(); a reply
  /// is a remote_message, failures are caf::error (errc::unknown_actor when
  /// the peer has no such actor, errc::peer_down, errc::not_connected, CAF's
  /// request_timeout). The proxy is created once and reused; it does not
  /// check that `name` exists. Errors: errc::not_connected (no link to the
  /// peer), errc::invalid_argument (empty name).
  caf::expected<caf::actor> remote_actor(const std::string& peer, const std::string& name);
  /// Sends `m` one-way to actor `name` on `peer`, as this node's actor
  /// published as `from` ("" = unnamed): for messages on a critical path
  /// (the pushes between swarm servers). While the link to the peer is up,
  /// the calling thread encodes the message and hands it to the transport
  /// itself, with no actor in between; otherwise the link actor sends it.
  /// Posts to one peer over one link arrive in the order they were posted
  /// (one that went over a link that since went down may be passed by a
  /// later one over the next link; posts are not ordered with what goes
  /// through remote_actor's proxies). Errors, when
  /// known at once: errc::not_connected (no link up to the peer),
  /// errc::send_failed (the peer's hello does not take the message, or the
  /// transport's queue is full), errc::invalid_argument (a tensor that
  /// cannot be encoded); later ones are logged by the link.
  caf::error post(const std::string& peer, const std::string& name, remote_message m, const std::string& from = "");
  /// Blocking request to actor `name` on `peer` (for code outside actors).
  caf::expected<remote_message> request(const std::string& peer, const std::string& name,
                                        remote_message m, std::chrono::milliseconds timeout);

  /// `subscriber` receives peer_down / peer_up messages for `peer` ("" =
  /// every peer), like a CAF monitor on the remote node.
  void monitor_peer(const std::string& peer, const caf::actor& subscriber);
  /// Cancels monitor_peer(peer, subscriber).
  void demonitor_peer(const std::string& peer, const caf::actor& subscriber);

  /// Node ids of the peers this node has links to.
  std::vector<std::string> peers() const;
  /// Whether `peer` has a link that is up (hello done, not reported down).
  bool peer_is_up(const std::string& peer) const;
  /// RTT, rates and counters of the link to `peer` (the first up link
  /// when there are several). Error: errc::not_connected.
  caf::expected<link_stats> stats(const std::string& peer) const;
  /// Statistics of every link, including links still in their hello.
  std::vector<link_stats> links() const;
  /// Shapes everything this node sends with `profile` (net/shaping.hpp
  /// syntax) from now on, on its links and on links that start later: a
  /// throttled uplink. "" = back to the shaping each link was set up with.
  /// Errors: errc::invalid_argument for a profile that does not parse.
  caf::error reshape_links(const std::string& profile);
  /// Payload bytes and messages over every link since the node started,
  /// those of links that ended included (links() has only live ones).
  node_traffic traffic() const;

  /// Says goodbye to every peer, closes the links and the transport, and
  /// terminates the node's own actors (echo, proxies) and every actor
  /// published on it (exit reason user_shutdown). Idempotent. Unpublished
  /// actors the program spawned keep running until it ends them.
  void stop();

 private:
  node() = default;
  caf::expected<std::string> await_hello(caf::expected<caf::actor> link, std::chrono::milliseconds timeout,
                                         const std::string& endpoint);

  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<node_context> ctx_;
  std::string public_key_;
  caf::actor echo_;
  bool stopped_ = false;
};

}  // namespace corolla
