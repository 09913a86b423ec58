// tests/net/test_membership.cpp — membership records (encoding, validation,
// newest-wins, swarm conversion) and the OpenDHT-backed membership: several
// DHT nodes in one process on 127.0.0.1 (port 0), each swarm on its own
// random network id, short TTLs so expiry is checked in seconds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

// OpenDHT first: doctest defines a WARN macro that breaks its headers.
#include <msgpack.hpp>
#include <opendht.h>

#include <doctest/doctest.h>

#include "net/membership.hpp"
#include "net/server_record.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

double ms_since(steady::time_point t) { return std::chrono::duration<double, std::milli>(steady::now() - t).count(); }

server_record make_record(const std::string& model, const std::string& node, block_range span,
                          member_state state = member_state::online) {
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

/// A record as membership would stamp it (for the pure tests).
server_record stamped(server_record r, std::uint64_t seq, std::int64_t ts, std::uint32_t ttl_ms = 15'000) {
  r.seq = seq;
  r.timestamp_ms = ts;
  r.ttl_ms = ttl_ms;
  r.network_id = 7;
  return r;
}

std::span<const std::uint8_t> bytes_of(const std::vector<std::uint8_t>& v) { return {v.data(), v.size()}; }

std::uint32_t random_network_id() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> d(1, std::numeric_limits<std::uint32_t>::max());
  return d(rd);
}

/// Polls `cond` until it holds or `timeout` passes; true when it held.
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
                std::chrono::milliseconds poll = 20ms) {
  const auto deadline = steady::now() + timeout;
  while (true) {
    if (cond()) return true;
    if (steady::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
}

const server_record* find_node(const std::vector<server_record>& records, const std::string& node) {
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
    REQUIRE_MESSAGE(ep, "membership node " << nodes.size() << " did not start: " << caf::to_string(ep.error()));
    CHECK(ep->rfind("127.0.0.1:", 0) == 0);
    nodes.push_back(std::move(m));
    return *nodes.back();
  }

  membership& operator[](std::size_t i) { return *nodes.at(i); }
};

/// Waits until `reader` sees `node` at `block` with a record satisfying
/// `pred`; returns the time it took in ms (fails the test at the bound).
double wait_seen(membership& reader, const std::string& model, int block, const std::string& node,
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

auto any_record = [](const server_record&) { return true; };

/// Bytes of a msgpack map built by `fill` (for crafting bad records).
template <class F>
std::vector<std::uint8_t> packed(std::uint32_t entries, F fill) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(entries);
  fill(pk);
  const auto* p = reinterpret_cast<const std::uint8_t*>(buf.data());
  return {p, p + buf.size()};
}

/// Re-encodes a valid record with one key's value replaced by `bad` (packed
/// by the callback), to check each field's type and range checks.
std::vector<std::uint8_t> with_field(const std::string& key, const std::function<void(msgpack::packer<msgpack::sbuffer>&)>& bad) {
  auto good = encode_record(stamped(make_record("m", "n", {0, 2}), 1, unix_ms_now()));
  auto h = msgpack::unpack(reinterpret_cast<const char*>(good.data()), good.size());
  const auto& map = h.get().via.map;
  return packed(map.size, [&](auto& pk) {
    for (std::uint32_t i = 0; i < map.size; ++i) {
      std::string k(map.ptr[i].key.via.str.ptr, map.ptr[i].key.via.str.size);
      pk.pack(k);
      if (k == key)
        bad(pk);
      else
        pk.pack(map.ptr[i].val);
    }
  });
}

}  // namespace

// ---- records (pure) ----------------------------------------------------------

TEST_CASE("a membership record survives encoding and decoding unchanged") {
  auto r = stamped(make_record("llama-tiny", "node-7", {3, 9}, member_state::joining), 1234567, unix_ms_now());
  r.public_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  r.cache_tokens_left = -1;
  r.weights = "bf16";
  auto bytes = encode_record(r);
  CHECK(bytes.size() < 400);  // compact: well under one UDP packet
  auto back = decode_record(bytes_of(bytes));
  REQUIRE_MESSAGE(back, caf::to_string(back.error()));
  CHECK(*back == r);
  CHECK(std::string(to_string(member_state::offline)) == "OFFLINE");
}

