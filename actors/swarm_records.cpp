// Membership records as the swarm scheduler's state (actors/swarm_records.hpp).
#include "actors/swarm_records.hpp"

#include <algorithm>
#include <map>
#include <string>

namespace corolla {

using net::server_record;

swarm::swarm_state to_swarm_state(int n_blocks, const std::vector<server_record>& records) {
  swarm::swarm_state s;
  s.n_blocks = n_blocks;
  // Newest first, so an older record that overlaps an accepted one of the
  // same server is the one dropped.
  std::vector<const server_record*> order;
  for (const auto& r : records)
    if (r.state != server_state::offline) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const server_record* a, const server_record* b) {
    if (a->node_id != b->node_id) return a->node_id < b->node_id;
    return net::is_newer(*a, *b);
  });
  std::map<std::string, std::vector<block_range>> accepted;
  for (const server_record* r : order) {
    block_range span{std::max(r->span.start, 0), std::min(r->span.end, n_blocks)};
    if (span.length() == 0) continue;
    auto& taken = accepted[r->node_id];
    if (std::any_of(taken.begin(), taken.end(), [&](const block_range& t) { return t.overlaps(span); }))
      continue;
    taken.push_back(span);
    swarm::server_record out;
    out.id = r->node_id;
    out.span = span;
    out.state = r->state == server_state::online ? server_state::online : server_state::joining;
    out.throughput = r->throughput;
    out.cache_tokens_left = r->cache_tokens_left;
    out.step_s_per_block = r->step_s_per_block;
    out.relayed = !r->relay.empty();
    for (const auto& [id, ms] : r->rtt_ms) out.rtt_s.emplace(id, ms / 1000.0);
    s.servers.push_back(std::move(out));
  }
  return s;
}

std::string server_entry(const server_record& r) {
  std::string e = r.relay.empty() ? r.endpoint : r.node_id + "@" + r.endpoint;
  return r.public_key.empty() ? e : e + "#" + r.public_key;
}

}  // namespace corolla
