// tests/schedule/test_routing.cpp — min-latency and max-throughput routes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "schedule/routing.hpp"

using namespace corolla::swarm;
using corolla::server_state;

namespace {

server_record srv(std::string id, int start, int end, double step_s = 0.01,
                  server_state state = server_state::online) {
  server_record r;
  r.id = std::move(id);
  r.span = {start, end};
  r.state = state;
  r.throughput = 1.0;
  r.step_s_per_block = step_s;
  return r;
}

std::vector<route_hop> hops(std::initializer_list<route_hop> h) { return h; }

route routed(const swarm_state& s, const route_request& req, const routing_params& p = {}) {
  auto r = min_latency_route(s, req, p);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? std::string() : r.error().message));
  return r.value();
}

// Hops are contiguous over [start, end) and each server holds its blocks ONLINE.
void check_covers(const swarm_state& s, const route& r, int start, int end) {
  int at = start;
  for (const auto& h : r.hops) {
    CHECK(h.start == at);
    CHECK(h.end > h.start);
    for (int b = h.start; b < h.end; ++b) {
      bool held = false;
      for (const auto& rec : s.servers)
        held |= rec.id == h.server && rec.state == server_state::online && rec.span.contains(b);
      CHECK_MESSAGE(held, h.server << " does not hold block " << b);
    }
    at = h.end;
  }
  CHECK(at == end);
}

// Two servers per half; a's link to d is fast, to b slow; c is far from the client.
swarm_state two_by_two() {
  swarm_state s{4, {srv("a", 0, 2), srv("b", 2, 4), srv("c", 0, 2), srv("d", 2, 4)}};
  s.servers[0].rtt_s = {{"b", 0.2}, {"d", 0.02}};
  s.servers[2].rtt_s = {{"b", 0.02}, {"d", 0.02}};
  return s;
}
std::map<server_id, double> two_by_two_pings() { return {{"a", 0.02}, {"b", 0.02}, {"c", 0.1}, {"d", 0.02}}; }

}  // namespace

TEST_CASE("min-latency routing picks the chain with the lowest predicted latency") {
  const auto s = two_by_two();
  route_request req;
  req.client_rtt_s = two_by_two_pings();
  const auto r = routed(s, req);
  CHECK(r.hops == hops({{"a", 0, 2, true}, {"d", 2, 4, true}}));
  // client->a 0.01 + 0.001, 2 blocks 0.02, a->d 0.01 + 0.001, 2 blocks 0.02, d->client 0.01 + 0.001
  CHECK(r.latency_s == doctest::Approx(0.073));
  CHECK(to_string(r) == "[0, 2) via a -> [2, 4) via d");
  auto again = predicted_latency(s, r.hops, req);
  REQUIRE(again.ok());
  CHECK(again.value() == doctest::Approx(r.latency_s));
  // The alternative a -> b is slower by the slow a-b link.
  CHECK(predicted_latency(s, hops({{"a", 0, 2}, {"b", 2, 4}}), req).value() == doctest::Approx(0.163));
}

TEST_CASE("routing skips excluded servers for this call only") {
  const auto s = two_by_two();
  route_request req;
  req.client_rtt_s = two_by_two_pings();
  req.excluded = {"d"};
  auto r = routed(s, req);
  // a -> b costs 0.163; c -> b: 0.051 + 0.02 + 0.011 + 0.02 + 0.011.
  CHECK(r.hops == hops({{"c", 0, 2}, {"b", 2, 4}}));
  CHECK(r.latency_s == doctest::Approx(0.113));
  // Nothing is remembered: the next call without exclusions uses d again.
  req.excluded.clear();
  CHECK(routed(s, req).hops.back().server == "d");
}