TEST_CASE("malformed membership values are rejected with a reason and never crash") {
  const auto now = unix_ms_now();
  auto good = encode_record(stamped(make_record("m", "n", {0, 2}), 1, now));
  REQUIRE(decode_record(bytes_of(good)));

  auto reason = [](const std::vector<std::uint8_t>& b) {
    auto r = decode_record(bytes_of(b));
    return r ? std::string("accepted") : caf::to_string(r.error());
  };

  CHECK(reason({}).find("empty") != std::string::npos);
  // Every truncation of a valid record, and one byte too many.
  for (std::size_t n = 1; n < good.size(); ++n) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_MESSAGE(!decode_record(bytes_of(cut)), "truncated to " << n << " bytes was accepted");
  }
  auto longer = good;
  longer.push_back(0xc0);
  CHECK(reason(longer).find("trailing") != std::string::npos);
  // Random bytes (fixed seed), including random mutations of a good record.
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::uint8_t> junk(1 + rng() % 300);
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
    (void)decode_record(bytes_of(junk));
    auto mutated = good;
    for (int k = 0; k < 3; ++k) mutated[rng() % mutated.size()] = static_cast<std::uint8_t>(rng());
    if (auto r = decode_record(bytes_of(mutated))) CHECK(check_record_fields(*r).empty());
  }
  // Oversize, not a map, nesting, duplicate and missing keys.
  CHECK(reason(std::vector<std::uint8_t>(max_record_bytes + 1, 0x90)).find("bytes") != std::string::npos);
  CHECK(reason({0x93, 0x01, 0x02, 0x03}) != "accepted");  // an array
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(std::string("v")); pk.pack_map(1); pk.pack(std::string("x")); pk.pack_map(1); pk.pack(std::string("y")); pk.pack_map(0); })) != "accepted");
  CHECK(reason(packed(2, [](auto& pk) { pk.pack(std::string("v")); pk.pack(1); pk.pack(std::string("v")); pk.pack(1); })).find("twice") != std::string::npos);
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(std::string("v")); pk.pack(1); })).find("missing") != std::string::npos);
  CHECK(reason(packed(1, [](auto& pk) { pk.pack(7); pk.pack(1); })).find("not a string") != std::string::npos);
  // Wrong types and ranges, field by field.
  auto str = [](auto& pk) { pk.pack(std::string("x")); };
  CHECK(reason(with_field("v", [](auto& pk) { pk.pack(2); })).find("format version 2") != std::string::npos);
  CHECK(reason(with_field("b0", str)).find("'b0'") != std::string::npos);
  CHECK(reason(with_field("b1", [](auto& pk) { pk.pack(-1); })).find("'b1'") != std::string::npos);
  CHECK(reason(with_field("b1", [](auto& pk) { pk.pack(0); })).find("span") != std::string::npos);
  CHECK(reason(with_field("st", [](auto& pk) { pk.pack(3); })).find("'st'") != std::string::npos);
  CHECK(reason(with_field("tp", [](auto& pk) { pk.pack_double(std::nan("")); })).find("throughput") != std::string::npos);
  CHECK(reason(with_field("tp", [](auto& pk) { pk.pack_double(-1.0); })).find("throughput") != std::string::npos);
  CHECK(reason(with_field("c", [](auto& pk) { pk.pack(-5); })).find("cache") != std::string::npos);
  CHECK(reason(with_field("n", [](auto& pk) { pk.pack(std::string()); })).find("node id") != std::string::npos);
  CHECK(reason(with_field("m", [](auto& pk) { pk.pack(std::string(300, 'm')); })) != "accepted");
  CHECK(reason(with_field("ttl", [](auto& pk) { pk.pack(10); })).find("ttl") != std::string::npos);
  CHECK(reason(with_field("ttl", [](auto& pk) { pk.pack(std::uint64_t{1} << 40); })) != "accepted");
  CHECK(reason(with_field("r", [](auto& pk) { pk.pack_map(1); pk.pack(std::string("peer")); pk.pack(std::string("fast")); })).find("'r'") != std::string::npos);
  CHECK(reason(with_field("r", [](auto& pk) { pk.pack_map(1); pk.pack(std::string("peer")); pk.pack_double(INFINITY); })).find("RTT") != std::string::npos);
  // Unknown keys are skipped (newer writers may add fields).
  CHECK(decode_record(bytes_of(with_field("pk", [](auto& pk) { pk.pack(std::string("key")); }))));
}

TEST_CASE("a record is fresh only within its ttl and a bounded clock skew") {
  const std::int64_t now = 1'700'000'000'000;
  auto r = stamped(make_record("m", "n", {0, 1}), 1, now - 1000, 2000);
  CHECK(is_fresh(r, now, 500));
  r.timestamp_ms = now - 2001;
  CHECK_FALSE(is_fresh(r, now, 500));
  r.timestamp_ms = now + 400;  // announcer's clock slightly ahead
  CHECK(is_fresh(r, now, 500));
  r.timestamp_ms = now + 600;
  CHECK_FALSE(is_fresh(r, now, 500));
}

