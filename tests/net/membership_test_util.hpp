// tests/net/membership_test_util.hpp — helpers shared by the membership
// tests (test_membership*.cpp): records to announce, and several OpenDHT
// membership nodes of one swarm in one process, with bounded waits for what
// another node reads.
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/membership.hpp"
#include "net/server_record.hpp"
#include "tests/support/eventually.hpp"

#include <doctest/doctest.h>

namespace corolla::net::membership_test {

using namespace std::chrono_literals;

using steady = std::chrono::steady_clock;

inline double ms_since(steady::time_point t) { return std::chrono::duration<double, std::milli>(steady::now() - t).count(); }

inline server_record make_record(const std::string& model, const std::string& node, block_range span,
                          server_state state = server_state::online) {
  server_record r;
  r.model = model;
  r.node_id = node;
  r.endpoint = "tcp://127.0.0.1:7" + std::to_string(span.start);
  r.span = span;
  r.state = state;
  r.throughput = 120.5;
  r.cache_tokens_left = 4096;
  r.step_s_per_block = 0.002;
  r.rtt_ms = {{"next-a", 1.5}, {"next-b", 12.25}};
  r.dtype = "f32";
  r.protocol_version = 3;
  return r;
}

inline std::uint32_t random_network_id() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> d(1, std::numeric_limits<std::uint32_t>::max());
  return d(rd);
}

using corolla::testing::eventually;  // (corolla::net::testing is another namespace)

inline const server_record* find_node(const std::vector<server_record>& records, const std::string& node) {
  for (const auto& r : records)
    if (r.node_id == node) return &r;
  return nullptr;
}

/// Several membership nodes of one swarm (own network id), each joining
/// through the first one. Destroying the fixture stops all of them.
struct dht_swarm {
  std::uint32_t network = random_network_id();
  std::chrono::milliseconds ttl;
  std::vector<std::unique_ptr<membership>> nodes;

  explicit dht_swarm(std::chrono::milliseconds ttl_ = 2000ms, int n = 3) : ttl(ttl_) {
    for (int i = 0; i < n; ++i) add();
  }

  membership_options options() const {
    membership_options o;
    o.ttl = ttl;
    o.network_id = network;
    o.query_timeout = 1000ms;
    o.bootstrap_timeout = 5000ms;
    if (!nodes.empty()) o.bootstrap = {nodes.front()->endpoint()};
    return o;
  }

  membership& add() {
    auto m = std::make_unique<membership>();
    auto ep = m->start(options());
    REQUIRE_MESSAGE(ep, "membership node " << nodes.size() << " did not start: " << (ep ? std::string() : caf::to_string(ep.error())));
    CHECK(ep->rfind("127.0.0.1:", 0) == 0);
    nodes.push_back(std::move(m));
    return *nodes.back();
  }

  membership& operator[](std::size_t i) { return *nodes.at(i); }
};

/// Waits until `reader` sees `node` at `block` with a record satisfying
/// `pred`; returns the time it took in ms (fails the test at the bound).
inline double wait_seen(membership& reader, const std::string& model, int block, const std::string& node,
                 const std::function<bool(const server_record&)>& pred, std::chrono::milliseconds bound = 5000ms) {
  const auto t0 = steady::now();
  const bool ok = eventually(
      [&] {
        auto rs = reader.get_block(model, block);
        auto* r = find_node(rs, node);
        return r && pred(*r);
      },
      bound, 5ms);
  REQUIRE_MESSAGE(ok, "the record of " << node << " at " << model << " block " << block
                                       << " did not appear as expected on another DHT node within "
                                       << bound.count() << " ms");
  return ms_since(t0);
}

inline constexpr auto any_record = [](const server_record&) { return true; };

}  // namespace corolla::net::membership_test
