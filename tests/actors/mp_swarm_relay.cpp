// Servers behind NAT (`corolla serve --no-listen`, actors/relay.hpp), with
// real processes on 127.0.0.1: such a server keeps a connection to a relay
// (a listening server of the swarm), announces itself as reached through
// it, and clients reach it there; when its relay dies it moves to another,
// and a session in progress fails over without a wrong token.
#include <doctest/doctest.h>

#include <csignal>
#include <chrono>
#include <string>
#include <thread>

#include "actors/swarm_generate.hpp"
#include "actors/swarm_records.hpp"
#include "net/membership.hpp"
#include "tests/actors/swarm_fixtures.hpp"

namespace corolla {
using namespace swarm_test;

namespace {

/// The servers of `model` as the swarm's DHT announces them, in a client's form.
std::vector<std::string> discovered(net::membership& members, const std::string& model, int n_blocks) {
  std::vector<std::string> out;
  for (const auto& r : members.get_span(model, 0, n_blocks))
    if (r.state == server_state::online) out.push_back(server_entry(r));
  return out;
}

}  // namespace

TEST_CASE("a server behind NAT serves through a relay: output equals local, also after its relay dies mid-session") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  // Two listening servers of [0, 2): both relay (the default). The only
  // server of [2, 4) has no listening socket and takes s-a as its relay.
  sw.start(m, "s-a", 0, 2, {"--dht", "--dht-ttl-s", "3"});
  const std::string dht = sw.dht.at("s-a");
  sw.start(m, "s-b", 0, 2, {"--initial-peers", dht, "--dht-ttl-s", "3"});
  sw.start(m, "s-n", 2, 4,
           {"--no-listen", "--relay", sw.endpoints.at("s-a"), "--initial-peers", dht, "--dht-ttl-s", "3",
            "--log-level", "info"});
  CHECK(sw.relays.at("s-n") == "s-a");
  CHECK(sw.endpoints.at("s-n") == "s-n@" + sw.endpoints.at("s-a"));

