// Swarm serving with real `corolla serve` processes on 127.0.0.1: remote
// generation equals local generation for several layouts, and stays equal
// when a server is killed (kill -9) or hung (SIGSTOP) in the middle of it;
// bad requests get clear errors while the server keeps serving.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "actors/swarm_wire.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/generator.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"
#include "net/membership.hpp"
#include "net/zmq_transport.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace std::chrono_literals;
using corolla::testing::child_process;

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm greedy generation equals local generation for several server layouts") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    swarm_model m(arch);
    struct layout {
      const char* name;
      std::vector<std::tuple<std::string, int, int>> servers;
    };
    for (const layout& l : {layout{"one server", {{"s-all", 0, 4}}},
                            layout{"three consecutive spans", {{"s-a", 0, 1}, {"s-b", 1, 3}, {"s-c", 3, 4}}},
                            layout{"overlapping spans with redundancy",
                                   {{"s-a", 0, 3}, {"s-b", 2, 4}, {"s-c", 0, 2}, {"s-d", 1, 4}}}}) {
      const std::string layout_name = std::string(l.name) + (arch == architecture::llama ? ", llama" : ", gpt2");
      CAPTURE(layout_name);
      swarm_processes sw;
      for (const auto& [id, a, b] : l.servers) sw.start(m, id, a, b);
      auto n = client_node();
      swarm_client_options o;
      o.servers = sw.list();
      std::vector<std::string> events;
      o.on_event = [&](const std::string& e) { events.push_back(e); };
      swarm_client client(*n, o);
      head h = load_head(m);
      swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
      CHECK(g.result.tokens == m.expected);
      CHECK(g.failovers == 0);
      // Servers push to each other once their links are up: a server dials
      // its successor at the first step that names it, which a step or two
      // later carries pushes.
      const auto steps = static_cast<std::uint64_t>(m.params.max_new_tokens);
      const std::uint64_t inner_hops = g.route.size() - 1;
      CHECK(g.pushed_hops >= (steps - 2 * inner_hops) * inner_hops);
      CHECK(g.pushed_hops <= steps * inner_hops);
      REQUIRE_FALSE(events.empty());
      MESSAGE(layout_name << ": " << events.front() << "; " << g.pushed_hops << " hop inputs pushed server to server");
      // The client carrying every hop itself gives the same output.
      swarm_client_options carried = o;
      carried.server_push = false;
      swarm_client client2(*n, carried);
      swarm_generation g2 = swarm_generate(client2, h, m.prompt, m.params);
      CHECK(g2.result.tokens == m.expected);
      CHECK(g2.pushed_hops == 0);
    }
  }
}

TEST_CASE("a new session sees servers that joined since the last refresh") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-first", 0, 4);
  auto n = client_node();
  std::vector<std::string> announced = sw.list();  // what a DHT would return
  swarm_client_options o;
  o.discover = [&] { return announced; };
  o.refresh_period = 1500ms;
  swarm_client client(*n, o);
  const auto first_refresh = std::chrono::steady_clock::now();
  {
    auto s = client.open_session(32);
    REQUIRE_MESSAGE(s, error_message(s.error()));
  }
  CHECK(client.servers().size() == 1u);
  sw.start(m, "s-joined", 0, 4);
  announced = sw.list();
  if (std::chrono::steady_clock::now() - first_refresh < 1200ms) {
    auto s = client.open_session(32);  // within the period: the old view
    REQUIRE(s);
    CHECK(client.servers().size() == 1u);
  }
  std::this_thread::sleep_until(first_refresh + 1600ms);
  {
    auto s = client.open_session(32);  // past the period: refreshed first
    REQUIRE(s);
  }
  REQUIRE(client.servers().size() == 2u);
  for (const known_server& k : client.servers()) CHECK(k.reachable);
}

