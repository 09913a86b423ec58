// actors/node_context.hpp — what a node's actors share (internal): the actor
// system, the transport, the directory, the node's identity and the
// timing options. Links and proxies hold it by shared_ptr; the transport's
// event callbacks hold it weakly.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/registry.hpp"
#include "net/codec.hpp"
#include "net/nic.hpp"
#include "net/rate_limit.hpp"
#include "net/shaping.hpp"
#include "net/zmq_transport.hpp"

namespace corolla {

/// Timing and identity of a node, as its links need them.
struct link_settings {
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds peer_timeout{1200};
  /// A pending request is forgotten (its promise dropped) after this long,
  /// so a requester that gave up does not leak an entry forever.
  std::chrono::milliseconds request_ttl{std::chrono::hours(1)};
  /// An accepted connection that sends no hello within this long is closed.
  std::chrono::milliseconds accept_hello_timeout{10000};
  /// An accepted link that stays down this long is closed (the peer
  /// reconnects on a new connection if it comes back).
  std::chrono::milliseconds retire_after{30000};
  std::string nic_class = "ethernet";
  /// This host's NICs (net::discover_nics), for the transport choice per link.
  std::vector<net::nic_info> nics;
  net::link_profile profile;     ///< shaping of what this node sends
  std::string profile_text;      ///< as given ("none", "wan", "bw=..."), sent in hellos
  bool curve = false;
};

/// Payload bytes and messages, summed over links; thread-safe.
struct traffic_counters {
  std::atomic<std::uint64_t> bytes_sent{0}, bytes_received{0}, messages_sent{0}, messages_received{0};
  void add(std::uint64_t bs, std::uint64_t br, std::uint64_t ms, std::uint64_t mr) {
    bytes_sent += bs;
    bytes_received += br;
    messages_sent += ms;
    messages_received += mr;
  }
};

struct node_context {
  node_context(caf::actor_system& sys, std::string id, link_settings s)
      : system(sys), node_id(std::move(id)), settings(std::move(s)) {}

  caf::actor_system& system;
  const std::string node_id;
  const link_settings settings;
  std::string listen_endpoint;  ///< set once before `ready`
  std::uint64_t max_message_bytes = 0;  ///< announced in hellos
  registry directory;
  /// Relaying (actors/relay.hpp), set once before `ready`: pass messages on
  /// between peers, and accept links relayed to this node.
  bool relay_service = false;
  bool accept_relayed = false;
  /// Bytes per second each peer may send through this relay (0 = no
  /// limit), and each sender's bucket: touched on the I/O thread only.
  double relay_rate = 0;
  std::map<std::string, net::token_bucket> relay_quota;
  /// Messages this node passed on as a relay, and refused for a sender
  /// over relay_rate.
  std::atomic<std::uint64_t> relayed_messages{0}, relay_refused{0};
  /// Traffic of the links that ended (node::traffic adds the live ones).
  traffic_counters ended_traffic;
  /// Set once the transport is started and the context complete; events
  /// before that are dropped (a peer repeats its hello).
  std::atomic<bool> ready{false};
  /// Set when the node begins to stop: new connections are ignored.
  std::atomic<bool> stopping{false};

  /// The transport (null once the node has stopped).
  std::shared_ptr<net::zmq_transport> transport() const {
    std::lock_guard lock(mutex_);
    return transport_;
  }
  void set_transport(std::shared_ptr<net::zmq_transport> t) {
    std::lock_guard lock(mutex_);
    transport_ = std::move(t);
  }

  /// The hello this node sends; `requested_profile` (may be empty) asks the
  /// peer to shape its replies the same way (capability "shape=<profile>").
  net::hello_info hello(const std::string& requested_profile) const;

  /// Shaping a node::reshape_links put on everything the node sends, for
  /// links that start later too; nullopt = none (each link shapes as it
  /// was set up).
  std::optional<net::link_profile> reshaped() const {
    std::lock_guard lock(mutex_);
    return reshaped_;
  }
  void set_reshaped(std::optional<net::link_profile> p) {
    std::lock_guard lock(mutex_);
    reshaped_ = std::move(p);
  }

  /// A partition a harness put on the node (node_control.hpp): every
  /// message to or from a peer other than `keep` (the harness) is dropped
  /// by the link actors, handshakes and heartbeats included; nullopt ends it.
  void set_partition(std::optional<std::string> keep) {
    std::lock_guard lock(mutex_);
    partition_keep_ = std::move(keep);
    partitioned_.store(partition_keep_.has_value(), std::memory_order_release);
  }
  /// Whether traffic with node `peer` is dropped now (one atomic load while
  /// no partition is on: every message asks).
  bool drops(const std::string& peer) const {
    if (!partitioned_.load(std::memory_order_acquire)) return false;
    std::lock_guard lock(mutex_);
    return partition_keep_ && peer != *partition_keep_;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<net::zmq_transport> transport_;
  std::optional<net::link_profile> reshaped_;
  std::optional<std::string> partition_keep_;
  std::atomic<bool> partitioned_{false};
};

/// Nanoseconds on the steady clock (heartbeat timestamps; only ever
/// compared with the same process's clock).
std::uint64_t steady_now_ns();

}  // namespace corolla
