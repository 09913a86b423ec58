// api/dashboard.hpp — the swarm dashboard: a page (GET /) and its data
// (GET /swarm.json, swarm_view.hpp's JSON), served by `corolla api` beside
// the OpenAI routes and by `corolla dashboard` on its own, for volunteers
// who run no API. docs/api.md, "Dashboard".
#pragma once

#include <memory>
#include <string>

#include "api/swarm_view.hpp"

namespace corolla::api {

/// The page: HTML with its script and styles inline (no build step).
const std::string& dashboard_html();

/// GET /swarm.json's body: the watch's view, or for an API computing locally
/// (`watch` null) one with no servers and "local": true.
std::string swarm_body(const swarm_watch* watch, const std::string& model_id, int n_blocks);

/// `corolla dashboard`: GET / (the page), GET /swarm.json, GET /health. The
/// watch is borrowed and must outlive the server.
class dashboard_server {
 public:
  dashboard_server(const swarm_watch& watch, std::string model_id, int n_blocks);
  ~dashboard_server();
  dashboard_server(const dashboard_server&) = delete;
  dashboard_server& operator=(const dashboard_server&) = delete;

  /// Binds `host`:`port` (0 = any free port); returns the port. Throws
  /// std::runtime_error when it cannot.
  int bind(const std::string& host, int port);
  /// Serves until stop().
  void run();
  void stop();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla::api
