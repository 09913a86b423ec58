// net/endpoint.cpp — see endpoint.hpp.
#include "net/endpoint.hpp"

#include <arpa/inet.h>
#include <net/if.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace corolla::net {

std::string tcp_endpoint_problem(std::string_view endpoint) {
  const std::string named = "invalid endpoint '" + std::string(endpoint) + "'";
  constexpr std::string_view scheme = "tcp://";
  if (endpoint.substr(0, scheme.size()) != scheme) return named + " (expected tcp://HOST:PORT)";
  const std::string_view rest = endpoint.substr(scheme.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string_view::npos) return named + " (expected tcp://HOST:PORT)";
  if (colon == 0) return named + ": no host";
  const std::string_view port = rest.substr(colon + 1);
  if (port == "*") return {};
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (!digits || std::stoi(std::string(port)) > 65535) return named + ": the port must be in [0, 65535]";
  return {};
}

std::string tcp_endpoint_host(std::string_view endpoint) {
  constexpr std::string_view scheme = "tcp://";
  if (endpoint.substr(0, scheme.size()) == scheme) endpoint.remove_prefix(scheme.size());
  if (const auto colon = endpoint.rfind(':'); colon != std::string_view::npos) endpoint = endpoint.substr(0, colon);
  if (endpoint.size() >= 2 && endpoint.front() == '[' && endpoint.back() == ']')
    endpoint = endpoint.substr(1, endpoint.size() - 2);
  return std::string(endpoint);
}

std::string tcp_listen_problem(std::string_view endpoint) {
  if (std::string why = tcp_endpoint_problem(endpoint); !why.empty()) return why;
  const std::string_view rest = endpoint.substr(std::string_view("tcp://").size());
  const std::string host = tcp_endpoint_host(endpoint);
  if (host == "*") return {};
  unsigned char address[16];
  if (inet_pton(AF_INET, host.c_str(), address) == 1 || inet_pton(AF_INET6, host.c_str(), address) == 1) return {};
  if (if_nametoindex(host.c_str()) != 0) return {};
  return "invalid endpoint '" + std::string(endpoint) + "' to listen on: '" + host +
         "' is not an IP address or a network interface of this machine (ZeroMQ binds no host names: use, e.g., "
         "tcp://127.0.0.1:" + std::string(rest.substr(rest.rfind(':') + 1)) + " or tcp://*:" +
         std::string(rest.substr(rest.rfind(':') + 1)) + ")";
}

}  // namespace corolla::net
