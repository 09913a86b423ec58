// api/swarm_view and api/dashboard: the dashboard's data from DHT records
// (coverage, bottleneck, newest record per server), the change log of the
// watch, and the routes GET / and GET /swarm.json on `corolla api` and on
// the dashboard server. The page itself runs in a real browser in
// mp_dashboard.cpp.
#include <doctest/doctest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/dashboard.hpp"
#include "api/swarm_view.hpp"
#include "tests/api/api_test_util.hpp"

using namespace corolla;
using namespace corolla::api;
using json = nlohmann::json;

namespace {

net::server_record record(const std::string& id, int start, int end, double throughput,
                          server_state state = server_state::online, std::uint64_t seq = 1) {
  net::server_record r;
  r.model = "tiny";
  r.node_id = id;
  r.endpoint = "tcp://127.0.0.1:7000";
  r.span = {start, end};
  r.state = state;
  r.throughput = throughput;
  r.cache_tokens_left = 4096;
  r.step_s_per_block = 0.002;
  r.rtt_ms = {{"other", 1.5}};
  r.weights = "bf16";
  r.seq = seq;
  r.timestamp_ms = wall_ms() - 500;
  r.ttl_ms = 15000;
  return r;
}

const json& server_named(const json& view, const std::string& id) {
  for (const json& s : view["servers"])
    if (s["node_id"] == id) return s;
  FAIL("no server " << id << " in " << view.dump());
  static const json none;
  return none;
}

}  // namespace

TEST_CASE("the swarm view counts online servers per block and finds the bottleneck") {
  std::vector<net::server_record> records = {
      record("a", 0, 3, 100), record("b", 3, 6, 40), record("c", 0, 6, 25),
      record("d", 2, 4, 1000, server_state::joining),  // not routable: no coverage, no throughput
  };
  records[0].relay_service = true;
  records[1].relay = "a";
  records[2].adapters = {{"other", "0123456789abcdef"}, {"style", "fedcba9876543210"}};
  const json v = swarm_view_json("tiny", 6, records, wall_ms(), {});
  CHECK(v["model"] == "tiny");
  CHECK(v["blocks"] == 6);
  CHECK(v["servers"].size() == 4u);
  CHECK(v["coverage"] == json::array({2, 2, 2, 2, 2, 2}));
  CHECK(v["block_throughput"][0].get<double>() == doctest::Approx(125));
  CHECK(v["block_throughput"][5].get<double>() == doctest::Approx(65));
  CHECK(v["bottleneck_throughput"].get<double>() == doctest::Approx(65));
  CHECK(v["complete"] == true);
  const json& a = server_named(v, "a");
  CHECK(a["span"] == json::array({0, 3}));
  CHECK(a["state"] == "online");
  CHECK(a["cache_tokens_left"] == 4096);
  CHECK(a["step_ms_per_block"].get<double>() == doctest::Approx(2.0));
  CHECK(a["rtt_ms"]["other"].get<double>() == doctest::Approx(1.5));
  CHECK(a["relayed"] == false);
  CHECK(a["relay_service"] == true);
  // b sits behind NAT, reached through a.
  const json& b = server_named(v, "b");
  CHECK(b["relayed"] == true);
  CHECK(b["relay"] == "a");
  CHECK(a["weights"] == "bf16");
  CHECK(a["adapters"] == json::object());
  CHECK(server_named(v, "c")["adapters"] == json{{"other", "0123456789abcdef"}, {"style", "fedcba9876543210"}});
  CHECK(a["age_ms"].get<std::int64_t>() >= 500);
  CHECK(server_named(v, "d")["state"] == "joining");

  // A gap: no route, no bottleneck throughput.
  const json gap = swarm_view_json("tiny", 6, {record("a", 0, 3, 100)}, wall_ms(), {});
  CHECK(gap["coverage"] == json::array({1, 1, 1, 0, 0, 0}));
  CHECK(gap["complete"] == false);
  CHECK(gap["bottleneck_throughput"] == 0.0);
}

