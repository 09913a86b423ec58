// net/server_record.hpp — one server's membership record: what a volunteer
// server announces in the DHT for every block it covers, its compact wire
// form, and the read-side rules (validation, freshness, newest-wins).
//
// Records come from untrusted peers through the DHT, so decoding validates
// every field and size before using it and never throws; a record that fails
// is ignored by the reader (membership logs it at debug level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <caf/expected.hpp>
#include <caf/sec.hpp>

#include "model/block_range.hpp"
#include "model/server_state.hpp"

namespace corolla::net {

/// One server's announcement for one span of one model. The same record is
/// stored under the DHT key of every block of its span.
///
/// `seq`, `timestamp_ms`, `ttl_ms` and `network_id` are stamped by
/// membership on every put; whatever the caller puts there is overwritten.
struct server_record {
  std::string model;     ///< model id (e.g. the checkpoint's name); keys are derived from it
  std::string node_id;   ///< the server's node id (the actor runtime's id; swarm::server_id)
  std::string endpoint;  ///< where clients connect, e.g. "tcp://10.0.0.5:7000"
  block_range span;      ///< the blocks this record covers
  server_state state = server_state::joining;
  /// Tokens per second through the whole span (the unit of
  /// swarm::server_record::throughput: additive over servers of a block). >= 0.
  double throughput = 0.0;
  /// Attention-cache tokens a new session could still get; -1 = unknown.
  std::int64_t cache_tokens_left = -1;
  /// Seconds one decode step takes per block on this server; 0 = unknown.
  double step_s_per_block = 0.0;
  /// Measured round-trip times in milliseconds to servers of the following
  /// blocks, by node id (moving averages). At most max_rtt_entries.
  std::map<std::string, double> rtt_ms;
  std::string dtype = "f32";          ///< compute/wire dtype of hidden states ("f32", "bf16", ...)
  /// How the server holds its blocks' weights ("f32", "bf16", ...); shown
  /// to people (the dashboard), not used for routing.
  std::string weights = "f32";
  std::uint32_t protocol_version = 0; ///< wire protocol version the server speaks
  /// Grows with every put by the same server, also across restarts (it is
  /// seeded from the wall clock): of two records of one server, the larger
  /// seq is the newer one.
  std::uint64_t seq = 0;
  /// Announcer's wall clock (ms since the Unix epoch) when the record was put.
  std::int64_t timestamp_ms = 0;
  /// How long the record stays valid after timestamp_ms without a refresh.
  std::uint32_t ttl_ms = 0;
  /// The swarm's network id (membership_options::network_id).
  std::uint32_t network_id = 0;
  /// Optional public key of the server (e.g. its CurveZMQ key, Z85); "" = none.
  std::string public_key;
  /// A server behind NAT (`serve --no-listen`): the node id of the relay it
  /// is reached through; `endpoint` and `public_key` are then the relay's
  /// (clients dial the relay, then node::connect_via). "" = reached directly.
  std::string relay;
  /// The server passes messages on for servers behind NAT (it started its
  /// node with relay_service and listens).
  bool relay_service = false;
  /// The LoRA adapters the server applies per session over its span, by
  /// name: each one's digest (lora_adapter::digest); at most
  /// max_record_adapters. Shown to people (the dashboard, as Petals'
  /// ServerInfo.adapters); clients route by what a server answers
  /// (span.info), not by this. Encoded as a map, which readers that do not
  /// know the key skip (their unpack limits admit no arrays); a reader
  /// drops an adapter map it cannot take (over max_record_adapters entries,
  /// a non-string or empty name or digest) and keeps the record.
  std::map<std::string, std::string> adapters;

  friend bool operator==(const server_record&, const server_record&) = default;
};

/// Bounds a record must respect; anything beyond is rejected as malformed.
inline constexpr std::size_t max_record_bytes = 8192;      ///< encoded size
inline constexpr std::size_t max_record_string_bytes = 256; ///< each id/endpoint/dtype/key
inline constexpr std::size_t max_rtt_entries = 64;
inline constexpr std::size_t max_record_adapters = 16;
inline constexpr int max_block_index = 1 << 20;             ///< span.end <= this
inline constexpr std::uint32_t min_record_ttl_ms = 100;
inline constexpr std::uint32_t max_record_ttl_ms = 300'000;

/// Format version written into every encoded record ("v"). Readers reject
/// other versions; new optional fields may be added without a bump (unknown
/// keys are skipped).
inline constexpr std::uint32_t record_format_version = 1;

/// Checks the fields of a record (as announce() needs them and as decode
/// enforces them): non-empty model and node id, every string within
/// max_record_string_bytes, span non-empty inside [0, max_block_index],
/// throughput and step time finite and >= 0, cache >= -1, at most
/// max_rtt_entries RTTs, each finite and >= 0, at most max_record_adapters
/// adapters, each name and digest non-empty. Returns "" or the first
/// problem as one sentence. Stamped fields (seq, ttl...) are not checked.
std::string check_record_fields(const server_record& r);

/// The record as a msgpack map with short keys (see docs/swarm_serving.md, "DHT records").
/// Precondition: check_record_fields(r) is empty (the output may otherwise
/// exceed max_record_bytes).
std::vector<std::uint8_t> encode_record(const server_record& r);

/// Decodes and validates bytes from the DHT: size, msgpack structure (no
/// trailing bytes, bounded nesting), format version, every field's type and
/// range (check_record_fields), ttl in [min_record_ttl_ms,
/// max_record_ttl_ms]. Never throws; an error names what was wrong.
caf::expected<server_record> decode_record(std::span<const std::uint8_t> bytes);

/// Wall clock in ms since the Unix epoch (the clock of timestamp_ms).
std::int64_t unix_ms_now();

/// True when the record is still valid at `now_ms`: its age is at most its
/// ttl_ms, and it is not from further in the future than `max_clock_skew_ms`
/// (clocks of volunteer machines differ a little; a record from far ahead
/// would otherwise outlive its server).
bool is_fresh(const server_record& r, std::int64_t now_ms, std::int64_t max_clock_skew_ms);

/// True when `a` supersedes `b` (same server): larger seq, or equal seq and
/// later timestamp.
bool is_newer(const server_record& a, const server_record& b);

/// Of several records of one block, the newest per node id (is_newer), in
/// node-id order. Freshness is not checked here.
std::vector<server_record> newest_per_server(std::vector<server_record> records);

/// Merges per-block views into one list of distinct records: one per
/// (node id, span), the newest, ordered by (node id, span.start).
std::vector<server_record> merge_spans(const std::vector<std::vector<server_record>>& per_block);

}  // namespace corolla::net
