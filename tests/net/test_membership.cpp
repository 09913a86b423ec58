// tests/net/test_membership.cpp — the OpenDHT-backed membership: start
// options, records appearing on other DHT nodes, updates (newest wins),
// announce validation, and ignoring malformed, foreign, other-network and
// other-model values; several DHT nodes in one process on 127.0.0.1 (port
// 0), each swarm on its own random network id. Records alone are in
// test_membership_records.cpp, expiry, crashes and listen in
// test_membership_expiry.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>

// OpenDHT first: doctest defines a WARN macro that breaks its headers.
#include <msgpack.hpp>
#include <opendht.h>

#include <doctest/doctest.h>

#include "net/membership.hpp"
#include "net/server_record.hpp"
#include "tests/net/membership_test_util.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::membership_test;
using namespace std::chrono_literals;

// ---- membership over OpenDHT ------------------------------------------------------

TEST_CASE("membership start rejects bad options and an unreachable bootstrap node") {
  auto bad = [](const membership_options& o) {
    membership m;
    auto ep = m.start(o);
    return ep ? std::string("started") : caf::to_string(ep.error());
  };
  membership_options o;
  o.network_id = 0;
  CHECK(bad(o).find("network id 0") != std::string::npos);
  o.network_id = random_network_id();
  o.ttl = 50ms;
  CHECK(bad(o).find("ttl") != std::string::npos);
  o.ttl = 1000ms;
  o.refresh_interval = 1000ms;
  CHECK(bad(o).find("refresh interval") != std::string::npos);
  o.refresh_interval = 0ms;
  o.bootstrap = {"no-port-here"};
  CHECK(bad(o).find("HOST:PORT") != std::string::npos);

  // A UDP socket of ours that never answers: the bootstrap must time out.
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  o.bootstrap = {"127.0.0.1:" + std::to_string(ntohs(addr.sin_port))};
  o.bootstrap_timeout = 600ms;
  const auto t0 = steady::now();
  auto why = bad(o);
  ::close(fd);
  CHECK(why.find("no bootstrap node") != std::string::npos);
  CHECK(ms_since(t0) < 3000);
}

TEST_CASE("a server's record appears on other DHT nodes for every block of its span") {
  dht_swarm swarm(3000ms);
  auto r = make_record("tiny", "server-b", {2, 5}, server_state::online);
  const auto t0 = steady::now();
  REQUIRE_MESSAGE(!swarm[1].announce(r), "announce failed");
  const double appear_ms = wait_seen(swarm[2], "tiny", 2, "server-b", any_record);
  MESSAGE("record visible on another DHT node " << appear_ms << " ms after announce (total "
          << ms_since(t0) << " ms)");
  for (int b = 2; b < 5; ++b) {
    auto rs = swarm[0].get_block("tiny", b);
    REQUIRE_MESSAGE(rs.size() == 1, "block " << b << " has " << rs.size() << " records");
    CHECK(rs[0].node_id == "server-b");
    CHECK(rs[0].span == block_range{2, 5});
    CHECK(rs[0].state == server_state::online);
    CHECK(rs[0].endpoint == r.endpoint);
    CHECK(rs[0].throughput == doctest::Approx(120.5));
    CHECK(rs[0].rtt_ms == r.rtt_ms);
    CHECK(rs[0].ttl_ms == 3000);
    CHECK(rs[0].network_id == swarm.network);
  }
  CHECK(swarm[2].get_block("tiny", 1).empty());
  CHECK(swarm[2].get_block("tiny", 5).empty());
  auto span = swarm[2].get_span("tiny", 0, 8);
  REQUIRE(span.size() == 1);
  CHECK(span[0].node_id == "server-b");
  // The announcer reads its own record too.
  CHECK(find_node(swarm[1].get_block("tiny", 3), "server-b"));
}

TEST_CASE("an update replaces the record everywhere: the newest sequence number wins") {
  dht_swarm swarm(3000ms);
  auto r = make_record("tiny", "server-b", {0, 2}, server_state::joining);
  REQUIRE(!swarm[1].announce(r));
  wait_seen(swarm[2], "tiny", 0, "server-b", [](const server_record& x) { return x.state == server_state::joining; });
  const auto first_seq = swarm[2].get_block("tiny", 0).at(0).seq;

  r.state = server_state::online;
  r.throughput = 300;
  r.cache_tokens_left = 100;
  const auto t0 = steady::now();
  REQUIRE(!swarm[1].update(r));
  for (int b : {0, 1})
    wait_seen(swarm[2], "tiny", b, "server-b", [](const server_record& x) {
      return x.state == server_state::online && x.throughput == 300 && x.cache_tokens_left == 100;
    });
  MESSAGE("update visible on another node after " << ms_since(t0) << " ms");
  auto rs = swarm[0].get_block("tiny", 1);
  REQUIRE(rs.size() == 1);  // older versions are still stored, but only the newest is reported
  CHECK(rs[0].seq > first_seq);

  // update() needs an active announcement of exactly that span.
  auto other = r;
  other.span = {0, 3};
  CHECK(swarm[1].update(other));
}

