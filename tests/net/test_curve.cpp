// tests/net/test_curve.cpp — CurveZMQ key directories and authenticated,
// encrypted connections with an allow-list.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <doctest/doctest.h>

#include "net/zmq_transport.hpp"
#include "tests/support/eventually.hpp"
#include "transport_recorder.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::testing;
namespace fs = std::filesystem;

namespace {

/// A fresh directory under the system temp dir, removed at the end.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("corolla-curve-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

transport_options curve_node(const std::string& identity, curve_options keys) {
  auto o = loopback_options(identity);
  o.curve = std::move(keys);
  return o;
}

}  // namespace

TEST_CASE("a CurveZMQ key directory is created once and then reloaded") {
  temp_dir dir;
  const auto keys_dir = (dir / "keys").string();
  const curve_options first = load_curve_dir(keys_dir);
  CHECK(first.enabled);
  CHECK(first.public_key.size() == 40);
  CHECK(first.secret_key.size() == 40);
  REQUIRE(first.allowed.size() == 1);
  CHECK(first.allowed[0] == first.public_key);  // nodes sharing a directory may talk

  struct stat st {};
  REQUIRE(::stat((dir / "keys/node.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  const curve_options again = load_curve_dir(keys_dir);
  CHECK(again.public_key == first.public_key);
  CHECK(again.secret_key == first.secret_key);

  SUBCASE("a malformed allow-list names the file and line") {
    write_file(dir / "keys/allowed", "# peers\n" + first.public_key + "\nnot-a-key\n");
    try {
      load_curve_dir(keys_dir);
      FAIL("a malformed allow-list was accepted");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("allowed:3") != std::string::npos);
    }
  }
  SUBCASE("a public key that does not match the secret key is refused") {
    const curve_options other = load_curve_dir((dir / "other").string());
    fs::remove(dir / "keys/node.pub");
    write_file(dir / "keys/node.pub", other.public_key + "\n");
    CHECK_THROWS_WITH_AS(load_curve_dir(keys_dir), doctest::Contains("node.pub"), std::runtime_error);
  }
  SUBCASE("a corrupt secret key is refused") {
    fs::remove(dir / "keys/node.key");
    write_file(dir / "keys/node.key", "garbage\n");
    CHECK_THROWS_WITH_AS(load_curve_dir(keys_dir), doctest::Contains("node.key"), std::runtime_error);
  }
}

TEST_CASE("an allow-listed CurveZMQ client exchanges messages and others are refused") {
  temp_dir dir;
  curve_options server_keys = load_curve_dir((dir / "server").string());
  const curve_options client_keys = load_curve_dir((dir / "client").string());
  const curve_options intruder_keys = load_curve_dir((dir / "intruder").string());
  server_keys.allowed = {client_keys.public_key};

  transport_recorder rs, rc;
  auto server = start_transport(curve_node("server", server_keys), rs);
  auto client = start_transport(curve_node("client", client_keys), rc);

  // The client must know whom it talks to.
  CHECK_THROWS_AS(client->connect(server->endpoint()), std::invalid_argument);

  const connection_id to_server = client->connect(server->endpoint(), server_keys.public_key);
  REQUIRE(client->send(to_server, make_message(message_kind::request, 1, {Tensor::zeros({256})})));
  REQUIRE_MESSAGE(rs.wait_messages(1), "the allowed client's request did not arrive");
  connection_id from_client;
  {
    std::lock_guard<std::mutex> lock(rs.mu);
    from_client = rs.messages[0].conn;
    CHECK(rs.messages[0].msg.tensors.at(0).nbytes() == 1024);
  }
  REQUIRE(server->send(from_client, make_message(message_kind::response, 1)));
  REQUIRE_MESSAGE(rc.wait_messages(1), "the server's response did not arrive");
  CHECK(rs.auth_failures.empty());

  SUBCASE("a key that is not in the allow-list is refused and reported") {
    transport_recorder ri;
    auto intruder = start_transport(curve_node("intruder", intruder_keys), ri);
    const connection_id c = intruder->connect(server->endpoint(), server_keys.public_key);
    intruder->send(c, make_message(message_kind::oneway, 666));
    REQUIRE_MESSAGE(rs.wait_for([&] { return !rs.auth_failures.empty(); }), "the server reported no refusal");
    REQUIRE_MESSAGE(ri.wait_for([&] { return !ri.auth_failures.empty(); }), "the intruder was not told");
    {
      std::lock_guard<std::mutex> lock(rs.mu);
      MESSAGE("server: " << rs.auth_failures[0]);
      CHECK(rs.auth_failures[0].find(intruder_keys.public_key) != std::string::npos);
    }
    {
      std::lock_guard<std::mutex> lock(ri.mu);
      MESSAGE("intruder: " << ri.auth_failures[0]);
      CHECK(ri.connects.empty());
    }
    std::lock_guard<std::mutex> lock(rs.mu);
    CHECK(rs.messages.size() == 1);  // nothing from the intruder
    CHECK(rs.accepted.size() == 1);
  }

  SUBCASE("a client without CurveZMQ is refused") {
    transport_recorder rp;
    auto plain = start_transport(loopback_options("plain"), rp);
    const connection_id c = plain->connect(server->endpoint());
    plain->send(c, make_message(message_kind::oneway, 777));
    // Both sides see the mechanism mismatch in the other's greeting, but the
    // first to see it closes the TCP connection with the greeting of the
    // other still unread, which resets the connection and can discard the
    // greeting before the other side parses it. So one side, either one,
    // reports the refusal.
    auto refused = [&] {
      std::scoped_lock lock(rs.mu, rp.mu);
      return !rs.auth_failures.empty() || !rp.auth_failures.empty();
    };
    REQUIRE_MESSAGE(corolla::testing::eventually(refused, 20s, 5ms), "neither side reported the refusal within 20 s");
    std::this_thread::sleep_for(100ms);  // a message let through would have arrived by now
    std::scoped_lock lock(rs.mu, rp.mu);
    MESSAGE("refusal: " << (rs.auth_failures.empty() ? "client: " + rp.auth_failures[0]
                                                     : "server: " + rs.auth_failures[0]));
    CHECK(rs.messages.size() == 1);
  }

  SUBCASE("a client with the wrong server key never connects") {
    const connection_id c = client->connect(server->endpoint(), intruder_keys.public_key);
    client->send(c, make_message(message_kind::oneway, 888));
    REQUIRE_MESSAGE(rs.wait_for([&] { return !rs.auth_failures.empty(); }), "the server reported no failure");
    std::lock_guard<std::mutex> lock(rs.mu);
    MESSAGE("server: " << rs.auth_failures[0]);
    CHECK(rs.messages.size() == 1);
  }
}
