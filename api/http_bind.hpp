// api/http_bind.hpp — binding and running a cpp-httplib server (internal to
// api/: the API, the dashboard and the server metrics share it).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <httplib.h>

namespace corolla::api {

/// Connections the kernel completes for a server before it accepts them.
inline constexpr int http_listen_backlog = 1024;

/// Binds `server` to `host`:`port` (0 = any free port) and returns the port.
/// Throws std::runtime_error when it cannot.
inline int bind_http(httplib::Server& server, const std::string& host, int port) {
  // httplib's default sets SO_REUSEPORT, so a second server on a port in
  // use would bind too and the kernel would split connections between
  // them. SO_REUSEADDR alone still rebinds a port in TIME_WAIT.
  // The socket that binds is the last one these options see.
  auto last = std::make_shared<socket_t>(INVALID_SOCKET);
  server.set_socket_options([last](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *last = sock;
  });
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound < 0) throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port));
  // Debian's libcpp-httplib listens with a backlog of 5 (compiled in): a
  // burst of more clients connecting at once than the acceptor has taken
  // overflows the accept queue, the kernel drops their handshakes and they
  // retry a second later. Listening again only sets the backlog.
  if (*last != INVALID_SOCKET) ::listen(*last, http_listen_backlog);
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
