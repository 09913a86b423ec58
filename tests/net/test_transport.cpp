// tests/net/test_transport.cpp — the ZeroMQ transport in one process: two or
// three transports on 127.0.0.1 (port 0), raw ZeroMQ peers for bad input.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include <doctest/doctest.h>
#include <zmq.hpp>
#include <spdlog/spdlog.h>

#include "net/codec.hpp"
#include "net/log_limit.hpp"
#include "net/zmq_transport.hpp"
#include "transport_recorder.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::testing;

namespace {

/// Bytes of `m` on the wire (envelope and tensor frames), as the shaper counts them.
std::size_t wire_bytes(const message& m) {
  std::size_t n = 0;
  for (const auto& f : encode(m)) n += f.size;
  return n;
}

/// A raw ZeroMQ DEALER (its own context) for sending what no transport would.
struct raw_dealer {
  zmq::context_t ctx;
  zmq::socket_t socket{ctx, zmq::socket_type::dealer};
  explicit raw_dealer(const std::string& endpoint, const std::string& routing_id) {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::routing_id, routing_id);
    socket.connect(endpoint);
  }
  void send(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
};

double ms(shaping_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// Sends with retries while the transport's queue is full (send() == false
/// on an open connection is back-pressure).
void send_with_retry(zmq_transport& t, connection_id c, const message& m) {
  const auto deadline = shaping_clock::now() + 5s;
  while (!t.send(c, m)) {
    REQUIRE_MESSAGE(shaping_clock::now() < deadline, "send() kept failing for 5 s");
    std::this_thread::sleep_for(100us);
  }
}

}  // namespace

TEST_CASE("a request and its response carry body and tensors both ways") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("node-a"), ra);
  auto b = start_transport(loopback_options("node-b"), rb);
  REQUIRE(b->endpoint().rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(b->endpoint() != "tcp://127.0.0.1:0");

  const connection_id to_b = a->connect(b->endpoint());
  std::vector<float> values(12);
  std::iota(values.begin(), values.end(), 0.5f);
  const std::vector<std::int32_t> ids = {7, -3, 1 << 30, 0, 42};
  auto request = make_message(message_kind::request, 17,
                              {Tensor::from_f32(values, {3, 4}), Tensor::from_i32(ids, {5})});
  request.sent_at_ns = 123456789;
  REQUIRE(a->send(to_b, request));

  REQUIRE_MESSAGE(rb.wait_messages(1), "node b received nothing");
  connection_id from_a;
  {
    std::lock_guard<std::mutex> lock(rb.mu);
    REQUIRE(rb.accepted.size() == 1);
    CHECK(rb.accepted[0].second == "node-a");
    from_a = rb.messages[0].conn;
    CHECK(from_a == rb.accepted[0].first);
    const message& got = rb.messages[0].msg;
    CHECK(got.kind == message_kind::request);
    CHECK(got.correlation_id == 17);
    CHECK(got.body == request.body);
    CHECK(got.sent_at_ns == 123456789);
    REQUIRE(got.tensors.size() == 2);
    CHECK(got.tensors[0].shape() == shape_t{3, 4});
    CHECK(got.tensors[0].to_vector() == values);
    CHECK(got.tensors[1].type() == dtype::i32);
    CHECK(std::memcmp(got.tensors[1].raw(), ids.data(), ids.size() * 4) == 0);
  }

  // The reply goes back through b's ROUTER to a's DEALER connection.
  auto response = make_message(message_kind::response, 17, {Tensor::from_f32(values, {12})});
  REQUIRE(b->send(from_a, response));
  REQUIRE_MESSAGE(ra.wait_messages(1), "node a received no response");
  std::lock_guard<std::mutex> lock(ra.mu);
  CHECK(ra.messages[0].conn == to_b);
  CHECK(ra.messages[0].msg.kind == message_kind::response);
  CHECK(ra.messages[0].msg.tensors.at(0).to_vector() == values);
  CHECK(ra.accepted.empty());
  CHECK(a->stats().messages_sent == 1);
  CHECK(a->stats().messages_received == 1);
  CHECK(b->stats().bytes_received == wire_bytes(request));
}

