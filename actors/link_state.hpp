// actors/link_state.hpp — internal to the link actor (actors/link_actor.hpp):
// the state of one link and the steps that change it (sending on the wire,
// the hello, up and down, shutting down), shared by link_state.cpp and the
// message handlers of link_actor.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/atom.hpp>
#include <caf/response_promise.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/link_actor.hpp"
#include "actors/link_gate.hpp"
#include "net/log_limit.hpp"
#include "net/rdma.hpp"

namespace corolla::link_detail {

/// The clock of the link's timestamps.
using clock = std::chrono::steady_clock;
/// The link's periodic tick (every heartbeat_interval): heartbeats, rates,
/// repeated hellos, the peer timeout, sweeping old requests.
using tick_atom = caf::atom_constant<caf::atom("tick")>;
/// Sent once when the handshake's time is up (connect_timeout or
/// accept_hello_timeout): a link that was never up closes.
using hs_timeout_atom = caf::atom_constant<caf::atom("hstimeout")>;

/// Error code an acceptor answers with when a message arrives before the
/// hello (the peer restarted under a live connection): the connector
/// repeats its hello.
constexpr const char* hello_required = "hello_required";

/// Exponential moving average; the first sample is taken as it is.
struct moving_average {
  double value = 0;  ///< the average (0 before the first sample)
  bool seeded = false;  ///< a sample was taken
  /// Takes sample `x`, weighted `alpha` against the average so far.
  void add(double x, double alpha) {
    value = seeded ? alpha * x + (1 - alpha) * value : x;
    seeded = true;
  }
};

/// Weight of a new heartbeat round trip in the RTT average.
constexpr double rtt_alpha = 0.2;
/// Weight of a tick's window in the send and receive rate averages.
constexpr double rate_alpha = 0.3;

/// A request sent to the peer, waiting for its answer.
struct pending_request {
  caf::response_promise promise;  ///< gets the answer, or the error the link fails it with
  clock::time_point since;  ///< when it was sent (dropped unanswered after request_ttl)
};

/// Where a link is: no hello adopted yet, up, down (connection lost or
/// heartbeats missed; traffic brings it back up), or shut down.
enum class link_phase { handshaking, up, down, closed };

/// The state of one link actor; only that actor touches it.
struct link_state {
  /// Backstop for a link that ended without shutdown() (killed): closes the
  /// gate and, unless closed or relayed, the connection.
  ~link_state();

  std::shared_ptr<node_context> ctx;  ///< the node the link belongs to
  std::shared_ptr<net::zmq_transport> transport;  ///< the node's; released at shutdown
  link_args args;  ///< how the link was spawned
  link_phase phase = link_phase::handshaking;  ///< where the link is
  bool ever_up = false;  ///< was up once: the handshake timeout no longer applies

  std::string peer;           ///< node id from the hello
  std::string peer_key;       ///< CurveZMQ key the hello was authenticated with ("" without CurveZMQ)
  std::string peer_endpoint;  ///< the peer's listen endpoint from the hello
  std::string peer_nic;  ///< NIC class from the hello (else this node's own)
  /// Warnings caused by what the peer sends (unknown actors, its error
  /// reports): a few per second, then counted.
  net::log_limiter peer_log;
  /// What the peer's hello announced: its capabilities and the largest
  /// frame it accepts (0 = not announced). Sends beyond them are refused
  /// here, with a reason, instead of vanishing at the peer.
  peer_terms terms;
  /// What other threads may do without this actor (actors/link_gate.hpp).
  std::shared_ptr<link_gate> gate;
  net::transport_choice transport_choice;  ///< how messages travel, and why (rdma once the transport moved)
  bool offer_rdma = false;  ///< both ends could use RDMA: the connector offers it after the hello
  std::string requested_profile;  ///< asked of the peer for its replies
  net::link_profile profile;      ///< what we apply to our sends
  net::link_profile setup_profile;  ///< what the link was set up with (a reshape back to none restores it)

  clock::time_point last_rx = clock::now();  ///< the peer's last traffic (here or through the gate)
  clock::time_point down_since{};  ///< when it went down (accepted links retire after retire_after)
  clock::time_point last_sweep = clock::now();  ///< when pending was last swept (every 5 s)
  clock::time_point last_hello{};  ///< when our last hello went (ticks repeat it at most once a second)
  bool leaving = false;    ///< a last message sent, closing after a grace period
  bool drain = false;      ///< leaving with the peer up: the transport writes what it holds first
  caf::error leave_error;  ///< why, for requests that arrive meanwhile

