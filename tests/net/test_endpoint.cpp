// tcp_endpoint_problem: what --listen, --relay and a dial accept;
// tcp_listen_problem: what a socket can bind.
#include <doctest/doctest.h>

#include <string>

#include "net/endpoint.hpp"

using corolla::net::tcp_endpoint_problem;

TEST_CASE("a TCP endpoint needs a host and a port in [0, 65535]") {
  for (const char* good : {"tcp://127.0.0.1:0", "tcp://127.0.0.1:65535", "tcp://*:7000", "tcp://host.example:80",
                           "tcp://[::1]:9000", "tcp://127.0.0.1:*"}) {
    CAPTURE(good);
    CHECK(tcp_endpoint_problem(good).empty());
  }
  // ZeroMQ would bind port 99999 as 34463 (modulo 65536) and -5 as 65531.
  CHECK(tcp_endpoint_problem("tcp://127.0.0.1:99999") ==
        "invalid endpoint 'tcp://127.0.0.1:99999': the port must be in [0, 65535]");
  CHECK(tcp_endpoint_problem("tcp://127.0.0.1:-5") ==
        "invalid endpoint 'tcp://127.0.0.1:-5': the port must be in [0, 65535]");
  CHECK(tcp_endpoint_problem("tcp://127.0.0.1:") == "invalid endpoint 'tcp://127.0.0.1:': the port must be in [0, 65535]");
  CHECK(tcp_endpoint_problem("tcp://127.0.0.1:123456") ==
        "invalid endpoint 'tcp://127.0.0.1:123456': the port must be in [0, 65535]");
  CHECK(tcp_endpoint_problem("tcp://:5555") == "invalid endpoint 'tcp://:5555': no host");
  CHECK(tcp_endpoint_problem("tcp://garbage") == "invalid endpoint 'tcp://garbage' (expected tcp://HOST:PORT)");
  CHECK(tcp_endpoint_problem("127.0.0.1:5555") == "invalid endpoint '127.0.0.1:5555' (expected tcp://HOST:PORT)");
}

TEST_CASE("a TCP endpoint to listen on needs '*', an IP address or an interface: ZeroMQ binds no host names") {
  using corolla::net::tcp_listen_problem;
  for (const char* good : {"tcp://127.0.0.1:0", "tcp://*:7000", "tcp://[::1]:9000", "tcp://::1:9000", "tcp://lo:0",
                           "tcp://0.0.0.0:5555"}) {
    CAPTURE(good);
    CHECK(tcp_listen_problem(good).empty());
  }
  CHECK(tcp_listen_problem("tcp://localhost:0") ==
        "invalid endpoint 'tcp://localhost:0' to listen on: 'localhost' is not an IP address or a network interface of "
        "this machine (ZeroMQ binds no host names: use, e.g., tcp://127.0.0.1:0 or tcp://*:0)");
  CHECK(tcp_listen_problem("tcp://host.example:80").find("'host.example' is not an IP address") != std::string::npos);
  // What any endpoint needs comes first.
  CHECK(tcp_listen_problem("tcp://127.0.0.1:99999") ==
        "invalid endpoint 'tcp://127.0.0.1:99999': the port must be in [0, 65535]");
}

TEST_CASE("the host of a TCP endpoint, without its port or IPv6 brackets") {
  using corolla::net::tcp_endpoint_host;
  CHECK(tcp_endpoint_host("tcp://10.0.0.5:7000") == "10.0.0.5");
  CHECK(tcp_endpoint_host("tcp://[::1]:9000") == "::1");
  CHECK(tcp_endpoint_host("tcp://*:0") == "*");
  CHECK(tcp_endpoint_host("host.example:80") == "host.example");  // "tcp://" may be left out
  CHECK(tcp_endpoint_host("tcp://lo") == "lo");                   // no port: the whole rest
}
