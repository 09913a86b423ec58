// Two nodes in one process, the handshake of a link over real ZeroMQ on
// 127.0.0.1: protocol version mismatches and silent endpoints are clear
// errors, and under CurveZMQ only allowed keys connect and a node id belongs
// to its key.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "actors/corolla.hpp"
#include "net/zmq_transport.hpp"
#include "tests/support/tiny_model.hpp"
#include "tests/actors/node_test_util.hpp"
#include "tests/actors/raw_peer.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace node_test;

namespace {

connect_options within(std::chrono::milliseconds timeout) {
  connect_options c;
  c.timeout = timeout;
  return c;
}

}  // namespace

TEST_CASE("a hello with an incompatible protocol version is refused with a clear error") {
  auto n = start_node();
  SUBCASE("a peer connecting with version 999 gets hello_reject") {
    testing::raw_peer raw("n-raw999");
    auto conn = raw.transport().connect(n->endpoint());
    REQUIRE(raw.transport().send(conn, raw.hello(net::message_kind::hello, 999)));
    auto reply = raw.wait_for(net::message_kind::hello_reject, 5s);
    REQUIRE_MESSAGE(reply, "no hello_reject within 5 s");
    const auto& why = reply->second.error_message;
    INFO(why);
    CHECK(reply->second.error_code == "protocol_mismatch");
    CHECK(why.find("999") != std::string::npos);
    CHECK(why.find("version") != std::string::npos);
    CHECK(n->peers().empty());
  }
  SUBCASE("connecting to a peer that answers with version 999 fails") {
    testing::raw_peer raw("n-raw999", "tcp://127.0.0.1:0");
    std::thread answer([&] {
      auto hello = raw.wait_for(net::message_kind::hello, 5s);
      if (hello) raw.transport().send(hello->first, raw.hello(net::message_kind::hello_ack, 999));
    });
    auto peer = n->connect(raw.transport().endpoint(), within(5000ms));
    answer.join();
    REQUIRE_FALSE(peer);
    INFO(error_message(peer));
    CHECK(error_code(peer.error()) == "protocol_mismatch");
    CHECK(error_message(peer.error()).find("999") != std::string::npos);
    // The node tells the peer why, too.
    auto reject = raw.wait_for(net::message_kind::hello_reject, 2s);
    REQUIRE(reject);
    CHECK(reject->second.error_message.find("999") != std::string::npos);
  }
}

