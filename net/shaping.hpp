// net/shaping.hpp — emulated link profiles: bandwidth, latency, jitter and
// loss applied by the sender to each message, so one machine can host a
// heterogeneous cluster or a WAN swarm (see docs/protocol.md for the table).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace corolla::net {

using shaping_clock = std::chrono::steady_clock;

/// One direction of a link. Zero bandwidth means unlimited.
struct link_profile {
  std::string name = "none";  ///< "ib", "wan", ... or "custom"
  double bandwidth_bps = 0;   ///< bits per second (0 = unlimited)
  double latency_s = 0;       ///< added one-way delay (RTT grows by twice this)
  double jitter_s = 0;        ///< uniform extra delay in [0, jitter]
  double loss = 0;            ///< probability a message is lost once and retransmitted
  bool unshaped() const { return bandwidth_bps <= 0 && latency_s <= 0 && jitter_s <= 0 && loss <= 0; }
};

/// A named profile ("none", "ib", "roce", "ethernet", "wan", "consumer") or
/// explicit numbers "bw=100Mbit,lat=20ms,jitter=2ms,loss=0.1%" (units: bit,
/// Kbit, Mbit, Gbit per second; us, ms, s; loss in % or as a fraction).
/// Throws std::invalid_argument with the offending part.
link_profile parse_link_profile(std::string_view text);
/// "wan (1 Gbit/s, 2.5 ms one-way, jitter 0.5 ms, loss 0%)".
std::string describe(const link_profile& p);

/// The timing model of one shaped direction: messages leave in FIFO order;
/// each occupies the link for bytes*8/bandwidth, then arrives after the
/// latency plus jitter. A lost message costs one retransmission timeout
/// (max(3 x latency, 200 ms)) as on TCP, never disappears.
class link_shaper {
 public:
  explicit link_shaper(link_profile p = {}, std::uint64_t seed = 0);
  /// When a message of `bytes` handed over at `now` is to be delivered.
  /// Non-decreasing over successive calls (order is preserved).
  shaping_clock::time_point schedule(std::size_t bytes, shaping_clock::time_point now);
  const link_profile& profile() const { return profile_; }
  /// When the emulated link has finished transmitting everything scheduled
  /// so far (in the past when it is idle).
  shaping_clock::time_point link_free() const { return link_free_; }
  void set_profile(const link_profile& p) { profile_ = p; }

 private:
  link_profile profile_;
  shaping_clock::time_point link_free_{};
  shaping_clock::time_point last_due_{};
  std::mt19937_64 rng_;
};

}  // namespace corolla::net
