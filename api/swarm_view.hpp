// api/swarm_view.hpp — what the dashboard shows of a swarm: its servers as
// their DHT records describe them, block coverage, the bottleneck
// throughput and recent changes (servers joining, going online, leaving or
// vanishing, and the API's failovers).
//
// swarm_view_json is pure (records in, JSON out); swarm_watch reads the
// records once a period on a thread of its own and keeps the latest view
// and the change log, so HTTP handlers never wait on the DHT.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/server_record.hpp"

namespace corolla::api {

/// One change the dashboard lists.
struct swarm_event {
  std::int64_t at_ms = 0;  ///< wall clock, ms since the Unix epoch
  std::string kind;        ///< "joined", "online", "offline", "vanished", "failover"
  std::string node_id;     ///< the server ("" for a failover that names none)
  std::string detail;      ///< e.g. "blocks [0, 3)", or the failover's reason
};

/// The dashboard's JSON (docs/api.md, "Dashboard"): {model, blocks, now_ms,
/// servers: [{node_id, endpoint, span: [start, end], state, throughput,
/// cache_tokens_left, step_ms_per_block, rtt_ms: {node: ms}, dtype, weights,
/// relayed, relay (its relay's node id), relay_service, age_ms, public_key}], coverage: [online servers per block],
/// block_throughput: [tokens/s per block over its online servers],
/// bottleneck_throughput, complete (every block has an online server),
/// events: [...newest first]}. Of several records of one server and span,
/// the newest (largest seq) counts.
nlohmann::json swarm_view_json(const std::string& model, int n_blocks, const std::vector<net::server_record>& records,
                               std::int64_t now_ms, const std::deque<swarm_event>& events);

/// Reads a swarm's records every `period` and keeps its view.
class swarm_watch {
 public:
  using reader = std::function<std::vector<net::server_record>()>;
  /// `read` returns the records of every block (e.g. membership::get_span);
  /// it runs on the watch's thread, and on the caller's in refresh() (one
  /// read at a time: it need not be thread-safe).
  swarm_watch(std::string model, int n_blocks, reader read,
              std::chrono::milliseconds period = std::chrono::milliseconds(1000), std::size_t max_events = 50);
  ~swarm_watch();
  swarm_watch(const swarm_watch&) = delete;
  swarm_watch& operator=(const swarm_watch&) = delete;

  /// The latest view (swarm_view_json); before the first read, one with no
  /// servers.
  nlohmann::json view() const;
  /// Records a failover the API's swarm client recovered from.
  void note_failover(const std::string& detail);
  /// Reads the records now (also what the thread does every period).
  void refresh();

 private:
  void add_event(swarm_event e);

  std::string model_;
  int n_blocks_;
  reader read_;
  std::chrono::milliseconds period_;
  std::size_t max_events_;
  std::mutex reading_;  ///< one refresh() at a time (read_ need not be thread-safe)
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::deque<swarm_event> events_;  ///< newest first
  std::map<std::string, server_state> last_state_;  ///< by node id, as last seen
  std::vector<net::server_record> records_;
  std::thread thread_;
};

/// Wall-clock milliseconds since the Unix epoch.
std::int64_t wall_ms();

}  // namespace corolla::api
