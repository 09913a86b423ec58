// api/server_metrics: `corolla serve --metrics-listen`'s text from a span
// server's counters and its links (parsed strictly), link counters that
// survive their link closing, the HTTP listener every api/ server shares
// stopping in any order, and the page servers (metrics, dashboard)
// refusing bodies and ambiguous framing before reading them.
#include <doctest/doctest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "api/dashboard.hpp"
#include "api/http_bind.hpp"
#include "api/server_metrics.hpp"
#include "tests/api/prometheus_text.hpp"
#include "tests/api/raw_http.hpp"

using namespace corolla;
using namespace corolla::api;

namespace {

link_stats link(std::uint64_t id, const std::string& peer, std::uint64_t sent, std::uint64_t received) {
  link_stats l;
  l.link = id;
  l.peer = peer;
  l.up = true;
  l.bytes_sent = sent;
  l.bytes_received = received;
  l.messages_sent = 3;
  l.messages_received = 4;
  l.rtt_us = 250;
  return l;
}

}  // namespace

TEST_CASE("server metrics render steps by kind with their histograms, sessions, cache and links") {
  span_server_stats s;
  s.decode_steps = 7;
  s.decode_batches = 5;
  for (double t : {0.0002, 0.0002, 0.003, 0.003, 0.003, 0.003, 0.2}) s.decode_seconds.observe(t);
  s.prefill_steps = 1;
  s.prefill_tokens = 12;
  s.prefill_seconds.observe(0.02);
  s.sessions_opened = 2;
  s.sessions_closed = 1;
  s.sessions_open = 1;
  s.sessions_shared = 1;
  s.shared_tokens = 48;
  s.cache_tokens = 8192;
  s.cache_tokens_left = 8000;
  s.first = 2;
  s.last = 6;
  const auto m = parse_prometheus_text(render_server_metrics("srv", s, {100, 2000, 3, 4}, {link(1, "client", 100, 2000)}));
  CHECK(m.at(R"(corolla_server_steps_total{node="srv",kind="decode"})") == 7);
  CHECK(m.at(R"(corolla_server_steps_total{node="srv",kind="prefill"})") == 1);
  CHECK(m.at(R"(corolla_server_step_seconds_count{node="srv",kind="decode"})") == 7);
  CHECK(m.at(R"(corolla_server_step_seconds_bucket{node="srv",kind="decode",le="0.00025"})") == 2);
  CHECK(m.at(R"(corolla_server_step_seconds_bucket{node="srv",kind="decode",le="0.005"})") == 6);
  CHECK(m.at(R"(corolla_server_step_seconds_bucket{node="srv",kind="decode",le="+Inf"})") == 7);
  CHECK(m.at(R"(corolla_server_step_seconds_sum{node="srv",kind="decode"})") == doctest::Approx(0.2124));
  CHECK(m.at(R"(corolla_server_prefill_tokens_total{node="srv"})") == 12);
  CHECK(m.at(R"(corolla_server_sessions_total{node="srv",event="opened"})") == 2);
  CHECK(m.at(R"(corolla_server_sessions_total{node="srv",event="shared"})") == 1);
  CHECK(m.at(R"(corolla_server_shared_tokens_total{node="srv"})") == 48);
  CHECK(m.at(R"(corolla_server_sessions_open{node="srv"})") == 1);
  CHECK(m.at(R"(corolla_server_cache_tokens_left{node="srv"})") == 8000);
  CHECK(m.at(R"(corolla_server_blocks{node="srv",edge="last"})") == 6);
  CHECK(m.at(R"(corolla_link_bytes_received_total{node="srv",peer="client"})") == 2000);
  CHECK(m.at(R"(corolla_link_rtt_seconds{node="srv",peer="client"})") == doctest::Approx(0.00025));
  CHECK(m.at(R"(corolla_link_up{node="srv",peer="client"})") == 1);
  CHECK(m.at(R"(corolla_node_bytes_total{node="srv",direction="received"})") == 2000);
  CHECK(m.at(R"(corolla_node_messages_total{node="srv",direction="sent"})") == 3);
  // Without links there are no link series at all.
  const auto none = parse_prometheus_text(render_server_metrics("srv", s, {}, {}));
  for (const auto& [series, value] : none) CHECK(series.rfind("corolla_link_", 0) != 0);
}