TEST_CASE("a 256 MB tensor arrives bit-exact") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("big-a"), ra);
  auto b = start_transport(loopback_options("big-b"), rb);
  const connection_id to_b = a->connect(b->endpoint());

  const std::int64_t n = (std::int64_t{256} << 20) / 4;
  Tensor t = Tensor::empty({n}, dtype::i32);
  auto* p = t.data<std::int32_t>();
  std::uint32_t x = 0x9e3779b9u;
  for (std::int64_t i = 0; i < n; ++i) {  // xorshift: every byte matters
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = static_cast<std::int32_t>(x);
  }
  const std::uint64_t sum = frame_checksum(t.raw(), t.nbytes());
  const auto start = shaping_clock::now();
  REQUIRE(a->send(to_b, make_message(message_kind::oneway, 1, {t})));
  t = Tensor();  // the transport keeps the storage alive until sent
  REQUIRE_MESSAGE(rb.wait_messages(1, 20s), "the 256 MB message did not arrive");
  std::lock_guard<std::mutex> lock(rb.mu);
  const Tensor& got = rb.messages[0].msg.tensors.at(0);
  MESSAGE("256 MB delivered in " << ms(rb.messages[0].at - start) << " ms");
  REQUIRE(got.nbytes() == std::size_t{256} << 20);
  CHECK(frame_checksum(got.raw(), got.nbytes()) == sum);
}

TEST_CASE("many small messages arrive complete and in order") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("many-a"), ra);
  auto b = start_transport(loopback_options("many-b"), rb);
  const connection_id to_b = a->connect(b->endpoint());
  constexpr int count = 20000;
  for (int i = 0; i < count; ++i) send_with_retry(*a, to_b, make_message(message_kind::oneway, i + 1));
  REQUIRE_MESSAGE(rb.wait_messages(count, 20s), "not every message arrived");
  std::lock_guard<std::mutex> lock(rb.mu);
  bool in_order = true;
  for (int i = 0; i < count; ++i) in_order = in_order && rb.messages[i].msg.correlation_id == std::uint64_t(i + 1);
  CHECK(in_order);
  CHECK(rb.bad.empty());
}

TEST_CASE("garbage frames are reported as bad messages and other peers keep working") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("good"), ra);
  auto b = start_transport(loopback_options("server"), rb);
  raw_dealer raw(b->endpoint(), "garbage");
  raw.send({"this is not a capnp envelope"});
  raw.send({std::string(64, '\xff'), "tensor?"});
  raw.send({""});
  raw.send(std::vector<std::string>(200, "x"));  // far more frames than tensors allowed
  REQUIRE_MESSAGE(rb.wait_for([&] { return rb.bad.size() >= 4; }), "bad messages were not all reported");
  const connection_id to_b = a->connect(b->endpoint());
  REQUIRE(a->send(to_b, make_message(message_kind::oneway, 5)));
  REQUIRE_MESSAGE(rb.wait_messages(1), "the good peer's message did not arrive");
  std::lock_guard<std::mutex> lock(rb.mu);
  CHECK(rb.messages[0].msg.correlation_id == 5);
  CHECK(rb.accepted.size() == 2);
  for (const auto& [conn, reason] : rb.bad) {
    CHECK(conn == rb.accepted[0].first);
    CHECK(!reason.empty());
    MESSAGE("bad message reason: " << reason);
  }
  CHECK(b->stats().bad_messages == 4);
}

TEST_CASE("an oversize frame disconnects only the peer that sent it") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("small"), ra);
  auto options = loopback_options("limited");
  options.max_frame_bytes = 64 * 1024;
  auto b = start_transport(options, rb);
  raw_dealer raw(b->endpoint(), "flooder");
  raw.send({"hello"});  // b learns this peer (a bad message, but a known routing id)
  REQUIRE(rb.wait_for([&] { return rb.bad.size() == 1; }));
  raw.send({std::string(1 << 20, 'z')});
  REQUIRE_MESSAGE(rb.wait_for([&] { return rb.disconnects.size() == 1; }),
                  "the peer that sent an oversize frame was not disconnected");
  const connection_id to_b = a->connect(b->endpoint());
  REQUIRE(a->send(to_b, make_message(message_kind::oneway, 9, {Tensor::zeros({1000})})));
  REQUIRE_MESSAGE(rb.wait_messages(1), "the other peer's message did not arrive");
  std::lock_guard<std::mutex> lock(rb.mu);
  CHECK(rb.messages[0].msg.correlation_id == 9);
  CHECK(rb.disconnects[0] == rb.accepted[0].first);
  CHECK(rb.messages[0].conn != rb.disconnects[0]);
}