TEST_CASE("corolla generate --swarm prints the same ids as local corolla generate") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  std::string list;
  for (const auto& e : sw.list()) list += (list.empty() ? "" : ",") + e.substr(6);  // HOST:PORT form
  auto local = generate_cli(m);
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  CHECK(printed_ids(local) == m.expected);
  auto remote = generate_cli(m, {"--swarm", list});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(remote.out_lines().back() == local.out_lines().back());
  // The client carrying every hop itself prints the same ids.
  auto carried = generate_cli(m, {"--swarm", list, "--no-server-push"});
  REQUIRE_MESSAGE(carried.exit_code == 0, carried.err);
  CHECK(carried.out_lines().back() == local.out_lines().back());

  // A swarm that is not there is one clear error line.
  auto none = testing::run_corolla({"generate", "--model", m.dir.path().string(), "--prompt-ids", "1,2", "--swarm",
                                    "127.0.0.1:1"},
                                   60s);
  CHECK(none.exit_code == 1);
  REQUIRE_FALSE(none.err_lines().empty());
  CHECK(none.err_lines().back().find("corolla: error:") == 0);
  MESSAGE(none.err_lines().back());
}

TEST_CASE("servers and client on bf16 weights generate through the swarm what local --weights bf16 generates") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--weights", "bf16"});
  sw.start(m, "s-b", 2, 4, {"--weights", "bf16"});
  std::string list;
  for (const auto& e : sw.list()) list += (list.empty() ? "" : ",") + e.substr(6);
  auto local = generate_cli(m, {"--weights", "bf16"});
  REQUIRE_MESSAGE(local.exit_code == 0, local.err);
  auto remote = generate_cli(m, {"--swarm", list, "--weights", "bf16"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(remote.out_lines().back() == local.out_lines().back());
  MESSAGE("bf16 ids: " << local.out_lines().back() << " (f32 model: " << m.expected.size() << " ids expected)");
  // A bad value is one clear error from serve.
  auto bad = testing::run_corolla({"serve", "--model", m.dir.path().string(), "--blocks", "0:1", "--no-dht",
                                   "--weights", "int4"},
                                  30s);
  CHECK(bad.exit_code == 1);
  REQUIRE_FALSE(bad.err_lines().empty());
  CHECK(bad.err_lines().back().find("--weights must be f32, bf16, int8 or nf4") != std::string::npos);
}

namespace {

/// The servers of the hops in the latest "route ..." event, in order.
std::vector<std::string> route_servers(const std::string& route_line) {
  std::vector<std::string> out;
  static const std::regex via(R"( via (\S+))");
  for (auto it = std::sregex_iterator(route_line.begin(), route_line.end(), via); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

struct failure_case {
  int kill_after;  ///< tokens generated before the failure
  int sig;         ///< SIGKILL or SIGSTOP
  bool first_hop;  ///< the route's first hop fails (else its last)
};

/// Generates with `servers` running, hits the chosen hop's server with the
/// signal after `kill_after` tokens, and checks the output is unchanged.
void check_failover(const swarm_model& m, const std::vector<std::tuple<std::string, int, int>>& servers,
                    const failure_case& f) {
  const std::string what = std::string(f.sig == SIGKILL ? "kill -9" : "SIGSTOP") + " of the " +
                           (f.first_hop ? "first" : "last") + " hop after token " + std::to_string(f.kill_after);
  CAPTURE(what);
  swarm_processes sw;
  for (const auto& [id, a, b] : servers) sw.start(m, id, a, b);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  std::string route;
  std::vector<std::string> events;
  o.on_event = [&](const std::string& e) {
    events.push_back(e);
    if (e.rfind("route ", 0) == 0) route = e;
  };
  swarm_client client(*n, o);
  head h = load_head(m);
  int produced = 0;
  std::string victim;
  const auto t0 = std::chrono::steady_clock::now();
  swarm_generation g = swarm_generate(client, h, m.prompt, m.params, [&](std::int32_t) {
    if (++produced != f.kill_after) return;
    const auto hops = route_servers(route);
    REQUIRE_FALSE(hops.empty());
    victim = f.first_hop ? hops.front() : hops.back();
    sw.procs.at(victim).signal(f.sig);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(g.result.tokens == m.expected);
  CHECK(g.failovers == 1);
  for (const auto& hop : g.route) CHECK(hop.server != victim);
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE(what << ": victim " << victim << ", " << g.failovers << " failover(s), " << s << " s:" << log);
  CHECK(s < 10.0);  // a hang is detected by heartbeats (1.2 s), not by the 30 s request timeout
  if (f.sig == SIGSTOP) sw.procs.at(victim).signal(SIGCONT);
}

}  // namespace

TEST_CASE("a server killed or hung mid-generation is replaced by replay and the output is unchanged") {
  swarm_model m(architecture::llama);
  SUBCASE("a chain of two spans, each with a stand-by server") {
    // Route: [0, 2) then [2, 4); either hop fails, the other keeps its cache.
    const std::vector<std::tuple<std::string, int, int>> servers{
        {"s-a", 0, 2}, {"s-e", 0, 2}, {"s-b", 2, 4}, {"s-c", 2, 4}};
    for (int kill_after : {1, 4, 11, 19})
      for (int sig : {SIGKILL, SIGSTOP})
        for (bool first_hop : {true, false}) check_failover(m, servers, {kill_after, sig, first_hop});
  }
  SUBCASE("one whole-model server replaced by two spans") {
    const std::vector<std::tuple<std::string, int, int>> servers{
        {"s-a", 0, 2}, {"s-b", 2, 4}, {"s-c", 2, 4}, {"s-d", 0, 4}};
    for (int kill_after : {1, 11, 19})
      for (int sig : {SIGKILL, SIGSTOP}) check_failover(m, servers, {kill_after, sig, true});
  }
}

TEST_CASE("the only server of a span restarts under a new id and the generation goes on through it") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);  // nobody else holds [2, 4)
  const std::string b_endpoint = sw.endpoints.at("s-b");
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  std::vector<std::string> events;
  o.on_event = [&](const std::string& e) { events.push_back(e); };
  swarm_client client(*n, o);
  head h = load_head(m);
  int produced = 0;
  swarm_generation g = swarm_generate(client, h, m.prompt, m.params, [&](std::int32_t) {
    if (++produced != 7) return;
    sw.procs.at("s-b").signal(SIGKILL);
    sw.procs.at("s-b").wait(5s);
    // A new process on the same endpoint, with another node id (as a restart
    // without --node-id gets).
    sw.start(m, "s-b-restarted", 2, 4, {}, b_endpoint);
  });
  CHECK(g.result.tokens == m.expected);
  CHECK(g.failovers >= 1);
  REQUIRE(g.route.size() == 2);
  CHECK(g.route[1].server == "s-b-restarted");
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE(g.failovers << " failover(s):" << log);
}

TEST_CASE("int8 compression of hidden states cuts the bytes on the wire and still generates") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  auto bytes_received = [&](bool compress, std::vector<std::int32_t>& tokens) {
    auto n = client_node();
    swarm_client_options o;
    o.servers = sw.list();
    o.compress = compress;
    swarm_client client(*n, o);
    head h = load_head(m);
    tokens = swarm_generate(client, h, m.prompt, m.params).result.tokens;
    std::uint64_t bytes = 0;  // payload bytes as they travelled (link_stats)
    for (const auto& peer : n->peers())
      if (auto st = n->stats(peer)) bytes += st->bytes_received;
    return bytes;
  };
  std::vector<std::int32_t> exact, compressed;
  const auto raw_bytes = bytes_received(false, exact);
  const auto int8_bytes = bytes_received(true, compressed);
  MESSAGE("hidden-state bytes received: " << raw_bytes << " raw, " << int8_bytes << " int8");
  CHECK(exact == m.expected);
  CHECK(compressed.size() == m.expected.size());
  // A 32-float row is 128 bytes raw and 36 as int8 (values and one scale);
  // answers' bodies (span.info, span.open) do not shrink.
  CHECK(int8_bytes * 2 < raw_bytes);
  std::size_t same = 0;
  while (same < compressed.size() && compressed[same] == m.expected[same]) ++same;
  MESSAGE("int8 output agrees with local for the first " << same << " of " << compressed.size() << " tokens");
}

TEST_CASE("a server told to stop finishes its open sessions, refuses new ones, and stops when they end") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 4, {"--drain-timeout-s", "30"});
  sw.start(m, "s-b", 0, 4);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  swarm_client client(*n, o);
  auto first = client.open_session(16);
  REQUIRE(first);
  REQUIRE((*first)->hops().size() == 1u);
  const std::string draining = (*first)->hops()[0].server;
  const std::string other = draining == "s-a" ? "s-b" : "s-a";
  const Tensor x = testing::random_tensor({3, m.cfg.hidden_size}, 1);
  REQUIRE((*first)->step(x, 0));

  sw.procs.at(draining).signal(SIGTERM);
  bool began = false;  // span.info says so once the server has begun draining
  for (int tries = 0; tries < 500 && !began; ++tries) {
    remote_message ask;
    ask.type = span_request::info;
    if (auto r = n->request(draining, "span", std::move(ask), 2s))
      if (auto info = decode_span_info(r->body)) began = info->draining;
    if (!began) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(began);
  CHECK_FALSE(sw.procs.at(draining).wait(0ms));  // still running: a session is open
  // The open session goes on there, without a failover.
  for (int t = 3; t < 6; ++t) REQUIRE((*first)->step(testing::random_tensor({1, m.cfg.hidden_size}, 10 + t), t));
  CHECK((*first)->failovers() == 0);
  CHECK((*first)->hops()[0].server == draining);
  // A new session goes to the other server: the draining one refuses it and
  // says so in span.info.
  swarm_client fresh(*n, o);
  auto second = fresh.open_session(16);
  REQUIRE(second);
  CHECK((*second)->hops()[0].server == other);
  // When the last session closes, the server stops at once, cleanly.
  const auto closed_at = std::chrono::steady_clock::now();
  (*first)->close();
  auto status = sw.procs.at(draining).wait(5s);
  REQUIRE(status);
  CHECK(*status == 0);
  MESSAGE("stopped " << std::chrono::duration<double>(std::chrono::steady_clock::now() - closed_at).count()
                     << " s after its last session closed");

  // With a session that never ends, the drain stops at its timeout.
  swarm_processes sw2;
  sw2.start(m, "s-c", 0, 4, {"--drain-timeout-s", "1"});
  swarm_client_options o2;
  o2.servers = sw2.list();
  swarm_client client2(*n, o2);
  auto held = client2.open_session(16);
  REQUIRE(held);
  const auto t0 = std::chrono::steady_clock::now();
  sw2.procs.at("s-c").signal(SIGTERM);
  auto st2 = sw2.procs.at("s-c").wait(10s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(st2);
  CHECK(*st2 == 0);
  CHECK(took >= 0.9);
  CHECK(took < 5.0);
}

TEST_CASE("servers announce themselves in the DHT and a client finds them through any one of them") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--dht", "--dht-ttl-s", "5"});
  const std::string first = sw.dht.at("s-a");
  REQUIRE_FALSE(first.empty());
  sw.start(m, "s-b", 2, 4, {"--initial-peers", first, "--dht-ttl-s", "5"});
  sw.start(m, "s-c", 1, 3, {"--initial-peers", first, "--dht-ttl-s", "5"});
  // s-d's link carries 1 Mbit/s: its announced throughput is what the link
  // carries, 1e6 / (32 floats x 32 bits) = 976.6 hidden states per second.
  sw.start(m, "s-d", 2, 4, {"--initial-peers", first, "--dht-ttl-s", "5", "--link-profile", "bw=1Mbit,lat=0ms"});
  // The client knows one DHT node (s-b's) and no server endpoint.
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-b"), "--log-level", "info"});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
  MESSAGE("client log:\n" << remote.err);
  CHECK(remote.err.find("swarm route:") != std::string::npos);

  // s-a's record carries its measured RTTs to the servers of block 2 (s-b
  // and s-c), for routing between consecutive servers.
  net::membership reader;
  net::membership_options mo;
  mo.bootstrap = {first};
  mo.ttl = 5s;
  REQUIRE(reader.start(mo));
  const std::string model = m.dir.path().filename().string();
  std::map<std::string, double> rtts;
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& r : reader.get_span(model, 0, 1))
      if (r.node_id == "s-a") rtts = r.rtt_ms;
    if (rtts.count("s-b") && rtts.count("s-c")) break;
    std::this_thread::sleep_for(200ms);
  }
  CHECK(rtts.count("s-b") == 1);
  CHECK(rtts.count("s-c") == 1);
  bool found_d = false;
  for (const auto& r : reader.get_span(model, 2, 3))
    if (r.node_id == "s-d") {
      found_d = true;
      CHECK(r.throughput == doctest::Approx(1e6 / (32.0 * 32.0)).epsilon(1e-6));
    }
  CHECK(found_d);
  for (const auto& [id, ms] : rtts) {
    MESSAGE("s-a -> " << id << ": " << ms << " ms");
    CHECK(ms > 0.0);
    CHECK(ms < 1000.0);
  }
  // span.info announces the same RTTs, and a client routes on them between
  // consecutive servers (which push to each other).
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  swarm_client client(*n, o);
  REQUIRE_FALSE(client.refresh());
  const auto* a = client.server("s-a");
  REQUIRE(a != nullptr);
  CHECK(a->info.rtt_ms.count("s-b") == 1);
  CHECK(a->info.rtt_ms.count("s-c") == 1);
  for (const auto& r : client.state().servers)
    if (r.id == "s-a") CHECK(r.rtt_s.count("s-b") == 1);
}

