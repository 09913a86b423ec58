// Two nodes in one process: remote requests and one-way messages, their
// errors (unknown actors, error codes, timeouts, tensors that cannot travel,
// messages over the peer's size limit) and publishing names, over real
// ZeroMQ on 127.0.0.1. The handshake is in test_node_handshake.cpp, peer
// failure notifications in test_node_failures.cpp, link statistics and
// transports in test_node_links.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "actors/corolla.hpp"
#include "net/zmq_transport.hpp"
#include "tests/actors/doubler.hpp"
#include "tests/actors/node_test_util.hpp"
#include "tests/support/eventually.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace node_test;

namespace {

using testing::doubler;

/// Never answers (requests to it time out).
caf::behavior black_hole(caf::event_based_actor* self) {
  return {
      [self](remote_message&) {
        self->make_response_promise();  // answered never
      },
  };
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && a.type() == b.type() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("a remote request carries tensors both ways and is answered bit-exact") {
  auto a = start_node();
  auto b = start_node();
  REQUIRE_FALSE(b->publish("doubler", b->system().spawn(doubler)));

  auto peer = a->connect(b->endpoint());
  REQUIRE_MESSAGE(peer, error_message(peer));
  CHECK(*peer == b->id());

  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 7.0f;
  const std::vector<std::int32_t> ids = {3, -1, 2147483647, 0};
  remote_message m;
  m.type = "double";
  m.tensors = {Tensor::from_f32(values, {10, 100}), Tensor::from_i32(ids, {2, 2})};
  auto reply = a->request(b->id(), "doubler", m, 5s);
  REQUIRE_MESSAGE(reply, error_message(reply));
  CHECK(reply->type == "doubled");
  CHECK(reply->from_node == b->id());
  CHECK(std::string(reply->body.begin(), reply->body.end()) == a->id());  // the doubler saw who asked
  REQUIRE(reply->tensors.size() == 2);
  CHECK(reply->tensors[0].shape() == shape_t{10, 100});
  const float* got = reply->tensors[0].data<float>();
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(got[i] == 2 * values[i]);
  CHECK(same_bytes(reply->tensors[1], m.tensors[1]));

  // The built-in echo, through a proxy used like a local actor.
  auto echo = a->remote_actor(b->id(), "echo");
  REQUIRE(echo);
  caf::scoped_actor self{a->system()};
  remote_message e;
  e.type = "echo";
  e.body = {1, 2, 3};
  e.tensors = {Tensor::from_f32(values, {1000})};
  bool answered = false;
  self->request(*echo, 5s, e).receive(
      [&](remote_message& r) {
        answered = true;
        CHECK(r.body == e.body);
        REQUIRE(r.tensors.size() == 1);
        CHECK(same_bytes(r.tensors[0], e.tensors[0]));
      },
      [&](caf::error& err) { FAIL("echo failed: " << error_message(err)); });
  CHECK(answered);
}

TEST_CASE("a request to an actor the peer does not have gets an unknown_actor error") {
  auto a = start_node();
  auto b = start_node();
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  remote_message m;
  m.type = "hello";
  auto reply = a->request(*peer, "nobody-here", m, 5s);
  REQUIRE_FALSE(reply);
  CHECK(error_code(reply.error()) == "unknown_actor");
  CHECK(error_message(reply.error()).find("nobody-here") != std::string::npos);

  // The link keeps serving afterwards.
  m.type = "echo";
  auto echoed = a->request(*peer, "echo", m, 5s);
  CHECK_MESSAGE(echoed, error_message(echoed));
}

TEST_CASE("errors of a remote actor keep their code across the wire") {
  auto a = start_node();
  auto b = start_node();
  REQUIRE_FALSE(b->publish("doubler", b->system().spawn(doubler)));
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  auto reply = a->request(*peer, "doubler", remote_message{}, 5s);
  REQUIRE_FALSE(reply);
  CHECK(error_code(reply.error()) == "invalid_argument");
  CHECK(error_message(reply.error()) == "doubler needs a tensor");

  remote_message wrong;
  wrong.type = "not-echo";
  auto bad = a->request(*peer, "echo", wrong, 5s);
  REQUIRE_FALSE(bad);
  CHECK(error_code(bad.error()) == "bad_message");
}

TEST_CASE("a request the remote actor never answers runs into the CAF timeout") {
  auto a = start_node();
  auto b = start_node();
  REQUIRE_FALSE(b->publish("hole", b->system().spawn(black_hole)));
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  const auto t0 = std::chrono::steady_clock::now();
  auto reply = a->request(*peer, "hole", remote_message{}, 300ms);
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(reply);
  CHECK(error_code(reply.error()) == "request_timeout");
  CHECK(waited >= 250ms);
  CHECK(waited < 3s);
}

TEST_CASE("a one-way send to a remote actor is delivered with the sender's node") {
  auto a = start_node();
  auto b = start_node();
  caf::scoped_actor inbox{b->system()};
  // A forwarder on b hands what it receives to the test's scoped actor.
  auto sink = caf::actor_cast<caf::actor>(inbox);
  auto forwarder = b->system().spawn([sink](caf::event_based_actor* self) -> caf::behavior {
    return {[self, sink](remote_message& m) { self->send(sink, std::move(m)); }};
  });
  REQUIRE_FALSE(b->publish("inbox", forwarder));
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  auto target = a->remote_actor(*peer, "inbox");
  REQUIRE(target);
  remote_message m;
  m.type = "note";
  m.body = {42};
  caf::anon_send(*target, m);
  bool got = false;
  inbox->receive(
      [&](remote_message& r) {
        got = true;
        CHECK(r.type == "note");
        CHECK(r.body == std::vector<std::uint8_t>{42});
        CHECK(r.from_node == a->id());
      },
      caf::after(5s) >> [] {});
  CHECK_MESSAGE(got, "the one-way message did not arrive within 5 s");
  caf::anon_send_exit(forwarder, caf::exit_reason::user_shutdown);
}

TEST_CASE("one-way messages sent before a node stops all arrive before its goodbye") {
  auto b = start_node();
  std::atomic<int> received{0};
  auto counter = b->system().spawn([&received](caf::event_based_actor*) -> caf::behavior {
    return {[&received](remote_message&) { ++received; }};
  });
  REQUIRE_FALSE(b->publish("count", counter));
  for (int round = 0; round < 3; ++round) {
    received = 0;
    auto a = start_node();
    auto peer = a->connect(b->endpoint());
    REQUIRE(peer);
    auto target = a->remote_actor(*peer, "count");
    REQUIRE(target);
    constexpr int n = 500;
    for (int i = 0; i < n; ++i) {
      remote_message m;
      m.type = "tick";
      m.tensors.push_back(Tensor::zeros({256}));
      caf::anon_send(*target, std::move(m));
    }
    a->stop();  // the proxy hands all 500 to the link before the goodbye
    testing::eventually([&] { return received >= n; }, 20s, 5ms);
    CHECK(received == n);
  }
  caf::anon_send_exit(counter, caf::exit_reason::user_shutdown);
}

TEST_CASE("publishing a taken name is refused and remote_actor needs a link") {
  auto a = start_node();
  auto first = a->system().spawn(doubler);
  auto second = a->system().spawn(doubler);
  CHECK_FALSE(a->publish("twice", first));
  auto err = a->publish("twice", second);
  CHECK(error_code(err) == "already_published");
  CHECK(error_code(a->publish("", first)) == "invalid_argument");
  auto nowhere = a->remote_actor("n-nosuchpeer", "echo");
  REQUIRE_FALSE(nowhere);
  CHECK(error_code(nowhere.error()) == "not_connected");
  auto bad = a->connect("not-an-endpoint");
  REQUIRE_FALSE(bad);
  CHECK(error_code(bad.error()) == "invalid_argument");
  CHECK(a->remote_actor(a->id(), "twice").value() == first);
  caf::anon_send_exit(first, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(second, caf::exit_reason::user_shutdown);
}

TEST_CASE("a tensor that cannot travel is a clear error on both sides and the link stays up") {
  auto a = start_node();
  auto b = start_node();
  // Answers with a tensor that has no storage: the reply cannot be encoded.
  REQUIRE_FALSE(b->publish("broken", b->system().spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](remote_message&) {
      remote_message r;
      r.tensors.push_back(Tensor{});
      return r;
    }};
  })));
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  remote_message bad;
  bad.type = "echo";
  bad.tensors.push_back(Tensor{});
  auto sent = a->request(*peer, "echo", bad, 2s);
  REQUIRE_FALSE(sent);
  CHECK(error_code(sent.error()) == "invalid_argument");
  MESSAGE("undefined tensor in a request: " << error_message(sent.error()));
  auto answered = a->request(*peer, "broken", remote_message{}, 2s);
  REQUIRE_FALSE(answered);
  CHECK(error_code(answered.error()) == "invalid_argument");
  MESSAGE("undefined tensor in a reply: " << error_message(answered.error()));
  // Both links keep working.
  remote_message ok;
  ok.type = "echo";
  ok.tensors.push_back(Tensor::zeros({4}));
  auto echoed = a->request(*peer, "echo", ok, 2s);
  REQUIRE_MESSAGE(echoed, error_message(echoed));
  CHECK(echoed->tensors.size() == 1);
}

