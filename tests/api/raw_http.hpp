// tests/api/raw_http.hpp — one HTTP exchange written byte for byte, for
// requests no client library would send (ambiguous framing, smuggled
// requests).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

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

}  // namespace corolla::api
