// actors/link_probe.hpp — measuring a link's bandwidth with real traffic:
// what a server whose NIC speed cannot be read (a VM, Wi-Fi, most consumer
// machines) announces as its network side, as Petals measures its own with
// a speed test. The peer needs nothing but the echo actor every node
// publishes.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include <caf/expected.hpp>

namespace corolla {

class node;

/// How to probe.
struct link_probe_options {
  std::size_t bytes = 2 << 20;  ///< payload of each large echo (travels there and back)
  int rounds = 2;               ///< echoes of each size; the fastest counts
  std::chrono::milliseconds timeout{20000};  ///< per echo
};

/// What a probe measured.
struct link_probe_result {
  double bps = 0;       ///< bits per second, both directions averaged
  double rtt_s = 0;     ///< the fastest small echo
  double payload_s = 0;  ///< the fastest large echo
};

/// Measures the link from `n` to the connected peer `peer`: `rounds` small
/// echoes, then `rounds` echoes of `bytes`; the fastest large echo minus
/// the fastest small one is the time to carry 2 x `bytes` (there and back),
/// so bps = 16 x bytes / (payload_s - rtt_s). Errors: the peer's (not
/// connected, no echo actor, timeout), or errc::invalid_argument when the
/// large echo was not slower than the small one (the link is too fast for
/// the payload to tell).
caf::expected<link_probe_result> probe_link(node& n, const std::string& peer, const link_probe_options& o = {});

/// The fastest of `rounds` empty echoes to the connected peer `peer`, in
/// seconds (each within `timeout`): its round-trip time, as a request sees
/// it (the peer's node and echo actor included).
caf::expected<double> echo_rtt(node& n, const std::string& peer, int rounds = 3,
                               std::chrono::milliseconds timeout = std::chrono::seconds(2));

}  // namespace corolla