TEST_CASE("sends to an unknown or closed connection return false") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("closer"), ra);
  auto b = start_transport(loopback_options("target"), rb);
  CHECK_FALSE(a->send(987654, make_message(message_kind::oneway, 1)));
  const connection_id c = a->connect(b->endpoint());
  REQUIRE(a->send(c, make_message(message_kind::oneway, 1)));
  REQUIRE(rb.wait_messages(1));
  a->close(c);
  CHECK_FALSE(a->send(c, make_message(message_kind::oneway, 2)));
  a->close(c);  // closing twice is harmless
  a->set_profile(c, parse_link_profile("wan"));
  // The id is never reused.
  const connection_id d = a->connect(b->endpoint());
  CHECK(d != c);
  CHECK(a->send(d, make_message(message_kind::oneway, 3)));
  REQUIRE(rb.wait_messages(2));
}

TEST_CASE("a close with a drain time delivers what was queued, even when the transport is destroyed next") {
  transport_recorder ra, rb;
  auto b = start_transport(loopback_options("drain-b"), rb);
  // 8 Mbit/s: twenty 64 KiB messages take about 1.3 s, so nearly all of
  // them still wait in the transport's queue when close() is called.
  const message m = make_message(message_kind::oneway, 0, {Tensor::zeros({64 << 8})});
  constexpr std::size_t count = 20;
  auto send_all = [&](zmq_transport& t, connection_id c) {
    t.set_profile(c, parse_link_profile("bw=8Mbit"));
    for (std::size_t i = 0; i < count; ++i) REQUIRE(t.send(c, m));
  };
  {
    auto a = start_transport(loopback_options("drain-a"), ra);
    const connection_id c = a->connect(b->endpoint());
    send_all(*a, c);
    a->close(c, 10s);
    CHECK_FALSE(a->send(c, m));  // closing: nothing new is taken
  }  // destroyed at once: it waits for the drain
  CHECK(rb.wait_messages(count, 10s));
  {
    auto a = start_transport(loopback_options("drop-a"), ra);
    const connection_id c = a->connect(b->endpoint());
    send_all(*a, c);
    a->close(c);  // no drain time: what waits is dropped
  }
  std::this_thread::sleep_for(300ms);
  std::lock_guard<std::mutex> lock(rb.mu);
  CHECK(rb.messages.size() < 2 * count);
}

TEST_CASE("the last owner may let go of a transport from its own event handler") {
  // A node's relay holds the transport while it forwards; when the node
  // stops meanwhile, that reference is the last and it is dropped on the
  // I/O thread, which cannot join itself (was: std::system_error, EDEADLK).
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("owner-a"), ra);
  std::shared_ptr<zmq_transport> b = start_transport(loopback_options("owner-b"), rb);
  std::weak_ptr<zmq_transport> watch = b;
  std::shared_ptr<zmq_transport> held = b;  // the handler's reference
  std::atomic<bool> released{false};
  rb.on_message_hook = [&](connection_id, const message&) {
    if (held) {
      b.reset();     // the owner lets go first ...
      held.reset();  // ... so this is the last reference, on the I/O thread
      released = true;
    }
  };
  const connection_id a_to_b = a->connect(watch.lock()->endpoint());
  REQUIRE(a->send(a_to_b, make_message(message_kind::oneway, 1)));
  REQUIRE(rb.wait_messages(1));
  CHECK(released.load());
  CHECK(watch.expired());
  // The transport does stop: its peer hears that it is gone.
  CHECK_MESSAGE(ra.wait_for([&] { return transport_recorder::contains(ra.disconnects, a_to_b); }, 5000ms),
                "the transport released on its I/O thread never closed its sockets");
}

TEST_CASE("a destroyed peer is reported as disconnected on both kinds of connection") {
  transport_recorder ra, rb, rc;
  auto a = start_transport(loopback_options("survivor"), ra);
  auto b = start_transport(loopback_options("listener"), rb);
  auto c = start_transport(loopback_options("dialer"), rc);
  const connection_id a_to_b = a->connect(b->endpoint());
  REQUIRE_MESSAGE(ra.wait_for([&] { return transport_recorder::contains(ra.connects, a_to_b); }),
                  "a never connected to b");
  const connection_id c_to_a = c->connect(a->endpoint());
  REQUIRE(c->send(c_to_a, make_message(message_kind::oneway, 1)));
  REQUIRE(ra.wait_messages(1));
  connection_id from_c;
  {
    std::lock_guard<std::mutex> lock(ra.mu);
    from_c = ra.messages[0].conn;
  }

  // The peer a connected to goes away: a's DEALER reports it.
  auto t0 = shaping_clock::now();
  b.reset();
  REQUIRE_MESSAGE(ra.wait_for([&] { return transport_recorder::contains(ra.disconnects, a_to_b); }, 2000ms),
                  "a did not notice within 2 s that b is gone");
  MESSAGE("outgoing connection: disconnect seen after " << ms(shaping_clock::now() - t0) << " ms");

  // A peer that connected to a goes away: a's ROUTER side reports it.
  t0 = shaping_clock::now();
  c.reset();
  REQUIRE_MESSAGE(ra.wait_for([&] { return transport_recorder::contains(ra.disconnects, from_c); }, 2000ms),
                  "a did not notice within 2 s that c is gone");
  MESSAGE("incoming connection: disconnect seen after " << ms(shaping_clock::now() - t0) << " ms");
  CHECK_FALSE(a->send(from_c, make_message(message_kind::oneway, 2)));  // the peer is gone
}

