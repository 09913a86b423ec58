// Measuring a link with echoes (actors/link_probe.hpp): what a server whose
// NIC speed is unknown announces as its network side; and the control
// actor's reshape and partition, seen through such echoes.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "actors/corolla.hpp"
#include "actors/echo_actor.hpp"
#include "actors/link_probe.hpp"
#include "actors/node_control.hpp"

using namespace std::chrono_literals;

namespace corolla {
namespace {

std::unique_ptr<node> start_probe_node(node_options o = {}) {
  auto n = node::start(std::move(o));
  if (!n) FAIL(error_message(n.error()));
  return std::move(*n);
}

/// Whether an empty echo from `n` to `peer` comes back within `timeout`
/// (generous where it must: a loaded machine can stall an echo for seconds).
bool reaches(node& n, const std::string& peer, std::chrono::milliseconds timeout = 10000ms) {
  remote_message m;
  m.type = "echo";
  return static_cast<bool>(n.request(peer, echo_actor_name, std::move(m), timeout));
}

/// The rate the probe's payload echo shows (it crosses the link twice)
/// when only the link's own round trip `link_rtt_s` is subtracted: never
/// above the link's rate, however busy the machine.
double carried_bps(const link_probe_result& m, std::size_t bytes, double link_rtt_s) {
  return 16.0 * static_cast<double>(bytes) / (m.payload_s - link_rtt_s);
}

}  // namespace

TEST_CASE("a link probe measures a shaped link's bandwidth within its bounds") {
  auto a = start_probe_node();
  auto b = start_probe_node();
  connect_options co;
  co.link_profile = "bw=40Mbit,lat=1ms";  // b's sends, and a's replies to b, are shaped alike
  auto peer = b->connect(a->endpoint(), co);
  if (!peer) FAIL(error_message(peer.error()));
  link_probe_options o;
  o.bytes = 512 << 10;
  auto m = probe_link(*b, *peer, o);
  if (!m) FAIL(error_message(m.error()));
  MESSAGE("measured " << m->bps / 1e6 << " Mbit/s, round trip " << m->rtt_s * 1e3 << " ms, payload echo "
                      << m->payload_s * 1e3 << " ms");
  // The probe's figure subtracts the fastest empty echo, which a loaded
  // machine can stall too (the figure then reads high): the ceiling is
  // checked on the payload echo less the link's own round trip (2 ms),
  // which a loaded machine only makes slower.
  CHECK(carried_bps(*m, o.bytes, 0.002) <= 40e6 * 1.15);
  // The figure itself, when the empty echo was not stalled much (10 ms of
  // a 210 ms payload echo: 4 % at most).
  if (m->rtt_s < 0.010) CHECK(m->bps <= 40e6 * 1.15);
  CHECK(m->bps >= 40e6 * 0.3);
  CHECK(m->rtt_s >= 0.002);  // 1 ms each way
  CHECK(m->payload_s > m->rtt_s);
}

TEST_CASE("probing a node this one has no link to is an error, not a figure") {
  auto a = start_probe_node();
  auto m = probe_link(*a, "n-nobody");
  REQUIRE_FALSE(m);
  link_probe_options none;
  none.rounds = 0;
  CHECK_FALSE(probe_link(*a, a->id(), none));
}

TEST_CASE("a node's links reshaped at runtime carry the new rate, and the old one once healed") {
  node_options with_control;
  with_control.control_token = "local-harness-secret";
  auto a = start_probe_node(with_control);
  auto b = start_probe_node();
  auto peer = b->connect(a->endpoint());
  if (!peer) FAIL(error_message(peer.error()));
  link_probe_options o;
  o.bytes = 256 << 10;
  o.rounds = 4;  // the fastest of 4: a busy machine stalls some echoes
  // Unshaped loopback is far faster than the 20 Mbit/s below (or too fast
  // to tell at all). The bound is twice the throttled ceiling, not a
  // loopback speed: a loaded 2-core machine may take tens of ms per echo.
  const double unshaped_floor = 2 * 20e6 * 1.15;
  auto before = probe_link(*b, *peer, o);
  if (before) CHECK(before->bps > unshaped_floor);

  // b throttles its own sends; a is told to throttle its replies through its control actor.
  REQUIRE_FALSE(b->reshape_links("bw=20Mbit,lat=1ms"));
  REQUIRE_FALSE(request_reshape(*b, *peer, "local-harness-secret", "bw=20Mbit,lat=1ms"));
  auto throttled = probe_link(*b, *peer, o);
  if (!throttled) FAIL(error_message(throttled.error()));
  MESSAGE("throttled: " << throttled->bps / 1e6 << " Mbit/s");
  CHECK(carried_bps(*throttled, o.bytes, 0.002) <= 20e6 * 1.15);
  if (throttled->rtt_s < 0.010) CHECK(throttled->bps <= 20e6 * 1.15);
  CHECK(throttled->bps >= 20e6 * 0.3);
  CHECK(throttled->rtt_s >= 0.002);

  // Healed: back to the shaping each link was set up with (none).
  REQUIRE_FALSE(b->reshape_links(""));
  REQUIRE_FALSE(request_reshape(*b, *peer, "local-harness-secret", ""));
  auto healed = probe_link(*b, *peer, o);
  if (healed) CHECK(healed->bps > unshaped_floor);

  // A bad profile changes nothing and says why.
  CHECK(b->reshape_links("bw=fast"));
  CHECK(request_reshape(*b, *peer, "local-harness-secret", "lat=-1ms"));
}

TEST_CASE("a node's control actor obeys only its token, and a node without one has none") {
  node_options with_control;
  with_control.control_token = "local-harness-secret";
  auto a = start_probe_node(with_control);
  auto b = start_probe_node();
  auto c = start_probe_node();
  auto to_a = b->connect(a->endpoint());
  auto to_c = b->connect(c->endpoint());
  if (!to_a || !to_c) FAIL("cannot connect");
  const caf::error wrong = request_reshape(*b, *to_a, "guess", "bw=1Mbit");
  REQUIRE(wrong);
  CHECK(error_message(wrong).find("wrong control token") != std::string::npos);
  CHECK(request_reshape(*b, *to_c, "local-harness-secret", "bw=1Mbit"));  // c publishes no control actor
  // Nothing was reshaped: a's echo still comes back at loopback speed.
  link_probe_options o;
  o.bytes = 256 << 10;
  o.rounds = 4;
  if (auto m = probe_link(*b, *to_a, o)) CHECK(m->bps > 10 * 1e6);  // ten times the refused 1 Mbit/s
}

TEST_CASE("a partitioned node loses its traffic with its peers both ways, the harness keeps its link, a heal restores it") {
  node_options with_control;
  with_control.control_token = "local-harness-secret";
  auto a = start_probe_node(with_control);  // the node cut off
  auto b = start_probe_node();              // its peer
  auto h = start_probe_node();              // the harness
  auto b_to_a = b->connect(a->endpoint());
  auto h_to_a = h->connect(a->endpoint());
  if (!b_to_a || !h_to_a) FAIL("cannot connect");
  REQUIRE(reaches(*b, *b_to_a));  // echoes come back before

  CHECK(request_partition(*h, *h_to_a, "guess", true));  // only the token holder may
  CHECK(reaches(*b, *b_to_a));
  REQUIRE_FALSE(request_partition(*h, *h_to_a, "local-harness-secret", true));
  CHECK_FALSE(reaches(*b, *b_to_a, 1500ms));  // b -> a is lost
  CHECK_FALSE(reaches(*a, b->id(), 1500ms));  // and a -> b
  CHECK(reaches(*h, *h_to_a));        // the harness still reaches a

  REQUIRE_FALSE(request_partition(*h, *h_to_a, "local-harness-secret", false));
  // Healed: traffic flows again. Both links went down meanwhile (missed
  // heartbeats); a's heartbeats and b's hellos, once a second, bring them up.
  bool back = false;
  for (int i = 0; i < 60 && !back; ++i) {
    back = reaches(*b, *b_to_a, 1000ms);
    if (!back) std::this_thread::sleep_for(250ms);
  }
  CHECK(back);
  CHECK(reaches(*a, b->id()));
}

}  // namespace corolla
