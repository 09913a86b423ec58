// What `corolla serve` measures of the swarm's other servers (apps/serve_peers.hpp).
#include "apps/serve_peers.hpp"

#include <chrono>

#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/link_probe.hpp"
#include "net/membership.hpp"

namespace corolla::app {

/// Measures the network against another ONLINE server of the swarm (the
/// first of up to three that answers; probe_link: echoes of 1 MiB there and
/// back): bits per second, or 0 when no server is there yet or none could
/// be measured (the caller tries again later).
double measure_network_bps(node& n, net::membership& members, const net::server_record& self, int n_blocks) {
  int tried = 0;
  for (const net::server_record& r : members.get_span(self.model, 0, n_blocks)) {
    if (r.node_id == n.id() || r.state != server_state::online || r.endpoint.empty() || !r.relay.empty())
      continue;
    if (++tried > 3) break;
    connect_options co;
    co.timeout = std::chrono::seconds(2);
    co.server_key = r.public_key;
    if (!n.peer_is_up(r.node_id))
      if (auto c = n.connect(r.endpoint, co); !c) {
        spdlog::debug("serve: cannot reach {} to measure the network: {}", r.node_id, error_message(c.error()));
        continue;
      }
    link_probe_options po;
    po.bytes = 1 << 20;
    po.timeout = std::chrono::seconds(5);
    auto m = probe_link(n, r.node_id, po);
    if (!m) {
      spdlog::debug("serve: measuring the network against {} failed: {}", r.node_id, error_message(m.error()));
      continue;
    }
    spdlog::info("serve: measured {:.0f} Mbit/s to {} (echo of {} KiB in {:.1f} ms, round trip {:.2f} ms)",
                 m->bps / 1e6, r.node_id, po.bytes >> 10, m->payload_s * 1e3, m->rtt_s * 1e3);
    return m->bps;
  }
  return 0;
}

/// Round-trip times (ms) to the ONLINE servers of the block after this
/// server's span, as its links' heartbeats measure them (a link is dialled
/// to each the first time; its RTT counts from the next call): what clients
/// route on between consecutive servers (Petals' next_pings).
std::map<std::string, double> next_server_rtts(node& n, net::membership& members, const net::server_record& self,
                                               int n_blocks) {
  std::map<std::string, double> rtts;
  const int next = self.span.end;
  if (next >= n_blocks) return rtts;
  for (const net::server_record& r : members.get_span(self.model, next, next + 1)) {
    if (rtts.size() >= net::max_rtt_entries) break;
    if (r.node_id == n.id() || r.state != server_state::online || r.endpoint.empty() || !r.relay.empty())
      continue;
    if (!n.peer_is_up(r.node_id)) {
      // Dialled without waiting (the serve loop must keep answering stop
      // signals); its RTT is there at the next update.
      connect_options co;
      co.timeout = std::chrono::seconds(2);
      co.server_key = r.public_key;
      if (auto c = n.connect_async(r.endpoint, co); !c)
        spdlog::debug("serve: cannot dial next server {} at {}: {}", r.node_id, r.endpoint, error_message(c.error()));
      continue;
    }
    if (auto st = n.stats(r.node_id); st && st->rtt_samples > 0) rtts[r.node_id] = st->rtt_us / 1000.0;
  }
  return rtts;
}

}  // namespace corolla::app
