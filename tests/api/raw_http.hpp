// tests/api/raw_http.hpp — one HTTP exchange written byte for byte, for
// requests no client library would send (ambiguous framing, smuggled
// requests).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <doctest/doctest.h>

namespace corolla::api {

/// A new loopback TCP connection to `port` (its descriptor; the caller
/// closes it).
inline int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
  return fd;
}

/// Writes `request` on a new loopback connection to `port` and returns
/// everything read until the server closes it (a check fails when the
/// server leaves it open for 20 s instead).
inline std::string raw_exchange(int port, const std::string& request) {
  const int fd = raw_connect(port);
  const timeval limit{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string answer;
  char buf[4096];
  ssize_t got = 0;
  while ((got = ::recv(fd, buf, sizeof buf, 0)) > 0) answer.append(buf, static_cast<std::size_t>(got));
  ::close(fd);
  CHECK(got == 0);  // closed by the server, not a timeout
  return answer;
}

/// A request whose headers never end: `GET path` on a new loopback
/// connection to `port`, then a header line every 500 ms (each restarts
/// cpp-httplib's 5 s read timeout, so the request holds an HTTP thread),
/// for at most 120 s or until stop() or the server goes away.
class header_trickle {
 public:
  header_trickle(int port, const std::string& path) : fd_(raw_connect(port)) {
    const std::string start = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    REQUIRE(::send(fd_, start.data(), start.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(start.size()));
    thread_ = std::thread([this] {
      for (int i = 0; i < 240 && !done_; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        if (::send(fd_, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL) < 0) break;  // the server went away
      }
    });
  }
  ~header_trickle() {
    stop();
    ::close(fd_);
  }
  header_trickle(const header_trickle&) = delete;
  header_trickle& operator=(const header_trickle&) = delete;

  /// No more header lines; the connection stays open.
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int fd() const { return fd_; }

 private:
  int fd_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace corolla::api