TEST_CASE("a message larger than the peer announced it accepts is refused by the sender, and the link stays up") {
  auto a = start_node();
  node_options small;
  small.max_message_bytes = 1 << 20;  // announced in its hello
  auto b = start_node(small);
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  remote_message big;
  big.type = "echo";
  big.tensors.push_back(Tensor::zeros({(1 << 20) / 4 + 16}));  // just over 1 MiB
  const auto t0 = std::chrono::steady_clock::now();
  auto sent = a->request(*peer, "echo", big, 60s);
  REQUIRE_FALSE(sent);
  CHECK(error_code(sent.error()) == "send_failed");
  CHECK(error_message(sent.error()).find("1048576-byte messages peer") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);  // refused here, not timed out (60 s)
  MESSAGE(error_message(sent.error()));
  // The same bytes as int8 fit (a quarter of the size), and small messages
  // still pass.
  big.encodings = {net::tensor_encoding::int8_block};
  auto compressed = a->request(*peer, "echo", big, 5s);
  REQUIRE_MESSAGE(compressed, error_message(compressed));
  remote_message ok;
  ok.type = "echo";
  ok.tensors.push_back(Tensor::zeros({4}));
  CHECK(a->request(*peer, "echo", ok, 2s));
  // The other way: b asks a to echo, a's reply would exceed b's limit, so
  // b gets an error answer at once instead of a reply it would drop.
  REQUIRE_FALSE(a->publish("inflate", a->system().spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](remote_message&) {
      remote_message r;
      r.tensors.push_back(Tensor::zeros({1 << 19}));  // 2 MiB
      return r;
    }};
  })));
  auto answered = b->request(a->id(), "inflate", remote_message{}, 5s);
  REQUIRE_FALSE(answered);
  CHECK(error_code(answered.error()) == "send_failed");
  MESSAGE(error_message(answered.error()));
}

}  // namespace corolla