TEST_CASE("servers given only a block count place themselves where the swarm is weakest") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  auto start = [&](const std::string& id, const std::string& peers) {
    std::vector<std::string> extra{"--dht", "--dht-ttl-s", "5"};
    if (!peers.empty()) extra.insert(extra.end(), {"--initial-peers", peers});
    // The span comes from the DHT, not from the command line: --blocks is
    // replaced by --num-blocks below.
    extra.insert(extra.end(), {"--num-blocks", "2"});
    sw.start(m, id, -1, -1, extra);
  };
  start("s-1", "");
  start("s-2", sw.dht.at("s-1"));  // the gap [2, 4)
  start("s-3", sw.dht.at("s-1"));  // the weaker of the two covered windows
  CHECK(sw.spans.at("s-1") == std::make_pair(0, 2));
  CHECK(sw.spans.at("s-2") == std::make_pair(2, 4));
  const auto s3 = sw.spans.at("s-3");
  CHECK((s3 == std::make_pair(0, 2) || s3 == std::make_pair(2, 4)));
  MESSAGE("s-3 chose [" << s3.first << ", " << s3.second << ")");
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-3")});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
}

TEST_CASE("a server given --max-memory serves as many blocks as fit, where the swarm is weakest") {
  swarm_model m(architecture::llama);
  const model_config cfg = load_config(m.dir.path().string());
  // One f32 block set aside (loading, fine-tuning requests), then two
  // blocks' weights (int8 copies, norms: the f32 parameters are not kept)
  // and KV cache for 512 tokens, and half of a third.
  const std::int64_t per_block = served_block_bytes(cfg, weight_format::int8, false) +
                                 static_cast<std::int64_t>(span_engine::kv_bytes_per_token(cfg, 1)) * 512;
  const std::string budget = std::to_string(served_block_bytes(cfg, weight_format::f32) + per_block * 5 / 2);
  swarm_processes sw;
  sw.start(m, "s-1", -1, -1,
           {"--dht", "--dht-ttl-s", "5", "--weights", "int8", "--cache-tokens", "512", "--max-memory", budget});
  CHECK(sw.spans.at("s-1").second - sw.spans.at("s-1").first == 2);
  // A second server of the same size fills the gap.
  sw.start(m, "s-2", -1, -1,
           {"--initial-peers", sw.dht.at("s-1"), "--weights", "int8", "--cache-tokens", "512", "--max-memory", budget});
  CHECK(sw.spans.at("s-2") == (sw.spans.at("s-1").first == 0 ? std::make_pair(2, 4) : std::make_pair(0, 2)));
}