TEST_CASE("routing switches servers in the middle of a span when that is cheaper") {
  // a holds everything but is slow; b holds the second half and is fast.
  swarm_state s{4, {srv("a", 0, 4, 0.05), srv("b", 2, 4, 0.001)}};
  s.servers[0].rtt_s = {{"b", 0.01}};
  route_request req;
  req.client_rtt_s = {{"a", 0.02}, {"b", 0.02}};
  auto r = routed(s, req);
  CHECK(r.hops == hops({{"a", 0, 2}, {"b", 2, 4}}));
  CHECK(r.latency_s == doctest::Approx(0.011 + 0.1 + 0.006 + 0.002 + 0.011));
  // Staying on a (what Petals' end-of-span rule forces) would take 0.222 s.
  CHECK(predicted_latency(s, hops({{"a", 0, 4}}), req).value() == doctest::Approx(0.222));

  // Overlapping spans: leave a after its first block for the fast b.
  s = {4, {srv("a", 0, 3, 0.05), srv("b", 1, 4, 0.001)}};
  s.servers[1].rtt_s = {{"a", 0.01}};  // only b measured the link: used both ways
  r = routed(s, req);
  CHECK(r.hops == hops({{"a", 0, 1}, {"b", 1, 4}}));
  CHECK(r.latency_s == doctest::Approx(0.011 + 0.05 + 0.006 + 0.003 + 0.011));

  // When b is the slow one, the route stays on a as long as a can go.
  s.servers[0].step_s_per_block = 0.001;
  s.servers[1].step_s_per_block = 0.05;
  r = routed(s, req);
  CHECK(r.hops == hops({{"a", 0, 3}, {"b", 3, 4}}));
}

TEST_CASE("routing a sub-range replaces exactly a lost span") {
  // x held [2, 4) and failed. u feeds the range and w receives its output.
  swarm_state s{6, {srv("u", 0, 2), srv("x", 2, 4), srv("r1", 2, 4), srv("r2", 2, 3), srv("r3", 3, 4),
                    srv("w", 4, 6)}};
  auto& u = s.servers[0];
  u.rtt_s = {{"r1", 0.2}, {"r2", 0.02}, {"x", 0.001}};
  s.servers[2].rtt_s = {{"w", 0.02}};
  s.servers[3].rtt_s = {{"r3", 0.02}};
  s.servers[5].rtt_s = {{"r3", 0.02}};  // measured by w only
  route_request req;
  req.start = 2;
  req.end = 4;
  req.excluded = {"x"};
  req.upstream = "u";
  req.downstream = "w";
  req.client_rtt_s = {{"r1", 0.001}};  // irrelevant: the range is priced from u to w
  const auto r = routed(s, req);
  CHECK(r.hops == hops({{"r2", 2, 3}, {"r3", 3, 4}}));
  CHECK(r.latency_s == doctest::Approx(0.011 + 0.01 + 0.011 + 0.01 + 0.011));
  check_covers(s, r, 2, 4);

  // The whole chain for comparison covers [0, 6) with the replacement inside.
  route_request full;
  full.excluded = {"x"};
  const auto f = routed(s, full);
  check_covers(s, f, 0, 6);
  CHECK(std::none_of(f.hops.begin(), f.hops.end(), [](const route_hop& h) { return h.server == "x"; }));
}

TEST_CASE("servers short of cache are penalised or excluded") {
  swarm_state s{4, {srv("fast", 0, 4, 0.001), srv("roomy", 0, 4, 0.01)}};
  s.servers[0].cache_tokens_left = 100;
  s.servers[1].cache_tokens_left = 10000;
  route_request req;
  req.client_rtt_s = {{"fast", 0.02}, {"roomy", 0.02}};
  req.session_tokens = 50;
  CHECK(routed(s, req).hops == hops({{"fast", 0, 4}}));
  req.session_tokens = 500;
  CHECK(routed(s, req).hops == hops({{"roomy", 0, 4}}));

  // With nothing else, the short server is still used, flagged, and the
  // penalty is not counted as time.
  req.excluded = {"roomy"};
  auto r = routed(s, req);
  CHECK(r.hops == hops({{"fast", 0, 4, false}}));
  CHECK(r.latency_s == doctest::Approx(0.011 + 0.004 + 0.011));
  CHECK(to_string(r).find("short of cache") != std::string::npos);

  routing_params strict;
  strict.exclude_without_cache = true;
  auto e = min_latency_route(s, req, strict);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().code == schedule_errc::no_server_for_block);
  CHECK(e.error().block == 0);
  CHECK(e.error().message.find("1 lacking cache") != std::string::npos);

  // Unknown cache (-1) is never penalised.
  s.servers[0].cache_tokens_left = -1;
  CHECK(routed(s, req).hops == hops({{"fast", 0, 4, true}}));
}