TEST_CASE("a peer's link counters sum its links and survive closes and reconnects, the gone forgotten first") {
  link_history h(2);
  auto all = h.by_peer({link(1, "a", 10, 20), link(2, "b", 1, 2)});
  CHECK(all.size() == 2u);
  all = h.by_peer({link(2, "b", 5, 6)});  // a's link closed
  REQUIRE(all.size() == 2u);
  CHECK(all[0].peer == "a");
  CHECK(all[0].bytes_received == 20);
  CHECK_FALSE(all[0].up);
  CHECK(all[1].up);
  // b reconnects (a new link, counting from 0) and has a second link the
  // other way: its counters are the old link's plus both new ones.
  all = h.by_peer({link(3, "b", 1, 1), link(4, "b", 2, 2), link(5, "a", 4, 4)});
  REQUIRE(all.size() == 2u);
  CHECK(all[0].peer == "a");
  CHECK(all[0].bytes_received == 24);
  CHECK(all[0].up);
  CHECK(all[1].bytes_sent == 5 + 1 + 2);
  CHECK(all[1].messages_received == 3 * 4);
  // A bound of 2 with a third peer: the gone peer goes, the live ones stay.
  all = h.by_peer({link(3, "b", 1, 1), link(6, "c", 1, 1)});
  REQUIRE(all.size() == 2u);
  CHECK(all[0].peer == "b");
  CHECK(all[1].peer == "c");
  // A link still waiting for its hello has no peer: not shown.
  CHECK(h.by_peer({link(7, "", 1, 1)}).size() == 2u);
}

TEST_CASE("a link whose peer changes counts its bytes for each peer once") {
  link_history h;
  h.by_peer({link(9, "a", 10, 20)});
  auto all = h.by_peer({link(9, "b", 15, 26)});  // a new node behind the same endpoint, counters kept
  REQUIRE(all.size() == 2u);
  CHECK(all[0].peer == "a");
  CHECK(all[0].bytes_sent == 10);
  CHECK_FALSE(all[0].up);
  CHECK(all[1].peer == "b");
  CHECK(all[1].bytes_sent == 5);
  CHECK(all[1].bytes_received == 6);
  all = h.by_peer({link(9, "b", 17, 26)});
  CHECK(all[1].bytes_sent == 7);
}

TEST_CASE("node totals never go down between scrapes") {
  link_history h;
  node_traffic t;
  t.bytes_sent = 100;
  t.messages_received = 7;
  CHECK(h.totals(t).bytes_sent == 100);
  t.bytes_sent = 60;  // a closing link counted in neither part for a moment
  t.messages_received = 9;
  const node_traffic shown = h.totals(t);
  CHECK(shown.bytes_sent == 100);
  CHECK(shown.messages_received == 9);
}

TEST_CASE("the metrics server answers GET /metrics, and a failing scrape is a 500 naming why") {
  bool fail = false;
  metrics_server server([&] {
    if (fail) throw std::runtime_error("the span server did not answer");
    return std::string("# HELP x x\n# TYPE x counter\nx 1\n");
  });
  const int port = server.start("127.0.0.1", 0);
  httplib::Client c("127.0.0.1", port);
  auto ok = c.Get("/metrics");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(parse_prometheus_text(ok->body).at("x") == 1);
  fail = true;
  auto bad = c.Get("/metrics");
  REQUIRE(bad);
  CHECK(bad->status == 500);
  CHECK(bad->body.find("did not answer") != std::string::npos);
}

TEST_CASE("an HTTP listener stopped before it runs, or while it starts, never serves for ever") {
  for (int order = 0; order < 2; ++order) {
    CAPTURE(order);
    httplib::Server server;
    const int port = bind_http(server, "127.0.0.1", 0);
    CHECK(port > 0);
    http_listener listener(server);
    if (order == 0) {
      listener.stop();  // before run(): run() returns at once
      listener.run();
    } else {
      std::thread serving([&] { listener.run(); });
      listener.stop();  // races run()'s start: waits until it listens, then stops it
      serving.join();
    }
    CHECK_FALSE(server.is_running());
  }
}

