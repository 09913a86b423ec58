// net/membership.hpp — swarm membership in an OpenDHT DHT.
//
// Every volunteer server announces, for each block of its span, a record
// (net/server_record.hpp) under the DHT key InfoHash::get(model + ":block:"
// + i). Records are short-lived: the announcer re-puts them every refresh
// interval, and readers drop any record older than its TTL, so a server that
// crashes (kill -9) disappears from every reader within TTL + one read
// (default 15 s; Petals keeps a dead server visible for up to 240 s). A
// graceful leave puts an OFFLINE record first, which readers see at once.
//
// OpenDHT runs its own network thread; this class adds one refresh thread
// and one thread that delivers listen() events. All public methods are
// thread-safe. OpenDHT itself stays out of this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "net/server_record.hpp"
#include "net/wrong_output_report.hpp"

namespace corolla::net {

/// The DHT network id corolla swarms use unless told otherwise. Never 0:
/// that is OpenDHT's public network, which a swarm must not mix with.
inline constexpr std::uint32_t default_membership_network_id = 0xC0A0'11A0u;

/// How a membership node runs. Every default works for a swarm on one
/// machine; all nodes of one swarm must use the same network id and should
/// use the same TTL.
struct membership_options {
  /// Local address the DHT's UDP socket binds (IPv4, or IPv6 if it contains ':').
  std::string bind_address = "127.0.0.1";
  /// UDP port; 0 = any free port (start() reports the one chosen).
  std::uint16_t port = 0;
  /// Nodes to join through, as "host:port" ("[v6addr]:port" for IPv6).
  /// Empty = start a new swarm.
  std::vector<std::string> bootstrap;
  /// Validity of an announced record without refresh. Readers drop older
  /// records. Must lie in [100 ms, 300 s].
  std::chrono::milliseconds ttl{15'000};
  /// How often announced records are re-put; 0 = ttl / 3. Must be < ttl.
  std::chrono::milliseconds refresh_interval{0};
  /// DHT network id: nodes with different ids never talk, so separate
  /// swarms (and test runs) never see each other. Must not be 0.
  std::uint32_t network_id = default_membership_network_id;
  /// How long start() waits for a bootstrap node to answer.
  std::chrono::milliseconds bootstrap_timeout{10'000};
  /// Longest a get_block()/get_span() waits for DHT answers; it then returns
  /// the records received so far.
  std::chrono::milliseconds query_timeout{2'000};
  /// Longest withdraw_offline() waits for its OFFLINE puts to be stored.
  std::chrono::milliseconds put_timeout{2'000};
  /// Records stamped further than this in the future (the announcer's clock
  /// runs ahead) are ignored.
  std::chrono::milliseconds max_clock_skew{2'000};
  /// OpenDHT's per-address request limit: 0 = OpenDHT's default, except on a
  /// loopback bind address where it is lifted (all local nodes share one
  /// address); -1 = unlimited; > 0 = that many requests per second.
  std::int64_t max_peer_requests_per_s = 0;
};

/// A change seen by listen(): a new or newer record of one server at one
/// block, or its disappearance (`removed`: expired in the DHT or, more
/// promptly, older than its TTL).
struct membership_event {
  int block = 0;
  server_record record;  ///< for `removed`, the last record seen
  bool removed = false;
};

/// Receives listen() events, on membership's own event thread (never on the
/// DHT thread): it may call get_block() etc., but a slow callback delays
/// later events.
using membership_callback = std::function<void(const membership_event&)>;

/// Identifies one listen() subscription.
using listen_id = std::uint64_t;

/// The DHT key of one block of one model: the hex of
/// InfoHash::get(model + ":block:" + block) (40 hex digits).
std::string membership_key(const std::string& model, int block);

/// One node's view of and voice in the swarm's DHT.
class membership {
 public:
  membership();
  /// Stops without withdrawing: announced records are no longer refreshed
  /// and expire for readers within their TTL (this is what a crash looks
  /// like). Call withdraw_offline() first for a graceful leave.
  ~membership();
  membership(const membership&) = delete;
  membership& operator=(const membership&) = delete;

  /// Starts the DHT node and joins the swarm through `opt.bootstrap` (or
  /// starts a new swarm when it is empty). Returns this node's DHT endpoint
  /// "ADDRESS:PORT" (the bound port, also when opt.port was 0), which other
  /// nodes pass as a bootstrap entry. Fails with a message for invalid
  /// options, an unresolvable bootstrap entry, a port that cannot be bound,
  /// or no bootstrap node answering within opt.bootstrap_timeout. Call once.
  caf::expected<std::string> start(const membership_options& opt);

  /// The endpoint start() returned ("" before start()).
  std::string endpoint() const;

  /// Starts announcing `r` under the key of every block of r.span and keeps
  /// re-putting it (a new seq and timestamp each time) every refresh
  /// interval until withdraw_offline() or destruction. An announcement of
  /// the same model, node id and span replaces the previous one. Fails for
  /// an invalid record (check_record_fields), before start(), or when the
  /// span overlaps a different active span of the same server (one server's
  /// records never overlap; withdraw the old span first).
  caf::error announce(server_record r);

  /// Replaces an active announcement of the same model, node id and span
  /// (state, throughput, cache, RTTs, ... may change) and re-puts it at once
  /// with a higher seq, so readers see it within one DHT round trip. Fails
  /// when no such announcement is active (a new span needs announce()).
  caf::error update(server_record r);

  /// Graceful leave of every active announcement: puts each as OFFLINE
  /// (clients stop routing to it at once), stops refreshing, and waits up to
  /// put_timeout for the puts to be stored. Returns how many of the block
  /// puts were acknowledged by another DHT node (0 when this node has no
  /// peer: then nobody needs telling).
  std::size_t withdraw_offline();

  /// Same for the one active announcement (model, node_id, span); 0 when
  /// there is none.
  std::size_t withdraw_offline(const std::string& model, const std::string& node_id, block_range span);

  /// The current records of one block: newest per server, records older than
  /// their TTL (or of another network or model, or not covering `block`, or
  /// malformed) dropped; OFFLINE records are returned with state offline.
  /// Blocks up to query_timeout; empty before start().
  std::vector<server_record> get_block(const std::string& model, int block);

  /// The records covering any block of [start, end), queried in parallel:
  /// one per (server, span), the newest; same filtering as get_block().
  std::vector<server_record> get_span(const std::string& model, int start, int end);

  /// Subscribes to changes of the given blocks (best effort: a missed DHT
  /// notification is caught by the next refresh of the record). Removal of a
  /// record is reported when it is older than its TTL (checked every
  /// refresh interval) or the DHT expires it. Returns 0 before start().
  listen_id listen(const std::string& model, const std::vector<int>& blocks, membership_callback cb);

  /// Ends a subscription; no event for it is delivered after this returns
  /// (unless called from within that subscription's callback).
  void unlisten(listen_id id);

  /// Stops refreshing, listening and the DHT node (same as the destructor).
  void stop();

  /// Puts `r` (stamped with the time and network id) under the model's
  /// report key once; it stays wrong_output_report_ttl_ms. Fails before
  /// start() or for a report that would not decode (empty names, bad span).
  caf::error report_wrong_output(wrong_output_report r);

  /// The reports of `model` now in the DHT (of this network, not expired,
  /// newest per server, reporter and span). Blocks up to query_timeout.
  std::vector<wrong_output_report> wrong_output_reports(const std::string& model);

  /// Number of DHT peers this node currently considers good.
  std::size_t good_peers() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla::net
