// The metrics registry renders valid Prometheus text format (checked line by
// line against the format's grammar) and its values move with updates.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "api/metrics.hpp"
#include "tests/api/prometheus_text.hpp"

using namespace corolla::api;

TEST_CASE("counters, gauges and histograms render as Prometheus text format") {
  metrics_registry m;
  m.declare("requests_total", metrics_registry::kind::counter, "Requests.\nBy status.");
  m.declare("in_flight", metrics_registry::kind::gauge, "In flight.");
  m.declare("latency_seconds", metrics_registry::kind::histogram, "Latency.", {0.1, 1, 10});
  m.declare("untouched_total", metrics_registry::kind::counter, "Never touched.");
  m.add("requests_total", {{"endpoint", "chat"}, {"status", "200"}});
  m.add("requests_total", {{"endpoint", "chat"}, {"status", "200"}}, 2);
  m.add("requests_total", {{"endpoint", "odd \"one\"\\\n"}, {"status", "500"}});
  m.add("in_flight", {}, 3);
  m.add("in_flight", {}, -1);
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0}) m.observe("latency_seconds", {}, v);

  const auto samples = parse_prometheus_text(m.render());
  CHECK(samples.at("requests_total{endpoint=\"chat\",status=\"200\"}") == 3);
  CHECK(samples.at("requests_total{endpoint=\"odd \\\"one\\\"\\\\\\n\",status=\"500\"}") == 1);
  CHECK(samples.at("in_flight") == 2);
  CHECK(samples.at("untouched_total") == 0);
  // Buckets are cumulative; le="0.1" includes 0.1 itself.
  CHECK(samples.at("latency_seconds_bucket{le=\"0.1\"}") == 2);
  CHECK(samples.at("latency_seconds_bucket{le=\"1\"}") == 3);
  CHECK(samples.at("latency_seconds_bucket{le=\"10\"}") == 4);
  CHECK(samples.at("latency_seconds_bucket{le=\"+Inf\"}") == 5);
  CHECK(samples.at("latency_seconds_count") == 5);
  CHECK(samples.at("latency_seconds_sum") == doctest::Approx(55.65));
  CHECK(m.value("requests_total", {{"endpoint", "chat"}, {"status", "200"}}) == 3);
  CHECK(m.value("latency_seconds") == 5);
}

TEST_CASE("the registry refuses undeclared names, bad names and counters going down") {
  metrics_registry m;
  CHECK_THROWS_AS(m.declare("1bad", metrics_registry::kind::counter, "x"), std::invalid_argument);
  CHECK_THROWS_AS(m.declare("h", metrics_registry::kind::histogram, "x", {1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(m.add("nope"), std::invalid_argument);
  m.declare("c_total", metrics_registry::kind::counter, "x");
  CHECK_THROWS_AS(m.add("c_total", {}, -1), std::invalid_argument);
  CHECK_THROWS_AS(m.observe("c_total", {}, 1), std::invalid_argument);
  // A count kept elsewhere: set, never lowered (an older reading set late
  // leaves it), never on a gauge.
  m.set_total("c_total", {}, 7);
  CHECK(m.value("c_total") == 7);
  m.set_total("c_total", {}, 6);
  CHECK(m.value("c_total") == 7);
  m.set_total("c_total", {}, 9);
  CHECK(m.value("c_total") == 9);
  m.declare("g", metrics_registry::kind::gauge, "x");
  CHECK_THROWS_AS(m.set_total("g", {}, 1), std::invalid_argument);
}

TEST_CASE("updates from many threads all count") {
  metrics_registry m;
  m.declare("n_total", metrics_registry::kind::counter, "x");
  m.declare("h", metrics_registry::kind::histogram, "x", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        m.add("n_total");
        m.observe("h", {}, 0.5);
        if (i % 100 == 0) (void)m.render();
      }
    });
  for (auto& t : threads) t.join();
  CHECK(m.value("n_total") == 4000);
  CHECK(parse_prometheus_text(m.render()).at("h_bucket{le=\"1\"}") == 4000);
}

TEST_CASE("a render can leave out series, histograms too, and stays valid text format") {
  metrics_registry m;
  m.declare("by_adapter_total", metrics_registry::kind::counter, "By adapter.");
  m.declare("latency_seconds", metrics_registry::kind::histogram, "Latency.", {1});
  m.add("by_adapter_total", {{"adapter", "open"}});
  m.add("by_adapter_total", {{"adapter", "secret"}}, 4);
  m.observe("latency_seconds", {{"adapter", "secret"}}, 0.5);
  const auto hide_secret = [](const metric_labels& labels) {
    return std::find(labels.begin(), labels.end(), std::pair<std::string, std::string>{"adapter", "secret"}) !=
           labels.end();
  };
  const std::string text = m.render(hide_secret);
  CHECK(text.find("secret") == std::string::npos);
  const auto samples = parse_prometheus_text(text);
  CHECK(samples.at("by_adapter_total{adapter=\"open\"}") == 1);
  CHECK(samples.size() == 1u);  // the histogram's every series hidden: no sample
  CHECK(text.find("# TYPE latency_seconds histogram") != std::string::npos);
  // A counter whose every series is hidden shows its zero, as before its
  // first count: a scraper cannot tell a hidden series appeared.
  metrics_registry only_hidden;
  only_hidden.declare("by_adapter_total", metrics_registry::kind::counter, "By adapter.");
  const std::string before = only_hidden.render(hide_secret);
  only_hidden.add("by_adapter_total", {{"adapter", "secret"}});
  CHECK(only_hidden.render(hide_secret) == before);
  CHECK(parse_prometheus_text(before).at("by_adapter_total") == 0);
  CHECK(parse_prometheus_text(m.render()).at("by_adapter_total{adapter=\"secret\"}") == 4);
}