TEST_CASE("the metrics and dashboard servers refuse bodies and ambiguous framing on the headers, and close") {
  metrics_server metrics([] { return std::string("# HELP x x\n# TYPE x counter\nx 1\n"); });
  const int metrics_port = metrics.start("127.0.0.1", 0);
  swarm_watch watch("tiny", 4, [] { return std::vector<net::server_record>{}; }, std::chrono::milliseconds(50));
  dashboard_server dashboard(watch, "tiny", 4);
  const int dashboard_port = dashboard.bind("127.0.0.1", 0);
  // Stopped and joined however the test ends (a failed REQUIRE throws).
  struct serving {
    dashboard_server& server;
    std::thread thread;
    ~serving() {
      server.stop();
      thread.join();
    }
  } served{dashboard, std::thread([&] { dashboard.run(); })};
  const std::string smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  for (const auto& [port, page] : {std::pair{metrics_port, std::string("/metrics")},
                                   std::pair{dashboard_port, std::string("/swarm.json")}}) {
    CAPTURE(page);
    const std::string get = std::string("GET ") + page + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n";
    const std::string post = std::string("POST ") + page + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n";
    // A body the server would not read (a GET's) or an ambiguous length:
    // a 400 naming why, and the rest is never read as a request.
    const std::vector<std::pair<std::string, std::string>> framings = {
        {get + "Content-Length: " + std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled,
         "a GET request carries a body"},
        {get + "Content-Length: 0\r\nContent-Length: 5\r\n\r\n" + smuggled, "2 different values"},
        {get + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, "a GET request carries a body"},
        {std::string("HEAD ") + page + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Length: " +
             std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled,
         ""}};
    for (const auto& [request, why] : framings) {
      CAPTURE(request);
      const std::string answer = raw_exchange(port, request);
      CHECK(answer.rfind("HTTP/1.1 400", 0) == 0);
      CHECK(answer.find(why) != std::string::npos);
      CHECK(answer.find("HTTP/1.1", 1) == std::string::npos);
    }
    // Another method is a 405 on the headers: 17 MiB announced, none sent,
    // and none asked for after an Expect: 100-continue.
    for (const std::string& expect : {std::string(), std::string("Expect: 100-continue\r\n")}) {
      const std::string answer =
          raw_exchange(port, post + expect + "Content-Length: " + std::to_string(17u << 20) + "\r\n\r\n");
      CHECK(answer.rfind("HTTP/1.1 405", 0) == 0);
      CHECK(answer.find("Allow: GET, HEAD") != std::string::npos);
    }
    // A plain GET is served, and so is one with an empty body.
    const std::string last = std::string("GET ") + page + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    CHECK(raw_exchange(port, last + "\r\n").rfind("HTTP/1.1 200", 0) == 0);
    CHECK(raw_exchange(port, last + "Content-Length: 0\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0);
  }
}

TEST_CASE("a metrics server whose connection trickles its headers is destroyed within its bound, and never scrapes after") {
  std::atomic<bool> destroyed{false}, scraped_after{false};
  auto server = std::make_unique<metrics_server>([&] {
    if (destroyed) scraped_after = true;
    return std::string("# HELP x x\n# TYPE x counter\nx 1\n");
  });
  const int port = server->start("127.0.0.1", 0);
  header_trickle trickle(port, "/metrics");
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();  // the trickle would hold it 120 s
  const auto took = std::chrono::steady_clock::now() - t0;
  destroyed = true;
  trickle.stop();
  const int fd = trickle.fd();
  CHECK(took >= metrics_server::kStopGrace - std::chrono::milliseconds(100));
  CHECK(took < std::chrono::seconds(60));
  // The request's headers end now: the server is gone for its owner, so
  // the answer is a 503 and nothing is scraped.
  REQUIRE(::send(fd, "\r\n", 2, MSG_NOSIGNAL) == 2);
  const timeval limit{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char buf[512];
  const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
  REQUIRE(got > 0);
  CHECK(std::string(buf, static_cast<std::size_t>(got)).rfind("HTTP/1.1 503", 0) == 0);
  CHECK_FALSE(scraped_after);
}