  // The command line finds it through the DHT and reaches it through s-a.
  auto remote = generate_cli(m, {"--swarm-dht", dht, "--log-level", "debug"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  CHECK(remote.err.find("reached s-n through relay s-a") != std::string::npos);

  // A session in progress: its relay is killed after 6 tokens. s-n moves to
  // s-b (the other relay in the DHT); the client fails over to it there.
  net::membership reader;
  net::membership_options mo;
  mo.bootstrap = {dht};
  mo.ttl = 3s;
  REQUIRE(reader.start(mo));
  const std::string model = m.dir.path().filename().string();
  auto n = client_node();
  swarm_client_options o;
  o.discover = [&] { return discovered(reader, model, m.cfg.n_layers); };
  std::vector<std::string> events;
  o.on_event = [&](const std::string& e) { events.push_back(e); };
  swarm_client client(*n, o);
  head h = load_head(m);
  int produced = 0;
  const auto t0 = std::chrono::steady_clock::now();
  swarm_generation g = swarm_generate(client, h, m.prompt, m.params, [&](std::int32_t) {
    if (++produced == 6) sw.procs.at("s-a").signal(SIGKILL);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE(g.failovers << " failover(s) in " << s << " s:" << log << "\ns-n's log:\n" << sw.procs.at("s-n").err());
  CHECK(g.result.tokens == m.expected);
  CHECK(g.failovers >= 1);
  REQUIRE(g.route.size() == 2);
  CHECK(g.route[0].server == "s-b");
  CHECK(g.route[1].server == "s-n");
  CHECK(sw.procs.at("s-n").err().find("reachable through relay s-b") != std::string::npos);
  CHECK(s < 30.0);
}

TEST_CASE("a listening server that the swarm cannot dial back uses a relay, and clients reach it there") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--dht", "--dht-ttl-s", "3"});
  const std::string dht = sw.dht.at("s-a");
  // s-b is reachable: s-a dials it back.
  sw.start(m, "s-b", 0, 2, {"--initial-peers", dht, "--dht-ttl-s", "3", "--log-level", "info"});
  CHECK(sw.relays.at("s-b").empty());
  CHECK(sw.procs.at("s-b").err().find("serve: reachable at " + sw.endpoints.at("s-b") + " (s-a dialled back)") !=
        std::string::npos);
  // s-u listens, but announces an endpoint nobody answers at (as a server
  // behind NAT that guessed its address wrong would): the dial-back fails
  // and it takes a relay.
  sw.start(m, "s-u", 2, 4,
           {"--initial-peers", dht, "--dht-ttl-s", "3", "--announce-endpoint", "tcp://127.0.0.1:1", "--log-level",
            "info"});
  const std::string u_log = sw.procs.at("s-u").err();
  INFO("s-b's log:\n" << sw.procs.at("s-b").err() << "\ns-u's log:\n" << u_log);
  CHECK(u_log.find("could not dial back tcp://127.0.0.1:1") != std::string::npos);
  CHECK_FALSE(sw.relays.at("s-u").empty());
  auto remote = generate_cli(m, {"--swarm-dht", dht, "--log-level", "debug"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  CHECK(remote.err.find("reached s-u through relay " + sw.relays.at("s-u")) != std::string::npos);
}

TEST_CASE("a dedicated relay (corolla node --relay-service) serves a chain of two servers behind NAT") {
  swarm_model m(architecture::llama);
  child_process relay = child_process::corolla({"node", "--relay-service", "--log-level", "info"});
  auto ready = relay.wait_line(std::regex(R"(corolla node (\S+) listening on (tcp://\S+))"), 15s);
  REQUIRE_MESSAGE(ready, "corolla node printed no readiness line; stderr:\n" << relay.err());
  const std::string relay_id = (*ready)[1].str(), relay_endpoint = (*ready)[2].str();
  swarm_processes sw;
  sw.start(m, "s-x", 0, 2, {"--no-listen", "--relay", relay_endpoint});
  sw.start(m, "s-y", 2, 4, {"--no-listen", "--relay", relay_endpoint});
  CHECK(sw.relays.at("s-x") == relay_id);
  CHECK(sw.relays.at("s-y") == relay_id);
  // The client is given both as ID@RELAY (what their readiness lines say).
  auto remote = generate_cli(m, {"--swarm", sw.endpoints.at("s-x") + "," + sw.endpoints.at("s-y"), "--log-level",
                                 "info"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  // One link to the relay carries both servers' traffic.
  std::size_t relay_links = 0;
  for (std::size_t at = 0; (at = remote.err.find("link to " + relay_id + " (", at)) != std::string::npos; ++at)
    ++relay_links;
  CHECK(relay_links == 1);
  relay.signal(SIGTERM);
  relay.wait(10s);
  CHECK(relay.err().find("passed on ") != std::string::npos);
}

TEST_CASE("a server behind NAT takes a clearly nearer relay over the first that answers") {
  swarm_model m(architecture::llama);
  // Two dedicated relays; the first one given answers 40 ms later than the
  // second (its links are shaped to 20 ms of latency each way).
  auto start_relay = [](std::vector<std::string> extra) {
    std::vector<std::string> args{"node", "--relay-service", "--log-level", "info"};
    args.insert(args.end(), extra.begin(), extra.end());
    return child_process::corolla(args);
  };
  child_process slow = start_relay({"--link-profile", "lat=20ms"});
  child_process fast = start_relay({});
  const std::regex ready(R"(corolla node (\S+) listening on (tcp://\S+))");
  auto slow_ready = slow.wait_line(ready, 15s);
  auto fast_ready = fast.wait_line(ready, 15s);
  REQUIRE(slow_ready);
  REQUIRE(fast_ready);
  const std::string slow_id = (*slow_ready)[1].str(), fast_id = (*fast_ready)[1].str();
  swarm_processes sw;
  sw.start(m, "s-x", 0, 4,
           {"--no-listen", "--relay", (*slow_ready)[2].str() + "," + (*fast_ready)[2].str(), "--log-level", "info"});
  CHECK(sw.relays.at("s-x") == fast_id);
  auto remote = generate_cli(m, {"--swarm", sw.endpoints.at("s-x")});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  sw.procs.at("s-x").signal(SIGTERM);
  sw.procs.at("s-x").wait(10s);
  const std::string err = sw.procs.at("s-x").err();
  INFO("server stderr: " << err);
  CHECK(err.find("taking " + fast_id + ", clearly the nearest") != std::string::npos);
  CHECK(err.find(slow_id + " ") != std::string::npos);  // measured too
}

TEST_CASE("servers behind NAT that join one after another spread over the relays the DHT offers") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  // Two listening servers of [0, 2), both relaying (the default), and two
  // servers of [2, 4) behind NAT, each given both as relays in the same
  // order: the second finds the first's record on s-a and takes s-b.
  sw.start(m, "s-a", 0, 2, {"--dht", "--dht-ttl-s", "3"});
  const std::string dht = sw.dht.at("s-a");
  sw.start(m, "s-b", 0, 2, {"--initial-peers", dht, "--dht-ttl-s", "3"});
  const std::string both = sw.endpoints.at("s-a") + "," + sw.endpoints.at("s-b");
  sw.start(m, "s-n1", 2, 4,
           {"--no-listen", "--relay", both, "--initial-peers", dht, "--dht-ttl-s", "3", "--log-level", "info"});
  sw.start(m, "s-n2", 2, 4,
           {"--no-listen", "--relay", both, "--initial-peers", dht, "--dht-ttl-s", "3", "--log-level", "info"});
  INFO("s-n2's log:\n" << sw.procs.at("s-n2").err());
  CHECK(sw.relays.at("s-n1") == "s-a");
  CHECK(sw.relays.at("s-n2") == "s-b");
  CHECK(sw.procs.at("s-n2").err().find("taking s-b, the one carrying the fewest servers") != std::string::npos);
  // Clients reach each through its own relay.
  for (const std::string nat : {"s-n1", "s-n2"}) {
    auto remote = generate_cli(m, {"--swarm", sw.endpoints.at("s-a") + "," + sw.endpoints.at(nat)});
    REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
    CHECK(printed_ids(remote) == m.expected);
  }
}

TEST_CASE("a server behind NAT without a relay to use says so and exits") {
  swarm_model m(architecture::llama);
  auto r = testing::run_corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:2", "--no-listen",
                                 "--no-dht"},
                                30s);
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--no-listen needs a relay") != std::string::npos);
  auto both = testing::run_corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:2", "--no-listen",
                                    "--announce-endpoint", "tcp://127.0.0.1:1", "--relay", "127.0.0.1:1"},
                                   30s);
  CHECK(both.exit_code != 0);
  CHECK(both.err.find("--announce-endpoint is for servers that listen") != std::string::npos);
}

}  // namespace corolla