TEST_CASE("a server moves to the blocks a crashed server left uncovered, and clients find it there") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  const std::vector<std::string> quick{"--dht-ttl-s", "3", "--rebalance-period-s", "1000"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  sw.start(m, "s-2", 0, 2, with(quick, {"--dht"}));
  sw.start(m, "s-3", 2, 4, with(quick, {"--initial-peers", sw.dht.at("s-2")}));
  // s-1 checks about every second whether moving would help.
  sw.start(m, "s-1", 0, 2, {"--initial-peers", sw.dht.at("s-2"), "--dht-ttl-s", "3", "--rebalance-period-s", "1"});
  const auto t0 = std::chrono::steady_clock::now();
  sw.procs.at("s-3").signal(SIGKILL);  // [2, 4) loses its only server
  auto moved = sw.procs.at("s-1").wait_line(std::regex(R"(moved to blocks \[2, 4\))"), 30s);
  REQUIRE_MESSAGE(moved, "s-1 did not move to the uncovered blocks within 30 s; its log:\n" << sw.procs.at("s-1").err());
  MESSAGE("s-1 moved to [2, 4) " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                 << " s after the crash");
  auto remote = generate_cli(m, {"--swarm-dht", sw.dht.at("s-2")});
  REQUIRE_MESSAGE(remote.exit_code == 0, remote.err);
  CHECK(printed_ids(remote) == m.expected);
}