TEST_CASE("announce validates records and keeps one server's spans apart") {
  membership idle;
  CHECK(idle.announce(make_record("m", "n", {0, 1})));  // before start()
  CHECK(idle.get_block("m", 0).empty());
  CHECK(idle.endpoint().empty());

  dht_swarm swarm(3000ms, 1);
  auto bad = make_record("m", "", {0, 1});
  CHECK(caf::to_string(swarm[0].announce(bad)).find("node id") != std::string::npos);
  bad = make_record("m", "n", {3, 3});
  CHECK(caf::to_string(swarm[0].announce(bad)).find("span") != std::string::npos);
  bad = make_record("m", "n", {0, 1});
  bad.throughput = std::nan("");
  CHECK(swarm[0].announce(bad));

  CHECK(!swarm[0].announce(make_record("m", "n", {0, 4})));
  CHECK(caf::to_string(swarm[0].announce(make_record("m", "n", {2, 6}))).find("overlaps") != std::string::npos);
  CHECK(!swarm[0].announce(make_record("m", "n", {4, 6})));  // adjacent: a move in progress
  CHECK(!swarm[0].announce(make_record("m", "n", {0, 4})));  // same span: replaces
  CHECK(!swarm[0].announce(make_record("m", "other", {2, 6})));
  // A lone node (a new swarm) still answers reads from its own storage.
  wait_seen(swarm[0], "m", 5, "n", any_record);
  CHECK(swarm[0].get_span("m", 0, 6).size() == 3);
}

TEST_CASE("malformed and foreign values under a block key are ignored") {
  dht_swarm swarm(3000ms, 2);
  REQUIRE(!swarm[1].announce(make_record("tiny", "good", {0, 2})));

  // A raw OpenDHT node of the same network writes what no membership would.
  dht::DhtRunner raw;
  dht::DhtRunner::Config cfg;
  cfg.dht_config.node_config.network = swarm.network;
  cfg.dht_config.node_config.max_peer_req_per_sec = -1;
  raw.run("127.0.0.1", "", "0", cfg);
  raw.bootstrap(dht::SockAddr::resolve("127.0.0.1", swarm[0].endpoint().substr(10)));
  REQUIRE(eventually([&] { return raw.getNodesStats(AF_INET).good_nodes > 0; }, 5000ms));

  const auto key = dht::InfoHash::get("tiny:block:0");
  // Fire and forget: storage nodes refuse some of these, which OpenDHT
  // reports late; what matters is that the values sit at the key.
  auto put = [&](std::shared_ptr<dht::Value> v) { raw.put(key, std::move(v)); };
  const dht::ValueType::Id ours = 0xC011;
  auto valid = [](server_record r, std::uint32_t net, std::int64_t ts) {
    r.seq = 99;
    r.timestamp_ms = ts;
    r.ttl_ms = 3000;
    r.network_id = net;
    return encode_record(r);
  };
  const auto now = unix_ms_now();
  // Garbage of another value type and of ours (our nodes refuse to store the
  // latter; the raw node still serves it from its own storage).
  put(std::make_shared<dht::Value>(dht::Blob{'h', 'e', 'l', 'l', 'o'}));
  put(std::make_shared<dht::Value>(ours, dht::Blob{0x81, 0xa1, 'v', 0x01}, 1001));
  put(std::make_shared<dht::Value>(ours, dht::Blob(9000, 0x90), 1002));
  // Well-formed records that do not belong here.
  put(std::make_shared<dht::Value>(ours, valid(make_record("other-model", "foreign-model", {0, 2}), swarm.network, now), 1003));
  put(std::make_shared<dht::Value>(ours, valid(make_record("tiny", "wrong-block", {5, 7}), swarm.network, now), 1004));
  put(std::make_shared<dht::Value>(ours, valid(make_record("tiny", "wrong-net", {0, 2}), swarm.network + 1, now), 1005));
  put(std::make_shared<dht::Value>(ours, valid(make_record("tiny", "stale", {0, 2}), swarm.network, now - 60'000), 1006));
  // A record in the wrong value type but otherwise valid.
  put(std::make_shared<dht::Value>(valid(make_record("tiny", "wrong-type", {0, 2}), swarm.network, now)));

  // The junk is at the key (the raw node serves it to every reader).
  auto junk_ids = [&] {
    std::set<dht::Value::Id> ids;
    for (const auto& v : raw.get(key).get())
      if (v->id >= 1001 && v->id <= 1006) ids.insert(v->id);
    return ids.size();
  };
  REQUIRE_MESSAGE(eventually([&] { return junk_ids() == 6; }, 3000ms), "the raw values did not show up at the key");

  wait_seen(swarm[0], "tiny", 0, "good", any_record);
  for (std::size_t i = 0; i < 2; ++i) {
    auto rs = swarm[i].get_block("tiny", 0);
    REQUIRE(rs.size() == 1);
    CHECK(rs[0].node_id == "good");
  }
  raw.join();
}

TEST_CASE("swarms with other network ids and records of other models are not mixed") {
  dht_swarm swarm(3000ms, 2);
  // A node of another network cannot even join through this swarm's node.
  membership stranger;
  auto o = swarm.options();
  o.network_id = swarm.network ^ 0x5a5a5a5a;
  o.bootstrap_timeout = 600ms;
  auto ep = stranger.start(o);
  REQUIRE_FALSE(ep);
  CHECK(caf::to_string(ep.error()).find("no bootstrap node") != std::string::npos);

  REQUIRE(!swarm[1].announce(make_record("model-a", "server-1", {0, 2})));
  REQUIRE(!swarm[1].announce(make_record("model-b", "server-1", {0, 2})));
  wait_seen(swarm[0], "model-b", 0, "server-1", any_record);
  auto a = swarm[0].get_block("model-a", 0);
  auto b = swarm[0].get_block("model-b", 0);
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(a[0].model == "model-a");
  CHECK(b[0].model == "model-b");
  CHECK(membership_key("model-a", 0) != membership_key("model-b", 0));
  CHECK(membership_key("model-a", 0).size() == 40);
}
