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
  peer_terms terms;
  /// What other threads may do without this actor (actors/link_gate.hpp).
  std::shared_ptr<link_gate> gate;
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

using link_actor = caf::stateful_actor<link_state>;

/// Whether the link's messages travel through a relay (link_args::relay_peer).
inline bool relayed(const link_state& st) { return !st.args.relay_peer.empty(); }

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
void send_hello(link_actor* self, net::message_kind kind);
/// Tells the node's subscribers `what` (peer_up, peer_down).
void notify(link_actor* self, const caf::message& what);
void fail_pending(link_actor* self, const caf::error& why);
void fail_waiters(link_actor* self, const caf::error& why);
std::chrono::milliseconds goodbye_drain(const link_state& st);
void shutdown(link_actor* self, const std::string& reason, const caf::error& why);
void close_link(link_actor* self, const std::string& reason, const caf::error& why);
void close_link_after_grace(link_actor* self, const std::string& reason, const caf::error& why);
void became_up(link_actor* self);
void became_down(link_actor* self, const std::string& reason);
/// Takes the peer's hello (or its answer); false when it was refused.
bool adopt_hello(link_actor* self, const net::message& m, bool answer_with_reject);

}  // namespace corolla::link_detail
