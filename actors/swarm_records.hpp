// actors/swarm_records.hpp — the swarm's membership records (net/, read
// from the DHT) as the swarm scheduler of schedule/ sees them. Here, above
// both layers: net/ knows nothing of schedule/.
#pragma once

#include <string>
#include <vector>

#include "net/server_record.hpp"
#include "schedule/swarm.hpp"

namespace corolla {

/// The swarm as schedule/ sees it: node_id -> id, span, state, throughput,
/// cache, step time, rtt_ms / 1000 -> rtt_s. OFFLINE records are left out
/// (every algorithm ignores them). Spans are clipped to [0, n_blocks) and
/// records outside are dropped. Where records of one server overlap (a move
/// in progress seen half-propagated), the newest wins and older overlapping
/// ones are dropped, so swarm::validate's no-overlap rule holds.
swarm::swarm_state to_swarm_state(int n_blocks, const std::vector<net::server_record>& records);

/// How a swarm client is told of the server a record announces
/// (swarm_client_options::servers): "ENDPOINT", "ENDPOINT#KEY", or for a
/// server behind NAT "NODE_ID@RELAY_ENDPOINT[#RELAY_KEY]".
std::string server_entry(const net::server_record& r);

}  // namespace corolla
