#include "api/dashboard.hpp"

#include <stdexcept>
#include <utility>

#include <httplib.h>

#include "api/http_bind.hpp"
#include "api/http_framing.hpp"

namespace corolla::api {

using nlohmann::json;

std::string swarm_body(const swarm_watch* watch, const std::string& model_id, int n_blocks) {
  if (watch) return watch->view().dump(-1, ' ', false, json::error_handler_t::replace);
  json v = swarm_view_json(model_id, n_blocks, {}, wall_ms(), {});
  v["local"] = true;
  v["complete"] = true;
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

struct dashboard_server::impl {
  impl(const swarm_watch& w, std::string id, int n) : watch(w), model_id(std::move(id)), n_blocks(n) {}
  const swarm_watch& watch;
  std::string model_id;
  int n_blocks;
  http_server server{kPageReadLimit};
  http_listener listener{server};
};

dashboard_server::dashboard_server(const swarm_watch& watch, std::string model_id, int n_blocks)
    : impl_(std::make_unique<impl>(watch, std::move(model_id), n_blocks)) {
  auto* p = impl_.get();
  serve_pages_only(p->server);
  p->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dashboard_html(), "text/html; charset=utf-8");
  });
  p->server.Get("/swarm.json", [p](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(swarm_body(&p->watch, p->model_id, p->n_blocks), "application/json");
  });
  p->server.Get("/health", [p](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"status", "ok"}, {"model", p->model_id}}.dump(), "application/json");
  });
}

dashboard_server::~dashboard_server() { stop(); }

int dashboard_server::bind(const std::string& host, int port) {
  const int bound = bind_http(impl_->server, host, port);
  return bound;
}

void dashboard_server::run() { impl_->listener.run(); }

void dashboard_server::stop() {
  if (impl_) impl_->listener.stop();
}

}  // namespace corolla::api