TEST_CASE("a restarted peer with the same identity reconnects and traffic resumes") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("steady"), ra);
  auto b = start_transport(loopback_options("phoenix"), rb);
  const std::string b_endpoint = b->endpoint();
  const connection_id a_to_b = a->connect(b_endpoint);
  REQUIRE(a->send(a_to_b, make_message(message_kind::request, 1)));
  REQUIRE(rb.wait_messages(1));
  REQUIRE(ra.wait_for([&] { return ra.connects.size() == 1; }));

  SUBCASE("the listening side restarts") {
    b.reset();
    REQUIRE(ra.wait_for([&] { return ra.disconnects.size() == 1; }));
    transport_recorder rb2;
    auto options = loopback_options("phoenix");
    options.listen = b_endpoint;  // the same port again
    auto b2 = start_transport(options, rb2);
    REQUIRE_MESSAGE(ra.wait_for([&] { return ra.connects.size() == 2; }), "a did not reconnect to the new b");
    REQUIRE(a->send(a_to_b, make_message(message_kind::request, 2)));
    REQUIRE_MESSAGE(rb2.wait_for([&] {
      return std::any_of(rb2.messages.begin(), rb2.messages.end(),
                         [](const auto& r) { return r.msg.correlation_id == 2; });
    }), "the restarted b did not receive a's request");
    connection_id from_a;
    {
      std::lock_guard<std::mutex> lock(rb2.mu);
      from_a = rb2.messages.back().conn;
    }
    REQUIRE(b2->send(from_a, make_message(message_kind::response, 2)));
    REQUIRE_MESSAGE(ra.wait_messages(1), "a got no response from the restarted b");
    CHECK(ra.messages[0].conn == a_to_b);
  }

  SUBCASE("the connecting side restarts") {
    const connection_id from_a = rb.messages[0].conn;
    a.reset();
    REQUIRE(rb.wait_for([&] { return rb.disconnects.size() == 1; }));
    CHECK(rb.disconnects[0] == from_a);
    transport_recorder ra2;
    auto a2 = start_transport(loopback_options("steady"), ra2);
    const connection_id a2_to_b = a2->connect(b_endpoint);
    REQUIRE(a2->send(a2_to_b, make_message(message_kind::request, 3)));
    REQUIRE_MESSAGE(rb.wait_messages(2), "b did not receive the restarted a's request");
    {
      std::lock_guard<std::mutex> lock(rb.mu);
      // Same routing id: the same connection, reported as back.
      CHECK(rb.messages[1].conn == from_a);
      CHECK(transport_recorder::contains(rb.connects, from_a));
      CHECK(rb.accepted.size() == 1);
    }
    REQUIRE(b->send(from_a, make_message(message_kind::response, 3)));
    REQUIRE_MESSAGE(ra2.wait_messages(1), "the restarted a got no response");
    CHECK(ra2.messages[0].msg.correlation_id == 3);
  }
}

