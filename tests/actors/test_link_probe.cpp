// Measuring a link with echoes (actors/link_probe.hpp): what a server whose
// NIC speed is unknown announces as its network side.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include "actors/corolla.hpp"
#include "actors/link_probe.hpp"

using namespace std::chrono_literals;

namespace corolla {
namespace {

std::unique_ptr<node> start_probe_node() {
  auto n = node::start(node_options{});
  if (!n) FAIL(error_message(n.error()));
  return std::move(*n);
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
  // A loaded machine only makes the link look slower, never faster.
  CHECK(m->bps <= 40e6 * 1.15);
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

}  // namespace corolla
