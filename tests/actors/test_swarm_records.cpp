// actors/swarm_records: membership records as the swarm scheduler sees them.
#include <doctest/doctest.h>

#include <string>

#include "actors/swarm_records.hpp"

using namespace corolla;
using namespace corolla::net;

namespace {

server_record make_record(const std::string& node, block_range span, server_state state = server_state::online) {
  server_record r;
  r.model = "m";
  r.node_id = node;
  r.endpoint = "tcp://127.0.0.1:7" + std::to_string(span.start);
  r.span = span;
  r.state = state;
  r.throughput = 120.5;
  r.cache_tokens_left = 4096;
  r.step_s_per_block = 0.002;
  r.rtt_ms = {{"next-a", 1.5}, {"next-b", 12.25}};
  return r;
}

server_record stamped(server_record r, std::uint64_t seq, std::int64_t ts) {
  r.seq = seq;
  r.timestamp_ms = ts;
  r.ttl_ms = 15'000;
  return r;
}

}  // namespace

TEST_CASE("membership records convert to the swarm description of schedule/") {
  auto a = stamped(make_record("a", {0, 4}, server_state::online), 10, 1000);
  auto a_old = stamped(make_record("a", {2, 6}, server_state::joining), 3, 900);  // overlaps a newer record
  auto b = stamped(make_record("b", {4, 12}, server_state::joining), 7, 1000);       // clipped to 8 blocks
  auto c = stamped(make_record("c", {0, 8}, server_state::offline), 9, 1000);        // offline: left out
  auto d = stamped(make_record("d", {9, 10}), 9, 1000);                              // outside: dropped
  auto s = to_swarm_state(8, {a_old, b, c, a, d});
  CHECK(s.n_blocks == 8);
  REQUIRE(s.servers.size() == 2);
  const auto& sa = s.servers[0];
  CHECK(sa.id == "a");
  CHECK(sa.span == block_range{0, 4});
  CHECK(sa.state == server_state::online);
  CHECK(sa.throughput == doctest::Approx(120.5));
  CHECK(sa.cache_tokens_left == 4096);
  CHECK(sa.step_s_per_block == doctest::Approx(0.002));
  CHECK(sa.rtt_s.at("next-b") == doctest::Approx(0.01225));
  CHECK(s.servers[1].id == "b");
  CHECK(s.servers[1].span == block_range{4, 8});
  CHECK(s.servers[1].state == server_state::joining);
}

