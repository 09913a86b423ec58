// Link profiles: parsing (named, explicit, overrides, errors) and the timing
// model of a shaped direction (bandwidth, latency, jitter, order, loss).
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "net/shaping.hpp"

using namespace corolla::net;
using namespace std::chrono_literals;

namespace {

double secs(shaping_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string parse_error(const std::string& text) {
  try {
    parse_link_profile(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  FAIL("'" << text << "' was accepted");
  return "";
}

}  // namespace

TEST_CASE("named link profiles have their documented figures") {
  struct row {
    const char* name;
    double bw, lat, jitter, loss;
  };
  for (const row& r : {row{"ib", 200e9, 1e-6, 0, 0}, row{"roce", 100e9, 3e-6, 0, 0},
                       row{"ethernet", 10e9, 25e-6, 0, 0}, row{"wan", 1e9, 2.5e-3, 0.2e-3, 0},
                       row{"consumer", 100e6, 50e-3, 2e-3, 0.001}}) {
    CAPTURE(r.name);
    auto p = parse_link_profile(r.name);
    CHECK(p.name == r.name);
    CHECK(p.bandwidth_bps == doctest::Approx(r.bw));
    CHECK(p.latency_s == doctest::Approx(r.lat));
    CHECK(p.jitter_s == doctest::Approx(r.jitter));
    CHECK(p.loss == doctest::Approx(r.loss));
    CHECK_FALSE(p.unshaped());
  }
  CHECK(parse_link_profile("none").unshaped());
  CHECK(parse_link_profile("").unshaped());
  CHECK(parse_link_profile(" WAN ").name == "wan");
  CHECK(describe(parse_link_profile("wan")) ==
        "wan (1 Gbit/s, 2.5 ms one-way, jitter 0.2 ms, loss 0%)");
  CHECK(describe(parse_link_profile("consumer")) ==
        "consumer (100 Mbit/s, 50 ms one-way, jitter 2 ms, loss 0.1%)");
  CHECK(describe(parse_link_profile("ib")) == "ib (200 Gbit/s, 1 us one-way, jitter 0 ms, loss 0%)");
  CHECK(describe(parse_link_profile("none")) == "none (unshaped)");
}

TEST_CASE("explicit link profiles accept any subset of settings in any order with units") {
  auto p = parse_link_profile("bw=100Mbit,lat=20ms,jitter=2ms,loss=0.1%");
  CHECK(p.name == "custom");
  CHECK(p.bandwidth_bps == doctest::Approx(100e6));
  CHECK(p.latency_s == doctest::Approx(0.020));
  CHECK(p.jitter_s == doctest::Approx(0.002));
  CHECK(p.loss == doctest::Approx(0.001));

  p = parse_link_profile("loss=0.001, lat = 250us ,bw=2.5Gbit");
  CHECK(p.loss == doctest::Approx(0.001));
  CHECK(p.latency_s == doctest::Approx(250e-6));
  CHECK(p.bandwidth_bps == doctest::Approx(2.5e9));
  CHECK(p.jitter_s == 0);

  CHECK(parse_link_profile("bw=512Kbit").bandwidth_bps == doctest::Approx(512e3));
  CHECK(parse_link_profile("bw=64kbps").bandwidth_bps == doctest::Approx(64e3));
  CHECK(parse_link_profile("bw=40Mbps").bandwidth_bps == doctest::Approx(40e6));
  CHECK(parse_link_profile("bw=25Gbps").bandwidth_bps == doctest::Approx(25e9));
  CHECK(parse_link_profile("bw=1Gbit/s").bandwidth_bps == doctest::Approx(1e9));
  CHECK(parse_link_profile("bw=9600bit").bandwidth_bps == doctest::Approx(9600));
  CHECK(parse_link_profile("lat=1s").latency_s == doctest::Approx(1));
  CHECK(parse_link_profile("jitter=5us").jitter_s == doctest::Approx(5e-6));
  CHECK(parse_link_profile("bandwidth=1Gbit,latency=1ms").latency_s == doctest::Approx(1e-3));
  CHECK(parse_link_profile("lat=3ms").bandwidth_bps == 0);  // unlimited
}

TEST_CASE("a named link profile can be overridden") {
  auto p = parse_link_profile("wan,lat=10ms");
  CHECK(p.name == "wan,lat=10ms");
  CHECK(p.bandwidth_bps == doctest::Approx(1e9));
  CHECK(p.latency_s == doctest::Approx(0.010));
  CHECK(p.jitter_s == doctest::Approx(0.2e-3));
  p = parse_link_profile("consumer,loss=0,jitter=0ms");
  CHECK(p.loss == 0);
  CHECK(p.jitter_s == 0);
  CHECK(p.latency_s == doctest::Approx(0.050));
}

TEST_CASE("bad link profiles are refused naming the bad part") {
  CHECK(parse_error("lan") .find("'lan': unknown profile") != std::string::npos);
  CHECK(parse_error("bw=100") .find("'bw=100': bandwidth needs a unit") != std::string::npos);
  CHECK(parse_error("bw=100MB").find("'bw=100MB': byte units are not accepted") != std::string::npos);
  CHECK(parse_error("bw=100Xbit").find("unknown bandwidth unit 'Xbit'") != std::string::npos);
  CHECK(parse_error("lat=20").find("'lat=20': a time needs a unit") != std::string::npos);
  CHECK(parse_error("lat=20min").find("unknown time unit 'min'") != std::string::npos);
  CHECK(parse_error("lat=-1ms").find("'lat=-1ms': ") != std::string::npos);
  CHECK(parse_error("lat=fast").find("'lat=fast': expected a number") != std::string::npos);
  CHECK(parse_error("loss=150%").find("loss cannot exceed 100%") != std::string::npos);
  CHECK(parse_error("loss=1e-3x").find("'loss=1e-3x'") != std::string::npos);
  CHECK(parse_error("delay=1ms").find("unknown setting 'delay'") != std::string::npos);
  CHECK(parse_error("lat=1ms,wan").find("'wan': a named profile can only come first") !=
        std::string::npos);
  CHECK(parse_error("wan,,lat=1ms").find("empty item") != std::string::npos);
  // One value a setting (its long name counts as the same setting); a
  // named profile's own value may be overridden once.
  CHECK(parse_error("lat=1ms,lat=2ms") == "link profile: 'lat=2ms': 'lat' is given twice");
  CHECK(parse_error("bw=1Gbit,bandwidth=2Gbit").find("'bw' is given twice") != std::string::npos);
  CHECK(parse_error("wan,loss=1%,loss=2%").find("'loss' is given twice") != std::string::npos);
  CHECK(parse_link_profile("wan,lat=1ms").latency_s == 0.001);
}

TEST_CASE("shaper delays by transmission time at the link bandwidth plus latency") {
  link_shaper s(parse_link_profile("bw=100Mbit,lat=20ms"));
  const auto t0 = shaping_clock::now();
  // 1 MB at 100 Mbit/s = 80 ms on the wire, then 20 ms of propagation.
  CHECK(secs(s.schedule(1'000'000, t0) - t0) == doctest::Approx(0.100).epsilon(1e-6));
  // The second message queues behind the first: leaves at 80 ms, done at 160.
  CHECK(secs(s.schedule(1'000'000, t0) - t0) == doctest::Approx(0.180).epsilon(1e-6));
  // Handed over after the link went idle: starts at once.
  const auto later = t0 + 1s;
  CHECK(secs(s.schedule(125, later) - later) == doctest::Approx(0.020 + 10e-6).epsilon(1e-6));

  // Achieved bandwidth over a stream of messages equals the profile.
  link_shaper stream(parse_link_profile("ethernet"));
  shaping_clock::time_point last{};
  for (int i = 0; i < 1000; ++i) last = stream.schedule(1 << 20, t0);
  const double seconds = secs(last - t0) - 25e-6;
  CHECK(1000.0 * (1 << 20) * 8 / seconds == doctest::Approx(10e9).epsilon(1e-5));

  // Unshaped: immediate delivery.
  link_shaper none;
  CHECK(none.schedule(1 << 30, t0) == t0);
}

TEST_CASE("shaper jitter stays within bounds and never reorders") {
  link_shaper s(parse_link_profile("lat=5ms,jitter=2ms"), 42);
  auto now = shaping_clock::now();
  auto previous = now;
  double min_delay = 1, max_delay = 0;
  int reordered_if_unclamped = 0;
  for (int i = 0; i < 20000; ++i) {
    now += i % 2 ? 3ms : 10us;  // sparse and dense traffic
    const auto due = s.schedule(100, now);
    CHECK(due >= previous);
    const double d = secs(due - now);
    if (due == previous) ++reordered_if_unclamped;
    min_delay = std::min(min_delay, d);
    max_delay = std::max(max_delay, d);
    previous = due;
  }
  CHECK(min_delay >= 0.005 - 1e-9);
  CHECK(max_delay <= 0.007 + 1e-9);
  CHECK(max_delay > 0.0069);  // the whole range is used
  MESSAGE("delay range [" << min_delay * 1e3 << ", " << max_delay * 1e3 << "] ms; "
                          << reordered_if_unclamped << " of 20000 held back to keep order");
}

TEST_CASE("shaper loss adds one retransmission timeout with the loss probability") {
  const auto t0 = shaping_clock::now();
  auto count_losses = [&](const std::string& profile, double rto, std::uint64_t seed) {
    link_shaper s(parse_link_profile(profile), seed);
    int lost = 0;
    const double lat = s.profile().latency_s;
    auto now = t0;
    for (int i = 0; i < 100000; ++i) {
      now += 1s;  // far apart: no queueing, no ordering clamp
      const double d = secs(s.schedule(0, now) - now);
      if (d > lat + 1e-9) {
        CHECK(d == doctest::Approx(lat + rto).epsilon(1e-9));
        ++lost;
      } else {
        CHECK(d == doctest::Approx(lat).epsilon(1e-9));
      }
    }
    return lost;
  };
  // RTO = max(3 x latency, 200 ms).
  const int small = count_losses("lat=10ms,loss=1%", 0.200, 1);
  CHECK(small >= 900);  // 1000 expected; 3.2 sigma either way
  CHECK(small <= 1100);
  const int large = count_losses("lat=100ms,loss=5%", 0.300, 2);
  CHECK(large >= 4700);  // 5000 expected
  CHECK(large <= 5300);
  MESSAGE("losses: " << small << " of 100000 at 1%, " << large << " of 100000 at 5%");
  // Same seed, same sequence.
  CHECK(count_losses("lat=10ms,loss=1%", 0.200, 1) == small);
}
