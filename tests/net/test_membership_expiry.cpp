// tests/net/test_membership_expiry.cpp — the OpenDHT-backed membership
// over time: a withdrawn (OFFLINE) record and a crashed server's records
// expire within their ttl while live servers stay, a swarm's first node
// survives the crash of its first peer, and listen reports joins, updates
// and crashes; several DHT nodes in one process on 127.0.0.1 (port 0), each
// swarm on its own random network id, short TTLs so expiry is checked in
// seconds.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "net/membership.hpp"
#include "net/server_record.hpp"
#include "tests/net/membership_test_util.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::membership_test;
using namespace std::chrono_literals;

TEST_CASE("withdraw_offline is seen as OFFLINE at once and then expires") {
  dht_swarm swarm(2000ms);
  auto r = make_record("tiny", "server-b", {0, 3}, server_state::online);
  REQUIRE(!swarm[1].announce(r));
  wait_seen(swarm[2], "tiny", 0, "server-b", any_record);

  const auto t0 = steady::now();
  const auto acked = swarm[1].withdraw_offline();
  const double withdraw_ms = ms_since(t0);
  CHECK(acked >= 3);  // every block stored by at least one other node
  for (int b = 0; b < 3; ++b)
    wait_seen(swarm[2], "tiny", b, "server-b", [](const server_record& x) { return x.state == server_state::offline; },
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

  auto r = make_record("tiny", "server-b", {0, 2}, server_state::joining);
  auto t0 = steady::now();
  REQUIRE(!swarm[1].announce(r));
  REQUIRE_MESSAGE(wait_events([](const membership_event& e) { return !e.removed && e.record.state == server_state::joining; }, 2, 3000ms),
                  "no JOINING event for both blocks");
  MESSAGE("listen: JOINING reported after " << ms_since(t0) << " ms");

  r.state = server_state::online;
  t0 = steady::now();
  REQUIRE(!swarm[1].update(r));
  REQUIRE_MESSAGE(wait_events([](const membership_event& e) { return !e.removed && e.record.state == server_state::online; }, 2, 3000ms),
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