  std::unordered_map<std::uint64_t, pending_request> pending;  ///< requests awaiting answers, by correlation id
  std::uint64_t next_correlation = 1;  ///< the next request's correlation id
  std::vector<caf::response_promise> hello_waiters;  ///< hello_atom callers waiting for the link to come up

  // statistics
  moving_average rtt_us, send_rate, recv_rate;  ///< heartbeat RTT (us); send and receive bytes/s
  double rtt_last_us = 0;  ///< the last RTT sample (us)
  std::uint64_t rtt_samples = 0;  ///< RTT samples taken
  /// Traffic through this actor (payload bytes); the gate counts what passes
  /// it (link_gate totals).
  std::uint64_t bytes_sent = 0, bytes_received = 0, messages_sent = 0, messages_received = 0;
  std::uint64_t window_sent = 0, window_received = 0;  ///< bytes since window_start (rates)
  clock::time_point window_start = clock::now();  ///< start of the current rate window (a tick)

  /// The peer's node id, or the endpoint before the hello.
  std::string label() const { return peer.empty() ? args.endpoint : peer; }

  /// The actors' name in CAF.
  static inline const char* name = "corolla.link";
};

/// A link actor: CAF's stateful actor over link_state.
using link_actor = caf::stateful_actor<link_state>;

/// Whether the link's messages travel through a relay (link_args::relay_peer).
inline bool relayed(const link_state& st) { return !st.args.relay_peer.empty(); }

/// `self` as a caf::actor handle.
caf::actor self_handle(link_actor* self);
/// The transport for a link to a peer of class `peer_nic`, and whether to
/// offer the peer RDMA.
net::transport_choice choose_transport(const std::vector<net::nic_info>& local, const std::string& peer_nic,
                                       const std::string& rdma_device, bool& offer);
/// Hands `m` to the transport, stamped with our node id (errors as values).
caf::error send_wire(link_actor* self, net::message& m);
/// A heartbeat, goodbye or other control message.
void send_control(link_actor* self, net::message_kind kind, std::uint64_t correlation = 0,
                  std::uint64_t sent_at_ns = 0);
/// An error answer (`code`, `text`) to request `correlation`.
void send_error(link_actor* self, std::uint64_t correlation, const std::string& code, const std::string& text);
/// Sends our hello (`kind` hello, or hello_ack answering one; only a hello
/// asks for requested_profile) and notes last_hello.
void send_hello(link_actor* self, net::message_kind kind);
/// Tells the node's subscribers `what` (peer_up, peer_down).
void notify(link_actor* self, const caf::message& what);
/// Fails every request waiting for an answer with `why`.
void fail_pending(link_actor* self, const caf::error& why);
/// Fails every hello waiter with `why`.
void fail_waiters(link_actor* self, const caf::error& why);
/// How long a link leaving with a goodbye lets the transport write what it
/// holds: a second plus twice its profile's latency and jitter.
std::chrono::milliseconds goodbye_drain(const link_state& st);
/// Closes the connection (draining after a goodbye; relayed: left to the
/// relay), leaves the directory (peer_down `reason`) and fails everything
/// pending with `why`. Idempotent; the caller quits afterwards.
void shutdown(link_actor* self, const std::string& reason, const caf::error& why);
/// shutdown(), then the actor quits.
void close_link(link_actor* self, const std::string& reason, const caf::error& why);
/// Like close_link after a grace period (50 ms plus the profile's latency and
/// jitter), so the message just sent leaves; what waits fails now.
void close_link_after_grace(link_actor* self, const std::string& reason, const caf::error& why);
/// The link is up (a hello adopted, or traffic after down): a direct link
/// opens its gate, subscribers get peer_up, hello waiters the peer's id, and
/// older links to the peer that are down are closed.
void became_up(link_actor* self);
/// The peer stopped answering (connection lost, heartbeats missed, goodbye):
/// requests in flight fail with errc::peer_down; an up link goes down (gate
/// closed, peer_down to subscribers).
void became_down(link_actor* self, const std::string& reason);
/// Takes the peer's hello (or its answer); false when it was refused.
bool adopt_hello(link_actor* self, const net::message& m, bool answer_with_reject);

}  // namespace corolla::link_detail
