// api/http_bind.hpp — binding and running a cpp-httplib server (internal to
// api/: the API, the dashboard and the server metrics share it).
#pragma once

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include <httplib.h>

namespace corolla::api {

/// Binds `server` to `host`:`port` (0 = any free port) and returns the port.
/// Throws std::runtime_error when it cannot.
inline int bind_http(httplib::Server& server, const std::string& host, int port) {
  // httplib's default sets SO_REUSEPORT, so a second server on a port in
  // use would bind too and the kernel would split connections between
  // them. SO_REUSEADDR alone still rebinds a port in TIME_WAIT.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  return bound;
}

/// Serving a bound server on one thread and stopping it from another, in
/// either order. httplib's stop() does nothing to a server that is not
/// listening yet, so a stop that overtakes run() would leave run() serving
/// for ever: here run() after stop() returns at once, and stop() during
/// run()'s start waits until the server listens, then stops it.
class http_listener {
 public:
  explicit http_listener(httplib::Server& server) : server_(server) {}

  /// Serves until stop() (returns at once when stop() came first).
  void run() {
    run_called_ = true;
    if (!stopping_) server_.listen_after_bind();
    run_ended_ = true;
  }

  void stop() {
    stopping_ = true;
    if (!run_called_) return;
    while (!server_.is_running() && !run_ended_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    server_.stop();
  }

 private:
  httplib::Server& server_;
  std::atomic<bool> run_called_{false}, stopping_{false}, run_ended_{false};
};

}  // namespace corolla::api