TEST_CASE("the swarm view keeps the newest record of a server and span") {
  const json v = swarm_view_json("tiny", 4, {record("a", 0, 4, 10, server_state::online, 1),
                                             record("a", 0, 4, 30, server_state::online, 5),
                                             record("a", 0, 4, 20, server_state::online, 3)},
                                 wall_ms(), {});
  REQUIRE(v["servers"].size() == 1u);
  CHECK(v["servers"][0]["throughput"] == 30.0);
}

TEST_CASE("the watch logs servers going online, offline and vanishing, and the API's failovers") {
  std::mutex mu;
  std::vector<net::server_record> now = {record("a", 0, 2, 10), record("b", 2, 4, 10)};
  swarm_watch watch("tiny", 4, [&] {
    std::lock_guard lock(mu);
    return now;
  }, std::chrono::hours(1));  // refreshed by hand below
  watch.refresh();
  auto kinds = [&] {
    std::vector<std::string> k;
    const json v = watch.view();
    for (const json& e : v["events"]) k.push_back(e["kind"].get<std::string>() + " " + e["node_id"].get<std::string>());
    return k;
  };
  CHECK(kinds() == std::vector<std::string>{"online b", "online a"});
  {
    std::lock_guard lock(mu);
    now = {record("a", 0, 2, 10, server_state::offline, 2), record("c", 0, 4, 5, server_state::joining)};
  }
  watch.refresh();
  const auto k = kinds();
  REQUIRE(k.size() == 5u);
  CHECK(k[0] == "vanished b");
  CHECK(std::find(k.begin(), k.end(), "offline a") != k.end());
  CHECK(std::find(k.begin(), k.end(), "joined c") != k.end());
  watch.note_failover("1 server failure(s) recovered during a request");
  CHECK(watch.view()["events"][0]["kind"] == "failover");
  CHECK(watch.view()["coverage"] == json::array({0, 0, 0, 0}));  // a is offline, c joining
}

TEST_CASE("the dashboard server and corolla api serve the page and the swarm's data") {
  swarm_watch watch("tiny", 4, [] { return std::vector<net::server_record>{record("a", 0, 4, 12)}; },
                    std::chrono::milliseconds(50));
  dashboard_server server(watch, "tiny", 4);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  auto page = c.Get("/");
  REQUIRE(page);
  CHECK(page->status == 200);
  CHECK(page->get_header_value("Content-Type").find("text/html") == 0);
  CHECK(page->body.find("/swarm.json") != std::string::npos);
  CHECK(page->body.find("<svg id=\"spans\"") != std::string::npos);
  json v;
  for (int i = 0; i < 100; ++i) {  // the watch's first read may not have run yet
    auto data = c.Get("/swarm.json");
    REQUIRE(data);
    REQUIRE(data->status == 200);
    v = json::parse(data->body);
    if (!v["servers"].empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(v["servers"].size() == 1u);
  CHECK(v["servers"][0]["node_id"] == "a");
  CHECK(v["complete"] == true);
  server.stop();
  serving.join();

  // corolla api --local: the same page; its data says it computes locally.
  testing::temp_dir_guard dir("api-dashboard");
  write_chat_model(dir.path());
  local_api_server api(dir.path(), "secret-key");
  httplib::Client a("127.0.0.1", api.port());
  auto home = a.Get("/");  // public, like /metrics: no key needed
  REQUIRE(home);
  CHECK(home->status == 200);
  CHECK(home->body == dashboard_html());
  auto local = a.Get("/swarm.json");
  REQUIRE(local);
  CHECK(local->status == 200);
  const json lv = json::parse(local->body);
  CHECK(lv["local"] == true);
  CHECK(lv["servers"].empty());
  CHECK(lv["blocks"] == api.model().config().n_layers);
}