TEST_CASE("a server that requires CurveZMQ serves the clients it allows, its key read from the DHT") {
  swarm_model m(architecture::llama);
  testing::temp_dir_guard keys("swarm-curve");
  const auto client = net::load_curve_dir((keys / "client").string());  // creates the key pair
  (void)net::load_curve_dir((keys / "server").string());
  (void)net::load_curve_dir((keys / "stranger").string());
  {
    std::ofstream allowed(keys / "server" / "allowed", std::ios::app);
    allowed << client.public_key << "\n";
  }
  swarm_processes sw;
  sw.start(m, "s-secure", 0, 4, {"--dht", "--curve-keys", (keys / "server").string()});
  const std::string dht = sw.dht.at("s-secure");
  auto allowed_run = generate_cli(m, {"--swarm-dht", dht, "--curve-keys", (keys / "client").string()});
  REQUIRE_MESSAGE(allowed_run.exit_code == 0, allowed_run.err);
  CHECK(printed_ids(allowed_run) == m.expected);
  // A key the server does not allow gets no service, and a clear error.
  auto refused = generate_cli(m, {"--swarm-dht", dht, "--curve-keys", (keys / "stranger").string()});
  CHECK(refused.exit_code == 1);
  REQUIRE_FALSE(refused.err_lines().empty());
  MESSAGE("not allowed: " << refused.err_lines().back());
  CHECK(refused.err_lines().back().find("corolla: error:") == 0);
}

