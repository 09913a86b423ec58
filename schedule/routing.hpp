// schedule/routing.hpp — which servers a client's requests go through.
//
// A route is a chain of (server, [start, end)) hops that together cover a
// range of blocks, usually the whole model [0, n_blocks), or for failover
// exactly the span a lost server held. Only ONLINE servers are used (JOINING
// ones are still loading).
//
// Min-latency routing (inference): Dijkstra over positions (record, block),
// "the hidden state is on this server, about to enter this block":
//   client/upstream -> server s at the first block   RTT/2 + hop overhead
//   s at block b -> s at block b+1                   s's step time per block
//   s at block b -> t at block b (t holds b)         RTT(s,t)/2 + hop overhead
//   s at the last block -> client/downstream         RTT/2 + hop overhead
// A server short of cache for the session pays a large penalty on entry (or
// is excluded). Switching servers in the middle of a span is allowed, so two
// overlapping servers are combined where that is cheaper; Petals forced a
// chain to the end of each span. RTTs come from the client's pings (client
// edges) and the servers' announced pings (server edges, either direction);
// unknown ones cost routing_params::unknown_rtt_s.
//
// Max-throughput routing (fine-tuning forward/backward, stateless): from the
// first block, repeatedly pick a server holding the current block at random
// with probability proportional to its throughput and ride it to the end of
// its span. Seeded, so tests and replays are reproducible.
//
// Exclusions are per call: the client passes the servers it wants to avoid
// right now (e.g. the one that just failed); nothing is banned for good.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "schedule/swarm.hpp"

namespace corolla::swarm {

/// One link of a route: `server` computes blocks [start, end).
struct route_hop {
  server_id server;
  int start = 0;
  int end = 0;
  /// False when the server announced less cache than the session needs (the
  /// route uses it only because nothing else holds these blocks).
  bool cache_ok = true;

  /// The blocks of this hop.
  block_range span() const { return {start, end}; }
  friend bool operator==(const route_hop&, const route_hop&) = default;
};

/// A chain of hops covering a range of blocks without gaps or overlaps, in
/// block order. Consecutive hops are on different servers.
struct route {
  std::vector<route_hop> hops;
  /// Predicted seconds for one decode step along the route: entry, compute,
  /// server-to-server and exit times plus hop overheads; cache penalties are
  /// NOT included (they steer the choice, they are not time). 0 for
  /// max-throughput routes (use predicted_latency()).
  double latency_s = 0.0;
};

/// "[0, 4) via a -> [4, 8) via b": for logs and the demo.
std::string to_string(const route& r);

/// Costs and defaults of min-latency routing.
struct routing_params {
  /// RTT assumed where nobody measured one (Petals: 0.15 s one way).
  double unknown_rtt_s = 0.3;
  /// Measured RTTs are capped here: an unreachable-looking server stays a last
  /// resort rather than vanishing from the graph.
  double max_rtt_s = 10.0;
  /// Step time per block for a server that announced none (Petals: 1/300 s).
  double default_step_s_per_block = 1.0 / 300.0;
  /// Fixed cost of every message between processes (serialisation, queues);
  /// also makes the route prefer fewer hops when latencies tie.
  double hop_overhead_s = 0.001;
  /// Added to every hand-off into or out of a server reached through a
  /// relay (server_record::relayed): the relay's extra leg and queues, and
  /// the client carrying the hand-off (servers do not push to relayed
  /// servers). Measured client RTTs to it include the leg already; this
  /// makes a directly reachable server win when latencies are close.
  double relay_penalty_s = 0.005;
  /// Added on entering a server that lacks cache for the session.
  double cache_penalty_s = 10.0;
  /// Drop servers lacking cache instead of penalising them.
  bool exclude_without_cache = false;
};

/// What a client asks min-latency routing for.
struct route_request {
  int start = 0;   ///< first block of the range
  int end = -1;    ///< one past the last block; -1 = n_blocks
  /// Tokens the session will keep in each server's attention cache (prompt +
  /// new tokens); compared with server_record::cache_tokens_left. 0 = no check.
  std::int64_t session_tokens = 0;
  /// The client's measured RTTs (seconds) to servers, by id.
  std::map<server_id, double> client_rtt_s;
  /// Servers not to use in this call.
  std::set<server_id> excluded;
  /// Failover of a middle span: the server whose output enters the range
  /// (its announced pings price the entry) instead of the client.
  std::optional<server_id> upstream;
  /// The server that receives the range's output (priced by pings) instead
  /// of the client.
  std::optional<server_id> downstream;
};

/// The lowest-latency chain covering [start, end) (see the file comment).
/// Deterministic: ties resolve by server id. start == end gives an empty
/// route. Errors: invalid swarm; invalid_argument for a range outside
/// [0, n_blocks) or negative session_tokens; no_server_for_block (naming the
/// first block no usable ONLINE server holds, with how many were excluded by
/// the caller or for lack of cache).
result<route> min_latency_route(const swarm_state& swarm, const route_request& request,
                                const routing_params& params = {});

/// The latency min_latency_route() would predict for `hops` under `request`
/// (e.g. to compare the current route with a fresh one). Errors when the
/// hops are not contiguous over the request's range or a hop's blocks are not
/// held by ONLINE records of its server.
result<double> predicted_latency(const swarm_state& swarm, const std::vector<route_hop>& hops,
                                 const route_request& request, const routing_params& params = {});

/// What a fine-tuning client asks max-throughput routing for.
struct throughput_route_request {
  int start = 0;  ///< first block of the range
  int end = -1;   ///< one past the last block; -1 = n_blocks
  std::set<server_id> excluded;  ///< servers not to use in this call
};

/// A random chain over [start, end): at each block still to cover, a server
/// holding it is drawn with probability proportional to its throughput (all
/// equal when every candidate announces 0) and used to the end of its span.
/// Draws from `rng` with a portable mapping (the same seed gives the same
/// route on every platform). Errors as min_latency_route().
result<route> max_throughput_route(const swarm_state& swarm, const throughput_route_request& request,
                                   std::mt19937_64& rng);

}  // namespace corolla::swarm