TEST_CASE("a shaped link meets the bandwidth and latency of its profile") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("shaped-a"), ra);
  auto b = start_transport(loopback_options("shaped-b"), rb);
  const connection_id to_b = a->connect(b->endpoint());
  const message m = make_message(message_kind::oneway, 0, {Tensor::zeros({(1 << 20) / 4})});  // 1 MiB
  const double bytes = static_cast<double>(wire_bytes(m));

  // One message at a time; the delay from send() to arrival.
  auto one_way = [&](int samples) {
    std::vector<double> d;
    for (int i = 0; i < samples; ++i) {
      std::size_t before;
      {
        std::lock_guard<std::mutex> lock(rb.mu);
        before = rb.messages.size();
      }
      const auto t0 = shaping_clock::now();
      REQUIRE(a->send(to_b, m));
      REQUIRE_MESSAGE(rb.wait_messages(before + 1), "a 1 MiB message did not arrive");
      std::lock_guard<std::mutex> lock(rb.mu);
      d.push_back(ms(rb.messages[before].at - t0));
    }
    // Scheduling noise on a loaded machine only ever adds delay: the
    // fastest sample is the one closest to what the link itself costs.
    return *std::min_element(d.begin(), d.end());
  };
  one_way(2);  // warm up: connection, allocator
  const double baseline_ms = one_way(7);

  const link_profile profile = parse_link_profile("bw=200Mbit,lat=10ms");
  a->set_profile(to_b, profile);
  const double tx_ms = bytes * 8 / profile.bandwidth_bps * 1e3;
  const double shaped_ms = one_way(7);
  const double added_ms = shaped_ms - baseline_ms;
  const double expected_ms = profile.latency_s * 1e3 + tx_ms;
  MESSAGE("1 MiB one-way: unshaped " << baseline_ms << " ms, shaped " << shaped_ms << " ms, added " << added_ms
                                     << " ms, profile " << expected_ms << " ms (10 ms + " << tx_ms << " ms transmission)");
  // Never faster than the link; no slower than the link plus what the
  // unshaped path itself costs, give or take a late timer (a busy machine
  // inflates that baseline, so it bounds from above only; 5 ms is half the
  // latency, which a shaper counting it twice would add).
  CHECK(shaped_ms >= expected_ms - 1.0);
  CHECK(shaped_ms <= expected_ms + baseline_ms + 5.0);

  // Back-to-back messages: the link's bandwidth between first and last arrival.
  constexpr int burst = 10;
  std::size_t before;
  {
    std::lock_guard<std::mutex> lock(rb.mu);
    before = rb.messages.size();
  }
  // Measured from the first send() to the last arrival, less the latency:
  // a late sender or receiver only ever makes the burst look slower, so
  // the upper bound is tight and the floor loose. (Between the first and
  // the last arrival instead, a late first arrival would make it look
  // faster.)
  const auto t0 = shaping_clock::now();
  for (int i = 0; i < burst; ++i) REQUIRE(a->send(to_b, m));
  REQUIRE_MESSAGE(rb.wait_messages(before + burst, 30s), "the burst did not arrive");
  std::lock_guard<std::mutex> lock(rb.mu);
  const double span_s = ms(rb.messages[before + burst - 1].at - t0) / 1e3 - profile.latency_s;
  const double achieved_bps = burst * bytes * 8 / span_s;
  MESSAGE("burst of " << burst << " x 1 MiB: " << achieved_bps / 1e6 << " Mbit/s (profile 200 Mbit/s)");
  CHECK(achieved_bps <= 1.03 * profile.bandwidth_bps);
  CHECK(achieved_bps >= 0.6 * profile.bandwidth_bps);
}

TEST_CASE("a transport that cannot bind, has bad keys or a busy-poll time out of range does not start") {
  transport_recorder r1, r2;
  auto first = start_transport(loopback_options("first"), r1);
  auto options = loopback_options("second");
  options.listen = first->endpoint();
  auto second = zmq_transport::start(options, r2.events());
  REQUIRE_FALSE(second);
  CHECK(error_text(second.error()).find(first->endpoint()) != std::string::npos);

  auto bad_curve = loopback_options("curvy");
  bad_curve.curve.enabled = true;
  bad_curve.curve.public_key = "not a key";
  auto third = zmq_transport::start(bad_curve, r2.events());
  REQUIRE_FALSE(third);
  CHECK(error_text(third.error()).find("public key") != std::string::npos);

  for (int busy : {-1, 1000001}) {
    auto spinning = loopback_options("spinning");
    spinning.busy_poll_us = busy;
    auto fourth = zmq_transport::start(spinning, r2.events());
    REQUIRE_FALSE(fourth);
    CHECK(error_text(fourth.error()).find("busy_poll_us must be between 0 and 1000000") != std::string::npos);
  }
}

TEST_CASE("repeated log lines are capped per source, and the next one says how many were held back") {
  using clock = std::chrono::steady_clock;
  corolla::net::log_limiter limit(3, std::chrono::milliseconds(1000));
  const auto t0 = clock::now();
  int shown = 0;
  for (int i = 0; i < 100; ++i)
    if (limit.allow(t0 + std::chrono::milliseconds(i))) ++shown;
  CHECK(shown == 3);
  CHECK(limit.suppressed() == 97);
  // A new window lets lines through again; the first says what was lost.
  REQUIRE(limit.allow(t0 + std::chrono::milliseconds(1500)));
  CHECK(limit.note() == " (97 similar lines suppressed)");
  CHECK(limit.note().empty());
}