TEST_CASE("a server reached through a relay costs its extra leg: a direct twin wins, a much faster relayed one still does") {
  // Two servers hold every block at equal measured RTTs; one sits behind NAT.
  swarm_state s{4, {srv("direct", 0, 4), srv("natted", 0, 4)}};
  s.servers[1].relayed = true;
  route_request req;
  req.client_rtt_s = {{"direct", 0.02}, {"natted", 0.02}};
  CHECK(routed(s, req).hops == hops({{"direct", 0, 4, true}}));
  routing_params p;
  auto direct_latency = predicted_latency(s, {{"direct", 0, 4, true}}, req, p);
  auto natted_latency = predicted_latency(s, {{"natted", 0, 4, true}}, req, p);
  REQUIRE(direct_latency.ok());
  REQUIRE(natted_latency.ok());
  // Entry and exit each pay the relay once.
  CHECK(natted_latency.value() - direct_latency.value() == doctest::Approx(2 * p.relay_penalty_s));
  // Much faster compute behind the relay is worth its leg.
  s.servers[1].step_s_per_block = 0.001;
  CHECK(routed(s, req).hops == hops({{"natted", 0, 4, true}}));
  // Between two servers, either end being relayed costs the leg.
  swarm_state chain{4, {srv("a", 0, 2), srv("b", 2, 4), srv("b-natted", 2, 4)}};
  chain.servers[2].relayed = true;
  route_request all_known;
  all_known.client_rtt_s = {{"a", 0.02}, {"b", 0.02}, {"b-natted", 0.02}};
  CHECK(routed(chain, all_known).hops == hops({{"a", 0, 2, true}, {"b", 2, 4, true}}));
}

TEST_CASE("no route when a block has no usable server, with an error naming the block") {
  // Block 3 is held only by a JOINING server: clients cannot use it yet.
  swarm_state s{6, {srv("a", 0, 3), srv("j", 3, 4, 0.01, server_state::joining), srv("b", 4, 6)}};
  auto r = min_latency_route(s, {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == schedule_errc::no_server_for_block);
  CHECK(r.error().block == 3);
  CHECK(r.error().message.find("block 3") != std::string::npos);
  std::mt19937_64 rng(1);
  auto t = max_throughput_route(s, {}, rng);
  REQUIRE_FALSE(t.ok());
  CHECK(t.error().block == 3);

  // Excluding the only server of a block says so.
  s = {6, {srv("a", 0, 3), srv("b", 3, 6)}};
  route_request req;
  req.excluded = {"b"};
  r = min_latency_route(s, req);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().block == 3);
  CHECK(r.error().message.find("excluded") != std::string::npos);

  // Bad ranges are argument errors; an empty range is an empty route.
  req = {};
  req.start = 4;
  req.end = 9;
  CHECK(min_latency_route(s, req).error().code == schedule_errc::invalid_argument);
  req.end = 4;
  auto empty = min_latency_route(s, req);
  REQUIRE(empty.ok());
  CHECK(empty.value().hops.empty());
}

TEST_CASE("unknown measurements fall back to the defaults and huge RTTs are capped") {
  server_record bare;
  bare.id = "a";
  bare.span = {0, 3};
  swarm_state s{3, {bare}};
  auto r = routed(s, {});
  // 0.3 s RTT assumed each way in and out, 1/300 s per block, 1 ms per message.
  CHECK(r.latency_s == doctest::Approx(0.15 + 0.001 + 3.0 / 300 + 0.15 + 0.001));

  route_request req;
  req.client_rtt_s = {{"a", std::numeric_limits<double>::infinity()}};
  r = routed(s, req);  // unreachable-looking, but the only server: still a route
  CHECK(r.latency_s == doctest::Approx(5.0 + 0.001 + 0.01 + 5.0 + 0.001));
}

