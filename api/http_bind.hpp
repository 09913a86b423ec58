// api/http_bind.hpp — binding a cpp-httplib server (internal to api/: the
// API, the dashboard and the server metrics share it).
#pragma once

#include <stdexcept>
#include <string>

#include <httplib.h>

namespace corolla::api {

/// Binds `server` to `host`:`port` (0 = any free port) and returns the port.
/// Throws std::runtime_error when it cannot.
inline int bind_http(httplib::Server& server, const std::string& host, int port) {
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  return bound;
}

}  // namespace corolla::api