TEST_CASE("the newest record per server wins, and spans merge one record per server and span") {
  auto a1 = stamped(make_record("m", "a", {0, 4}, member_state::joining), 10, 1000);
  auto a2 = stamped(make_record("m", "a", {0, 4}, member_state::online), 11, 900);  // seq decides, not clock
  auto b1 = stamped(make_record("m", "b", {2, 6}), 5, 1000);
  auto newest = newest_per_server({a1, b1, a2});
  REQUIRE(newest.size() == 2);
  CHECK(newest[0].node_id == "a");
  CHECK(newest[0].seq == 11);
  CHECK(newest[0].state == member_state::online);
  CHECK(newest[1].node_id == "b");

  // Block 2 has seen a's refresh, block 0 not yet: one record per span.
  auto a_moved = stamped(make_record("m", "a", {4, 8}, member_state::joining), 12, 1000);
  auto merged = merge_spans({{a1, b1}, {a2, b1}, {a_moved}});
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].node_id == "a");
  CHECK(merged[0].span == block_range{0, 4});
  CHECK(merged[0].seq == 11);
  CHECK(merged[1].span == block_range{4, 8});
  CHECK(merged[2].node_id == "b");
}

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
  auto r = make_record("tiny", "server-b", {2, 5}, member_state::online);
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
    CHECK(rs[0].state == member_state::online);
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
  auto r = make_record("tiny", "server-b", {0, 2}, member_state::joining);
  REQUIRE(!swarm[1].announce(r));
  wait_seen(swarm[2], "tiny", 0, "server-b", [](const server_record& x) { return x.state == member_state::joining; });
  const auto first_seq = swarm[2].get_block("tiny", 0).at(0).seq;

  r.state = member_state::online;
  r.throughput = 300;
  r.cache_tokens_left = 100;
  const auto t0 = steady::now();
  REQUIRE(!swarm[1].update(r));
  for (int b : {0, 1})
    wait_seen(swarm[2], "tiny", b, "server-b", [](const server_record& x) {
      return x.state == member_state::online && x.throughput == 300 && x.cache_tokens_left == 100;
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

TEST_CASE("withdraw_offline is seen as OFFLINE at once and then expires") {
  dht_swarm swarm(2000ms);
  auto r = make_record("tiny", "server-b", {0, 3}, member_state::online);
  REQUIRE(!swarm[1].announce(r));
  wait_seen(swarm[2], "tiny", 0, "server-b", any_record);

  const auto t0 = steady::now();
  const auto acked = swarm[1].withdraw_offline();
  const double withdraw_ms = ms_since(t0);
  CHECK(acked >= 3);  // every block stored by at least one other node
  for (int b = 0; b < 3; ++b)
    wait_seen(swarm[2], "tiny", b, "server-b", [](const server_record& x) { return x.state == member_state::offline; },
              1000ms);
  MESSAGE("withdraw_offline returned after " << withdraw_ms << " ms; OFFLINE visible on another node after "
          << ms_since(t0) << " ms");
  // No longer refreshed: gone once the OFFLINE record is older than its TTL.
  const bool gone = eventually([&] { return swarm[2].get_block("tiny", 0).empty(); }, 2000ms + 1500ms);
  CHECK_MESSAGE(gone, "the OFFLINE record was still reported " << ms_since(t0) << " ms after withdraw");
  MESSAGE("OFFLINE record dropped by readers " << ms_since(t0) << " ms after withdraw (ttl 2000 ms)");
}

TEST_CASE("a crashed server disappears from reads within its ttl while live servers stay") {
  // The live server's refreshes are not delayed by the crash (acked within a
  // millisecond throughout), but a read whose search still holds the dead
  // node waits the whole query_timeout (1 s) for its answer, and freshness is
  // judged when the read returns: the newest copy it got can then be
  // refresh + 1 s old. A 4 s ttl makes that 2.3 s (1.7 s to spare on a
  // loaded machine; a 2 s ttl would leave 0.3 s).
  const auto ttl = 4000ms;
  dht_swarm swarm(ttl, 4);
  REQUIRE(!swarm[1].announce(make_record("tiny", "crashes", {0, 2})));
  REQUIRE(!swarm[3].announce(make_record("tiny", "survives", {0, 2})));
  wait_seen(swarm[2], "tiny", 0, "crashes", any_record);
  wait_seen(swarm[2], "tiny", 1, "survives", any_record);

  // Crash: the DHT node goes away without withdrawing (same as kill -9 for
  // everyone else: its records are simply no longer refreshed).
  const auto last_refresh_bound = find_node(swarm[2].get_block("tiny", 0), "crashes")->timestamp_ms;
  const auto t0 = steady::now();
  swarm.nodes[1].reset();
  const bool gone = eventually([&] { return !find_node(swarm[2].get_block("tiny", 0), "crashes"); }, ttl + 2000ms);
  const double gone_ms = ms_since(t0);
  REQUIRE_MESSAGE(gone, "the crashed server was still listed " << gone_ms << " ms after it died (ttl "
                                                              << ttl.count() << " ms)");
  CHECK(unix_ms_now() - last_refresh_bound <= ttl.count() + 1500);
  MESSAGE("crashed server dropped by readers " << gone_ms << " ms after the crash (ttl " << ttl.count()
          << " ms, refresh " << ttl.count() / 3 << " ms)");
  // The live server kept refreshing through more than one ttl.
  CHECK(find_node(swarm[0].get_block("tiny", 0), "survives"));
  CHECK(find_node(swarm[2].get_block("tiny", 1), "survives"));
}

TEST_CASE("a swarm's first node keeps reading and announcing when the first peer that contacted it crashes") {
  // OpenDHT runs no get/put/listen of a node that knows peers but has had no
  // answer from any, and the first node of a swarm probes the peers that
  // contacted it only once, 1 s after the first contact (then every 5-25 s).
  // Here the one peer it knows by then has crashed.
  dht_swarm swarm(3000ms, 2);
  swarm.nodes[1].reset();
  std::this_thread::sleep_for(1500ms);  // past the first node's one probe

  auto& late = swarm.add();  // joins through the first node
  REQUIRE(!late.announce(make_record("tiny", "late", {0, 1})));
  const double seen_ms = wait_seen(swarm[0], "tiny", 0, "late", any_record, 3000ms);
  REQUIRE(!swarm[0].announce(make_record("tiny", "first", {0, 1})));
  wait_seen(late, "tiny", 0, "first", any_record, 3000ms);
  MESSAGE("the first node read a new peer's record after " << seen_ms << " ms");
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

TEST_CASE("listen reports a joining server, its update and its disappearance after a crash") {
  const auto ttl = 2000ms;
  dht_swarm swarm(ttl);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<membership_event> events;
  auto id = swarm[0].listen("tiny", {0, 1}, [&](const membership_event& e) {
    std::lock_guard<std::mutex> lk(mu);
    events.push_back(e);
    cv.notify_all();
  });
  REQUIRE(id != 0);
  auto wait_events = [&](const std::function<bool(const membership_event&)>& match, std::size_t n,
                         std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, bound, [&] { return std::count_if(events.begin(), events.end(), match) >= static_cast<std::ptrdiff_t>(n); });
  };

  auto r = make_record("tiny", "server-b", {0, 2}, member_state::joining);
  auto t0 = steady::now();
  REQUIRE(!swarm[1].announce(r));
  REQUIRE_MESSAGE(wait_events([](const membership_event& e) { return !e.removed && e.record.state == member_state::joining; }, 2, 3000ms),
                  "no JOINING event for both blocks");
  MESSAGE("listen: JOINING reported after " << ms_since(t0) << " ms");

  r.state = member_state::online;
  t0 = steady::now();
  REQUIRE(!swarm[1].update(r));
  REQUIRE_MESSAGE(wait_events([](const membership_event& e) { return !e.removed && e.record.state == member_state::online; }, 2, 3000ms),
                  "no ONLINE event for both blocks");
  MESSAGE("listen: ONLINE reported after " << ms_since(t0) << " ms");
  {
    // Refreshes alone (same content) do not produce events.
    std::this_thread::sleep_for(ttl);
    std::lock_guard<std::mutex> lk(mu);
    CHECK(events.size() == 4);
  }

  t0 = steady::now();
  swarm.nodes[1].reset();
  REQUIRE_MESSAGE(wait_events([](const membership_event& e) { return e.removed; }, 2, ttl + 2000ms),
                  "the crashed server's removal was not reported within ttl + 2 s");
  MESSAGE("listen: crash reported " << ms_since(t0) << " ms after it happened");

  swarm[0].unlisten(id);
  std::size_t before;
  {
    std::lock_guard<std::mutex> lk(mu);
    before = events.size();
  }
  REQUIRE(!swarm[2].announce(make_record("tiny", "server-c", {0, 1})));
  wait_seen(swarm[0], "tiny", 0, "server-c", any_record);
  std::lock_guard<std::mutex> lk(mu);
  CHECK(events.size() == before);
}
