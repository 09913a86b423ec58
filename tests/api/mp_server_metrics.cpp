// `corolla serve --metrics-listen`: a real server process answers GET
// /metrics in Prometheus' format, and its counters move with the traffic of
// a `corolla generate --swarm` through it.
#include <doctest/doctest.h>

#include <httplib.h>

#include <regex>
#include <string>

#include "tests/actors/swarm_fixtures.hpp"
#include "tests/api/prometheus_text.hpp"

using namespace corolla;
using namespace corolla::swarm_test;

TEST_CASE("corolla serve --metrics-listen counts steps, their times, sessions and link bytes") {
  swarm_model m(architecture::llama);
  swarm_processes s;
  s.start(m, "front", 0, 2, {"--metrics-listen", "127.0.0.1:0"});
  s.start(m, "back", 2, 4, {"--metrics-listen", "127.0.0.1:0"});
  auto metrics_of = [&](const std::string& id) {
    std::smatch u;
    const std::string line = s.procs.at(id).lines().back();
    REQUIRE_MESSAGE(std::regex_search(line, u, std::regex(R"( metrics http://127\.0\.0\.1:(\d+))")), line);
    httplib::Client c("127.0.0.1", std::stoi(u[1].str()));
    auto res = c.Get("/metrics");
    REQUIRE(res);
    REQUIRE(res->status == 200);
    CHECK(res->get_header_value("Content-Type").find("text/plain; version=0.0.4") == 0);
    return api::parse_prometheus_text(res->body);
  };
  const auto before = metrics_of("front");
  CHECK(before.at(R"(corolla_server_steps_total{node="front",kind="decode"})") == 0);
  CHECK(before.at(R"(corolla_server_blocks{node="front",edge="last"})") == 2);

  const testing::process_result g = generate_cli(m, {"--swarm", s.list()[0] + "," + s.list()[1]});
  INFO("generate stderr: " << g.err);
  REQUIRE(g.exit_code == 0);
  CHECK(printed_ids(g) == m.expected);
  for (const std::string id : {"front", "back"}) {
    INFO("server " << id);
    const auto after = metrics_of(id);
    const std::string node = "node=\"" + id + "\"";
    // The prompt is one prefill step; every later token one decode step.
    const double decode = after.at("corolla_server_steps_total{" + node + ",kind=\"decode\"}");
    CHECK(decode >= m.params.max_new_tokens - 1);
    CHECK(after.at("corolla_server_step_seconds_count{" + node + ",kind=\"decode\"}") == decode);
    CHECK(after.at("corolla_server_step_seconds_sum{" + node + ",kind=\"decode\"}") > 0);
    CHECK(after.at("corolla_server_steps_total{" + node + ",kind=\"prefill\"}") >= 1);
    CHECK(after.at("corolla_server_prefill_tokens_total{" + node + "}") >= m.prompt.size());
    CHECK(after.at("corolla_server_sessions_total{" + node + ",event=\"opened\"}") == 1);
    CHECK(after.at("corolla_server_step_errors_total{" + node + "}") == 0);
    // The client's link closed before the scrape; the node's totals keep
    // its traffic: every step's hidden state came in (f32).
    CHECK(after.at("corolla_node_bytes_total{" + node + ",direction=\"received\"}") > decode * m.cfg.hidden_size * 4);
    CHECK(after.at("corolla_node_bytes_total{" + node + ",direction=\"sent\"}") > decode * m.cfg.hidden_size * 4);
  }
}