TEST_CASE("connect to an endpoint nobody answers fails within its timeout") {
  auto n = start_node();
  testing::raw_peer silent("n-silent", "tcp://127.0.0.1:0");  // listens, never answers
  const auto t0 = std::chrono::steady_clock::now();
  auto peer = n->connect(silent.transport().endpoint(), within(300ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(peer);
  CHECK(error_code(peer.error()) == "handshake_timeout");
  CHECK(waited < 4s);  // not the default 5 s (a loaded machine may be late)
}

TEST_CASE("a key outside the peer's CurveZMQ allow-list fails connect at once with auth_refused") {
  testing::temp_dir_guard keys("node-curve");
  const auto server_keys = net::load_curve_dir((keys.path() / "server").string());  // creates the pairs
  const auto friend_keys = net::load_curve_dir((keys.path() / "friend").string());
  (void)net::load_curve_dir((keys.path() / "stranger").string());
  {
    std::ofstream allowed(keys.path() / "server" / "allowed", std::ios::app);
    allowed << friend_keys.public_key << "\n";
  }
  auto start_with = [&](const char* name) {
    node_options o;
    o.curve_dir = (keys.path() / name).string();
    return start_node(o);
  };
  auto server = start_with("server");
  auto friend_node = start_with("friend");
  auto stranger = start_with("stranger");
  connect_options to_server;
  to_server.server_key = server_keys.public_key;
  to_server.timeout = 60s;
  auto ok = friend_node->connect(server->endpoint(), to_server);
  REQUIRE_MESSAGE(ok, error_message(ok));
  const auto t0 = std::chrono::steady_clock::now();
  auto refused = stranger->connect(server->endpoint(), to_server);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(refused);
  CHECK(error_code(refused.error()) == "auth_refused");
  CHECK(error_message(refused.error()).find("refused the CurveZMQ handshake") != std::string::npos);
  CHECK(took < 20s);  // not the 60 s connect timeout
  MESSAGE(error_message(refused.error()));
}

TEST_CASE("under CurveZMQ a node id belongs to its key: another allowed key can neither claim it nor take its connection") {
  testing::temp_dir_guard keys("node-curve-id");
  const auto server_keys = net::load_curve_dir((keys.path() / "server").string());
  const auto friend_keys = net::load_curve_dir((keys.path() / "friend").string());
  const auto impostor_keys = net::load_curve_dir((keys.path() / "impostor").string());
  {
    std::ofstream allowed(keys.path() / "server" / "allowed", std::ios::app);
    allowed << friend_keys.public_key << "\n" << impostor_keys.public_key << "\n";
  }
  node_options so;
  so.curve_dir = (keys.path() / "server").string();
  auto server = start_node(so);
  node_options fo;
  fo.curve_dir = (keys.path() / "friend").string();
  fo.node_id = "n-friend";
  auto friend_node = start_node(fo);
  connect_options to_server;
  to_server.server_key = server_keys.public_key;
  auto ok = friend_node->connect(server->endpoint(), to_server);
  REQUIRE_MESSAGE(ok, error_message(ok));
  auto friend_echo = [&](float v) {
    remote_message e;
    e.type = "echo";
    e.tensors = {Tensor::from_f32(std::vector<float>{v}, {1})};
    auto r = friend_node->request(*ok, "echo", e, 5s);
    REQUIRE_MESSAGE(r, error_message(r));
    CHECK(r->tensors.at(0).to_vector() == std::vector<float>{v});
  };
  friend_echo(1.0f);

  net::curve_options impostor_curve = impostor_keys;
  SUBCASE("a hello claiming the friend's node id under another key is refused") {
    testing::raw_peer impostor("n-impostor", "", impostor_curve);
    const auto conn = impostor.transport().connect(server->endpoint(), server_keys.public_key);
    REQUIRE(impostor.transport().send(conn, impostor.hello(net::message_kind::hello, net::protocol_version, "n-friend")));
    auto reject = impostor.wait_for(net::message_kind::hello_reject, 5s);
    REQUIRE_MESSAGE(reject, "no hello_reject for the impostor");
    CHECK(reject->second.error_code == "auth_refused");
    CHECK(reject->second.error_message.find("node id 'n-friend' belongs to CurveZMQ key " +
                                            friend_keys.public_key.substr(0, 8)) != std::string::npos);
    MESSAGE("impostor refused: " << reject->second.error_message);
  }
  SUBCASE("a connection presenting the friend's node id as its routing id takes nothing over") {
    // Under CurveZMQ the friend presents no routing id (the server's ROUTER
    // made one up), so this one is just another connection, and its hello
    // is refused as above.
    testing::raw_peer impostor("n-friend", "", impostor_curve);
    const auto conn = impostor.transport().connect(server->endpoint(), server_keys.public_key);
    REQUIRE(impostor.transport().send(conn, impostor.hello(net::message_kind::hello, net::protocol_version)));
    auto reject = impostor.wait_for(net::message_kind::hello_reject, 5s);
    REQUIRE_MESSAGE(reject, "no hello_reject for the impostor");
    CHECK(reject->second.error_code == "auth_refused");
  }
  SUBCASE("a message naming the friend's node on the impostor's own link is refused") {
    testing::raw_peer impostor("n-impostor", "", impostor_curve);
    const auto conn = impostor.transport().connect(server->endpoint(), server_keys.public_key);
    REQUIRE(impostor.transport().send(conn, impostor.hello(net::message_kind::hello, net::protocol_version)));
    REQUIRE(impostor.wait_for(net::message_kind::hello_ack, 5s));
    net::message forged;
    forged.kind = net::message_kind::request;
    forged.sender_node = "n-friend";
    forged.target_actor = "echo";
    forged.type = "echo";
    forged.correlation_id = 7;
    REQUIRE(impostor.transport().send(conn, forged));
    auto err = impostor.wait_for(net::message_kind::error, 5s);
    REQUIRE_MESSAGE(err, "no error for the forged request");
    CHECK(err->second.error_code == "bad_message");
    CHECK(err->second.error_message.find("names node 'n-friend'") != std::string::npos);
  }
  // The friend's link and identity are untouched either way.
  CHECK(server->peer_is_up("n-friend"));
  friend_echo(2.0f);
}

}  // namespace corolla
