// Swarm serving through failures, with real `corolla serve` processes on
// 127.0.0.1: generation stays equal to local generation when a server is
// killed (kill -9) or hung (SIGSTOP) in the middle of it, or when the only
// server of a span restarts under a new id; a server told to stop (SIGTERM)
// finishes its open sessions, refuses new ones, and stops when they end.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "actors/swarm_wire.hpp"
#include "model/generator.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/numeric_checks.hpp"

using namespace std::chrono_literals;
using corolla::testing::child_process;

namespace corolla {
using namespace swarm_test;

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
  auto status = sw.procs.at(draining).wait(30s);
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
  auto st2 = sw2.procs.at("s-c").wait(30s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(st2);
  CHECK(*st2 == 0);
  CHECK(took >= 0.9);
  CHECK(took < 15.0);  // the 1 s drain, then a shutdown a busy machine may slow
}

}  // namespace corolla
