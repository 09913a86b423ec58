// api/server_metrics.hpp — GET /metrics of `corolla serve --metrics-listen`:
// the span server's counters (actors/span_stats.hpp: steps by kind with
// their per-hop durations, sessions, cache use, errors) and the node's links
// (bytes, messages, RTT per peer) in Prometheus' text format, and the small
// HTTP server that answers it.
#pragma once

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

/// Links keep their counters only while they are up; `seen` keeps the last
/// snapshot of every peer (at most `max_peers`, the longest gone first) so
/// that a peer's counters do not drop when its link closes. Returns them
/// all, those of gone peers marked down.
std::vector<link_stats> remember_links(std::map<std::string, link_stats>& seen, const std::vector<link_stats>& now,
                                       std::size_t max_peers = 1024);

/// Answers GET /metrics with what `scrape` returns (called on an HTTP
/// thread, one scrape at a time; an exception is a 500 naming it) and GET
/// /health.
class metrics_server {
 public:
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