TEST_CASE("a span server answers bad requests with clear errors and keeps serving") {
  swarm_model m(architecture::llama);
  swarm_processes sw;
  sw.start(m, "s-bad", 0, 4, {"--cache-tokens", "32"});
  auto n = client_node();
  auto peer = n->connect(sw.endpoints.at("s-bad"));
  REQUIRE(peer);
  auto ask = [&](const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    remote_message r;
    r.type = type;
    r.body = std::move(body);
    r.tensors = std::move(tensors);
    return n->request(*peer, "span", std::move(r), 10s);
  };
  const std::int64_t D = m.cfg.hidden_size;
  auto rows = [&](std::int64_t k, dtype t = dtype::f32) { return Tensor::zeros({k, D}, t); };
  auto code_of = [](const caf::expected<remote_message>& r) { return r ? std::string("(ok)") : error_code(r.error()); };

  REQUIRE(ask(span_request::open, encode_body(span_open{"good", 16})));
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"nobody", 0, 1}), {rows(1)})) == "unknown_session");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 5, 1}), {rows(1)})) == "bad_position");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {Tensor::zeros({1, D + 1})})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {rows(1, dtype::i32)})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::step, {1, 2, 3}, {rows(1)})) == "bad_message");
  CHECK(code_of(ask(span_request::step, encode_body(span_step{"good", 0, 1}), {})) == "bad_message");
  CHECK(code_of(ask("span.nonsense", {})) == "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"good", 16}))) == "duplicate_session");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"huge", 1000}))) == "invalid_argument");
  // Deep prompts: the flag and the tensor go together, and the shape must fit the session's blocks.
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p1", 16, -1, -1, true}))) == "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p2", 16}), {Tensor::zeros({4, 2, D})})) ==
        "bad_message");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p3", 16, -1, -1, true}), {Tensor::zeros({3, 2, D})})) ==
        "invalid_argument");
  CHECK(code_of(ask(span_request::open, encode_body(span_open{"p4", 2, -1, -1, true}), {Tensor::zeros({4, 2, D})})) ==
        "invalid_argument");
  // A full cache fails the step and spares the other session.
  REQUIRE(ask(span_request::open, encode_body(span_open{"greedy", 64})));
  auto full = ask(span_request::step, encode_body(span_step{"greedy", 0, 1}), {rows(40)});
  CHECK(code_of(full) == "cache_full");
  if (!full) MESSAGE("full cache: " << error_message(full.error()));
  // The good session still works, step by step.
  for (int pos = 0; pos < 4; ++pos) {
    auto r = ask(span_request::step, encode_body(span_step{"good", pos, static_cast<std::uint64_t>(pos + 1)}), {rows(1)});
    REQUIRE_MESSAGE(r, error_message(r.error()));
    CHECK(r->tensors.at(0).shape() == shape_t{1, D});
  }
  auto info = ask(span_request::info, {});
  REQUIRE(info);
  auto decoded = decode_span_info(info->body);
  REQUIRE(decoded);
  CHECK(decoded->first == 0);
  CHECK(decoded->last == 4);
  CHECK(decoded->sessions == 2);
  CHECK(ask(span_request::close, encode_close_body("good")));
  CHECK(code_of(ask(span_request::close, encode_close_body("good"))) == "unknown_session");
}

