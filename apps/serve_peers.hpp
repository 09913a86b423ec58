// apps/serve_peers.hpp — what `corolla serve` measures of the swarm's other
// servers: its network speed (echoes against one of them) and its RTTs to
// the servers of the block after its span (what clients route on).
#pragma once

#include <map>
#include <string>

#include "net/server_record.hpp"

namespace corolla {
class node;
namespace net {
class membership;
}
}  // namespace corolla

namespace corolla::app {

/// Bits per second of this server's link, measured against another ONLINE
/// server that is reached directly (up to three are tried); 0 when none is
/// there yet or none could be measured (the caller tries again later).
double measure_network_bps(node& n, net::membership& members, const net::server_record& self, int n_blocks);

/// Round-trip times (ms) to the ONLINE servers of the block after `self`'s
/// span (servers behind NAT left out), as the links' heartbeats measure them.
std::map<std::string, double> next_server_rtts(node& n, net::membership& members, const net::server_record& self,
                                               int n_blocks);

}  // namespace corolla::app
