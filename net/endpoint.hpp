// net/endpoint.hpp — checking a ZeroMQ TCP endpoint ("tcp://HOST:PORT")
// before it is bound or dialled. ZeroMQ itself takes a port past 65535
// modulo 65536 and reports a malformed address only when it is used, so
// a typo in --listen or --relay would bind another port or fail late.
#pragma once

#include <string>
#include <string_view>

namespace corolla::net {

/// Why `endpoint` is not "tcp://HOST:PORT" (a non-empty host, a port of
/// decimal digits in [0, 65535], or "*" for any), as one phrase naming it
/// ("invalid endpoint 'tcp://a:99999': the port must be in [0, 65535]");
/// empty when it is one.
std::string tcp_endpoint_problem(std::string_view endpoint);

/// The host of a ZeroMQ TCP endpoint, without its port or IPv6 brackets
/// ("tcp://10.0.0.5:7000" -> "10.0.0.5", "tcp://[::1]:9" -> "::1"; the
/// "tcp://" may be left out).
std::string tcp_endpoint_host(std::string_view endpoint);

/// tcp_endpoint_problem(), and for a socket to bind: a host that is "*",
/// an IP address ("127.0.0.1", "[::1]") or a network interface of this
/// machine ("lo"). ZeroMQ binds no host names: "tcp://localhost:0" would
/// fail inside it with an errno of no help ("Resource temporarily
/// unavailable").
std::string tcp_listen_problem(std::string_view endpoint);

}  // namespace corolla::net