TEST_CASE("corolla bench swarm runs every part on a tiny model and reports push, fine-tuning, recovery and the per-hop overhead") {
  testing::temp_dir_guard dir("bench-swarm");
  testing::tiny_model_options o;
  o.layers = 4;
  o.max_positions = 128;  // the prompt-tuning part runs P + T = 72 positions
  testing::write_tiny_model(dir.path(), o);
  auto r = testing::run_corolla({"bench", "swarm", "--model", dir.path().string(), "--new-tokens", "8",
                                 "--wan-new-tokens", "4", "--tune-steps", "1", "--wan-profiles", "bw=100Mbit,lat=5ms",
                                 "--server-threads", "1", "--json"},
                                180s);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  REQUIRE_FALSE(r.out_lines().empty());
  const auto j = nlohmann::json::parse(r.out_lines().back());
  MESSAGE(j.dump());
  CHECK(j["lan"]["equal_to_local"] == true);
  CHECK(j["lan"]["pushed_hops"].get<int>() > 0);
  CHECK(j["lan"]["client_carried_steps_per_s"].get<double>() > 0);
  REQUIRE(j["wan"].size() == 1u);
  CHECK(j["wan"][0]["equal_to_local_prefix"] == true);
  CHECK(j["wan"][0]["pushed_hops"].get<int>() > 0);
  CHECK(j["wan"][0]["push_speedup"].get<double>() > 0);
  CHECK(j["finetune"]["ratio_to_local"].get<double>() > 0);
  CHECK(j["recovery"]["failovers"].get<int>() >= 1);
  CHECK(j["recovery"]["equal_to_local"] == true);
  // The fixed cost of a hop, measured on a model of its own.
  CHECK(j["hop_overhead"]["equal_to_local"] == true);
  CHECK(j["hop_overhead"]["local_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"]["two_servers_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"].contains("ms_per_extra_hop"));
  // Through a server behind NAT, reached over a relay (its output is in equal_to_local too).
  CHECK(j["hop_overhead"]["relayed_server_ms_per_step"].get<double>() > 0);
  CHECK(j["hop_overhead"].contains("ms_per_relay_leg"));
}

}  // namespace corolla
