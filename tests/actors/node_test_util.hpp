// tests/actors/node_test_util.hpp — helpers shared by the in-process node
// tests (test_node*.cpp): starting a node, and node options with fast
// heartbeats.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <utility>

#include "actors/corolla.hpp"

namespace corolla::node_test {

using namespace std::chrono_literals;

inline std::unique_ptr<node> start_node(node_options o = {}) {
  auto n = node::start(std::move(o));
  REQUIRE_MESSAGE(n, error_message(n));
  return std::move(*n);
}

/// Node options with fast failure detection, so timing tests stay short.
/// Only for tests of that detection: a busy machine can starve a node's
/// threads for longer than 300 ms.
inline node_options fast_options() {
  node_options o;
  o.heartbeat_interval = 50ms;
  o.peer_timeout = 300ms;
  return o;
}

/// Frequent heartbeats (round-trip samples soon), but a peer is down only
/// after 10 s of silence: for tests whose links must stay up.
inline node_options frequent_heartbeats() {
  node_options o;
  o.heartbeat_interval = 50ms;
  o.peer_timeout = 10s;
  return o;
}

}  // namespace corolla::node_test
