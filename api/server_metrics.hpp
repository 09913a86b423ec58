// api/server_metrics.hpp — GET /metrics of `corolla serve --metrics-listen`:
// the span server's counters (actors/span_stats.hpp: steps by kind with
// their per-hop durations, sessions, cache use, errors) and the node's links
// (bytes, messages, RTT per peer) in Prometheus' text format, and the small
// HTTP server that answers it.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/span_stats.hpp"

namespace corolla::api {

/// The text of one scrape: `stats` of the server whose node id is `node`
/// (a label of every series), its node's traffic over all links since it
/// started, and its `links` by peer.
std::string render_server_metrics(const std::string& node, const span_server_stats& stats, const node_traffic& traffic,
                                  const std::vector<link_stats>& links);

/// What scrapes show of a node's links. A link keeps its counters only
/// while it lives, a reconnect starts a new link at 0, and a peer may have a
/// link each way; the node's totals are read apart from its links. This
/// keeps, per peer, the sum over every link the node has had to it (at most
/// `max_peers` peers, the gone ones forgotten first), and totals that never
/// go down between scrapes, as Prometheus counters must not.
class link_history {
 public:
  explicit link_history(std::size_t max_peers = 1024) : max_peers_(max_peers) {}

  /// One link_stats per peer from the node's links `now`: counters summed
  /// over its links, gone ones included; RTT and rates of its live links
  /// (the busiest); `up` while any is. Links without a peer yet are left out.
  std::vector<link_stats> by_peer(const std::vector<link_stats>& now);

  /// `now`, each counter at least what the previous call returned.
  node_traffic totals(const node_traffic& now);

 private:
  struct peer_links {
    link_stats ended;                          ///< the counters of its closed links, summed
    std::map<std::uint64_t, link_stats> live;  ///< by link, as last seen
    std::uint64_t last_seen = 0;               ///< the update that last saw a live link
  };
  std::size_t max_peers_;
  std::uint64_t updates_ = 0;
  std::map<std::string, peer_links> peers_;
  std::map<std::uint64_t, std::string> link_peer_;  ///< live links' peers, as last seen
  std::map<std::uint64_t, link_stats> link_base_;   ///< counters a live link made for earlier peers
  node_traffic totals_;
};

/// Answers GET /metrics with what `scrape` returns (called on an HTTP
/// thread, one scrape at a time; an exception is a 500 naming it) and GET
/// /health.
class metrics_server {
 public:
  /// How long destruction waits for open connections; past it the
  /// listener's thread is left running (and `scrape` never called again).
  static constexpr std::chrono::seconds kStopGrace{5};

  explicit metrics_server(std::function<std::string()> scrape);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// Binds `host`:`port` (0 = any) and serves on a thread of its own until
  /// destroyed. Returns the port; throws std::runtime_error when it cannot bind.
  int start(const std::string& host, int port);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla::api