TEST_CASE("routes do not depend on the order of the records") {
  auto s = two_by_two();
  s.servers.push_back(srv("e", 1, 3, 0.005));
  s.servers.push_back(srv("f", 0, 4, 0.02));
  route_request req;
  req.client_rtt_s = two_by_two_pings();
  const auto first = routed(s, req);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10; ++i) {
    std::shuffle(s.servers.begin(), s.servers.end(), rng);
    const auto again = routed(s, req);
    CHECK(again.hops == first.hops);
    CHECK(again.latency_s == first.latency_s);
  }
}

TEST_CASE("records of one server mid-move are used as one server") {
  // m is moving: [0, 2) ONLINE, [2, 4) ONLINE too (serving both); no hop
  // cost between its own records, and the route names it once.
  swarm_state s{4, {srv("m", 0, 2), srv("m", 2, 4), srv("o", 2, 4, 0.01)}};
  s.servers[0].rtt_s = {{"o", 0.5}};
  route_request req;
  req.client_rtt_s = {{"m", 0.02}, {"o", 0.02}};
  const auto r = routed(s, req);
  CHECK(r.hops == hops({{"m", 0, 4}}));
  CHECK(r.latency_s == doctest::Approx(0.011 + 0.04 + 0.011));
}

TEST_CASE("max-throughput routing draws servers in proportion to throughput") {
  swarm_state s{8, {srv("a", 0, 8), srv("b", 0, 8), srv("c", 0, 8)}};
  s.servers[0].throughput = 1;
  s.servers[1].throughput = 2;
  s.servers[2].throughput = 3;
  std::mt19937_64 rng(42);
  std::map<server_id, int> count;
  const int n = 6000;
  for (int i = 0; i < n; ++i) {
    auto r = max_throughput_route(s, {}, rng);
    REQUIRE(r.ok());
    REQUIRE(r.value().hops.size() == 1);
    ++count[r.value().hops[0].server];
  }
  CHECK(count["a"] / double(n) == doctest::Approx(1.0 / 6).epsilon(0.1));
  CHECK(count["b"] / double(n) == doctest::Approx(2.0 / 6).epsilon(0.05));
  CHECK(count["c"] / double(n) == doctest::Approx(3.0 / 6).epsilon(0.05));
  MESSAGE("max-throughput draws (1:2:3): " << count["a"] << " " << count["b"] << " " << count["c"]);

  // The same seed gives the same routes.
  std::mt19937_64 r1(9), r2(9);
  for (int i = 0; i < 20; ++i)
    CHECK(max_throughput_route(s, {}, r1).value().hops == max_throughput_route(s, {}, r2).value().hops);
}

TEST_CASE("max-throughput routes cover the range and respect exclusions") {
  swarm_state s{8, {srv("a", 0, 4), srv("b", 0, 8), srv("c", 4, 8), srv("z", 0, 8)}};
  s.servers[3].throughput = 0;  // never drawn while others can serve
  std::mt19937_64 rng(5);
  std::map<server_id, int> seen;
  for (int i = 0; i < 200; ++i) {
    auto r = max_throughput_route(s, {}, rng);
    REQUIRE(r.ok());
    check_covers(s, r.value(), 0, 8);
    for (const auto& h : r.value().hops) ++seen[h.server];
  }
  CHECK(seen["a"] > 0);
  CHECK(seen["b"] > 0);
  CHECK(seen["c"] > 0);
  CHECK(seen["z"] == 0);

  throughput_route_request req;
  req.start = 2;
  req.end = 6;
  req.excluded = {"b"};
  for (int i = 0; i < 20; ++i) {
    auto r = max_throughput_route(s, req, rng);
    REQUIRE(r.ok());
    CHECK(r.value().hops == hops({{"a", 2, 4}, {"c", 4, 6}}));
  }
  // Only zero-throughput servers left: drawn uniformly rather than failing.
  req.excluded = {"a", "b", "c"};
  auto r = max_throughput_route(s, req, rng);
  REQUIRE(r.ok());
  CHECK(r.value().hops == hops({{"z", 2, 6}}));
}
