// api/http_api.hpp — the OpenAI-compatible HTTP server of `corolla api`.
//
// Routes (docs/api.md):
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/completions, /v1/chat/completions (stream: server-sent events)
//   GET  /metrics   Prometheus text format (never behind --api-key)
//   GET  /health    {"status": "ok", "slots": N, "busy": B}
//   GET  /          the swarm dashboard page; GET /swarm.json its data
//                   (api/dashboard.hpp; never behind --api-key)
// Every error is an OpenAI error object with its HTTP status: 400 invalid
// request, 401 wrong or missing key, 404 unknown model or route, 503 when no
// chain of servers covers the model, 500 otherwise; a failure after a
// stream started ends it with an error event and [DONE].
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "api/adapter_access.hpp"
#include "api/api_keys.hpp"
#include "api/chat_template.hpp"
#include "api/completion_engine.hpp"
#include "api/metrics.hpp"
#include "api/swarm_view.hpp"
#include "model/tokenizer.hpp"

namespace corolla::api {

/// How the server presents itself.
struct api_config {
  std::string model_id;  ///< the id of /v1/models (the model directory's name)
  /// The keys /v1/ requests must carry, each a tenant's (none: no key
  /// required). Tenants never share caches.
  api_keys keys;
  /// Which tenants may use which adapters (api/adapter_access.hpp; checked
  /// against the engine's adapters and `keys` as the server is made).
  adapter_access adapters;
  int http_threads = 64; ///< connections served at once (requests beyond the engine's slots wait)
  /// How long a request may take to arrive, from when the server starts
  /// reading it to the end of its body (api/http_server.hpp; zero: no
  /// bound): past it, 408.
  std::chrono::milliseconds request_read_limit{std::chrono::seconds(60)};
  /// The swarm the dashboard shows (GET /, GET /swarm.json); null for a
  /// local engine. Borrowed: it must outlive the server.
  swarm_watch* swarm = nullptr;
};

/// The HTTP server. Borrowed objects must outlive it.
class http_api {
 public:
  /// `chat`: the model's chat template, or nullopt with `chat_error` the
  /// message /v1/chat/completions answers (400) instead.
  http_api(completion_engine& engine, const tokenizer& tok, std::optional<chat_template> chat, std::string chat_error,
           api_config config);
  ~http_api();
  http_api(const http_api&) = delete;
  http_api& operator=(const http_api&) = delete;

  /// Binds `host`:`port` (0 = any free port); returns the port. Throws
  /// std::runtime_error when it cannot.
  int bind(const std::string& host, int port);
  /// Serves until stop() (from another thread or a signal handler's thread).
  void run();
  void stop();

  /// The server's metrics (also GET /metrics).
  metrics_registry& metrics();
  /// GET /metrics's text (Prometheus), the engine's gauges read now, with
  /// every series (the API port's own /metrics leaves out private
  /// adapters'); thread-safe (for a metrics_server of its own: `corolla
  /// api --metrics-listen`).
  std::string metrics_text();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace corolla::api
