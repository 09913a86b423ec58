// Two nodes in one process, peer failure notifications over real ZeroMQ on
// 127.0.0.1: a stopped node and a silent peer are reported down within the
// bound (and a silent peer up again when it speaks).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

#include "actors/corolla.hpp"
#include "net/zmq_transport.hpp"
#include "tests/actors/node_test_util.hpp"
#include "tests/actors/raw_peer.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace node_test;

TEST_CASE("a stopped node is reported down to subscribers within the bound") {
  auto a = start_node(fast_options());
  auto b = start_node(fast_options());
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  caf::scoped_actor watcher{a->system()};
  a->monitor_peer("", caf::actor_cast<caf::actor>(watcher));
  const auto t0 = std::chrono::steady_clock::now();
  b->stop();
  bool down = false;
  watcher->receive(
      [&](peer_down& d) {
        down = true;
        CHECK(d.peer == *peer);
        MESSAGE("peer_down after " << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
                                   << " ms: " << d.reason);
      },
      caf::after(10s) >> [] {});
  CHECK_MESSAGE(down, "no peer_down within 10 s of stopping the peer");
  CHECK_FALSE(a->peer_is_up(*peer));
  // Requests to a down peer fail at once.
  auto reply = a->request(*peer, "echo", remote_message{}, 2s);
  REQUIRE_FALSE(reply);
  CHECK(error_code(reply.error()) == "peer_down");
}

TEST_CASE("a peer that goes silent is reported down after the peer timeout and up when it speaks again") {
  auto n = start_node(fast_options());  // 50 ms heartbeats, down after 300 ms
  testing::raw_peer raw("n-quiet", "tcp://127.0.0.1:0");
  // Watched by id before the link exists: a stall of this thread after the
  // handshake must not let the report go by unseen.
  caf::scoped_actor watcher{n->system()};
  n->monitor_peer("n-quiet", caf::actor_cast<caf::actor>(watcher));
  // The peer's last word is its hello_ack, sent at `acked` (before t1).
  std::chrono::steady_clock::time_point acked{};
  std::thread answer([&] {
    auto hello = raw.wait_for(net::message_kind::hello, 5s);
    acked = std::chrono::steady_clock::now();
    if (hello) raw.transport().send(hello->first, raw.hello(net::message_kind::hello_ack, net::protocol_version));
  });
  auto peer = n->connect(raw.transport().endpoint());
  const auto t1 = std::chrono::steady_clock::now();
  answer.join();
  REQUIRE_MESSAGE(peer, error_message(peer));
  CHECK(*peer == "n-quiet");
  // Its link came up (told to the watcher first) ...
  bool came_up = false;
  watcher->receive([&](peer_up& u) { came_up = u.peer == "n-quiet"; }, caf::after(30s) >> [] {});
  CHECK(came_up);
  // ... and the raw peer never answers heartbeats.
  std::string reason;
  watcher->receive([&](peer_down& d) { reason = d.reason; }, caf::after(30s) >> [] {});
  const auto at = std::chrono::steady_clock::now();
  REQUIRE_MESSAGE(!reason.empty(), "no peer_down within 30 s");
  const double since_ack_ms = std::chrono::duration<double, std::milli>(at - acked).count();
  MESSAGE("silent peer reported down " << std::chrono::duration<double, std::milli>(at - t1).count()
                                       << " ms after the handshake: " << reason);
  // Not before the timeout (give or take a heartbeat's check); when, on a
  // busy machine, only bounded loosely (the 300 ms are a floor, not a promise).
  CHECK(since_ack_ms >= 250);
  CHECK(at - t1 < 10s);
  // Any traffic brings it back.
  auto hb = raw.wait_for(net::message_kind::hello, 30s);  // the node re-introduces itself
  REQUIRE(hb);
  net::message beat;
  beat.kind = net::message_kind::heartbeat;
  beat.sender_node = "n-quiet";
  raw.transport().send(hb->first, beat);
  bool up = false;
  watcher->receive([&](peer_up& u) { up = u.peer == "n-quiet"; }, caf::after(30s) >> [] {});
  CHECK_MESSAGE(up, "no peer_up after the peer spoke again");
}

}  // namespace corolla
