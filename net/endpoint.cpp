// net/endpoint.cpp — see endpoint.hpp.
#include "net/endpoint.hpp"

#include <algorithm>
#include <cctype>

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

}  // namespace corolla::net
