// schedule/swarm.hpp — a description of a serving swarm, as the scheduling
// algorithms see it.
//
// A swarm serves one model of `n_blocks` transformer blocks. Each server
// record says which contiguous span of blocks a server holds, whether it is
// JOINING (loading), ONLINE (serving) or OFFLINE (leaving/gone), how much it
// can serve (throughput), how much attention cache it has left, how fast one
// decode step runs per block, and the round-trip times it measured to other
// servers. The runtime builds a swarm_state from the membership records (DHT)
// and hands it to block selection (schedule/block_selection.hpp) and routing
// (schedule/routing.hpp); nothing here talks to the network.
//
// Units: throughput in tokens/s (see server_record::throughput), times in
// seconds, cache in tokens.
//
// Several records may carry the same server id: a server in the middle of a
// move announces its old span ONLINE and its new blocks JOINING. Records of
// one server never overlap (validate() checks it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "model/block_range.hpp"
#include "model/outcome.hpp"
#include "model/server_state.hpp"

namespace corolla::swarm {

/// A server's identity in the swarm (its peer id or listen address). The
/// algorithms only compare ids; they never parse them.
using server_id = std::string;

/// One server record: a span of blocks held by one server.
struct server_record {
  server_id id;
  block_range span;
  server_state state = server_state::online;
  /// Tokens per second this server can push through its whole span: the
  /// smaller of its compute rate (tokens/s through one block divided by the
  /// number of blocks it holds) and its network rate (hidden states per
  /// second its link carries). Additive: a block's capacity is the sum over
  /// the servers holding it. See announced_throughput(). >= 0.
  double throughput = 0.0;
  /// Tokens of attention cache a NEW session could still get over this
  /// server's whole span; -1 when unknown (never penalised).
  std::int64_t cache_tokens_left = -1;
  /// Seconds one decode step (one token of one session) takes per block on
  /// this server (1 / inference rate); 0 when unknown (routing then uses its
  /// default).
  double step_s_per_block = 0.0;
  /// Round-trip times in seconds this server measured to other servers
  /// (moving averages of its pings), by server id. Missing = unknown.
  std::map<server_id, double> rtt_s;
  /// Reached through a relay (a server behind NAT): every message to or
  /// from it takes one more leg, which routing prices
  /// (routing_params::relay_penalty_s).
  bool relayed = false;
};

/// The swarm as one observer sees it at one moment.
struct swarm_state {
  /// Transformer blocks of the model (> 0).
  int n_blocks = 0;
  /// Every known record, in any order (algorithms order by id themselves,
  /// so the order here never changes a decision).
  std::vector<server_record> servers;

  /// The records of server `id` (empty when unknown).
  std::vector<const server_record*> records_of(const server_id& id) const;
};

/// What went wrong when a scheduling question has no answer.
enum class schedule_errc {
  invalid_swarm,        ///< the swarm description is inconsistent (see message)
  invalid_argument,     ///< a parameter is out of range (see message)
  unknown_server,       ///< the named server has no usable record
  no_server_for_block,  ///< no usable server holds `block`
  not_enough_memory,    ///< not even one block fits in the memory given
};

/// A scheduling failure: a code for the program and one complete sentence
/// for the user.
struct schedule_error {
  schedule_errc code = schedule_errc::invalid_argument;
  int block = -1;       ///< the block concerned (no_server_for_block), else -1
  std::string message;  ///< complete, names the values involved
};

/// A value or a schedule_error (model/outcome.hpp): errors are values inside
/// the runtime, so the actors that call the scheduler never catch exceptions.
template <class T>
using result = outcome<T, schedule_error>;

/// Checks the description: n_blocks > 0; every id non-empty; every span
/// non-empty and inside [0, n_blocks); throughput finite and >= 0;
/// step_s_per_block finite and >= 0; records of one id do not overlap.
/// Returns the first problem found, or nothing.
std::optional<schedule_error> validate(const swarm_state& swarm);

/// True for the states that count for balancing (ONLINE and JOINING).
inline bool counts_for_balancing(server_state s) { return s != server_state::offline; }

/// Per-block capacity: throughput[b] = sum of the throughputs of the ONLINE
/// and JOINING records holding block b. Sums run in server-id order, so the
/// same set of servers always gives bit-identical numbers (a different float
/// rounding must never trigger a move). Spans are clipped to [0, n_blocks).
std::vector<double> block_throughputs(const swarm_state& swarm);

/// Per-block count of ONLINE and JOINING records holding each block (0 = a
/// gap for balancing).
std::vector<int> block_coverage(const swarm_state& swarm);

/// Per-block count of ONLINE records (0 = no client can route through).
std::vector<int> online_coverage(const swarm_state& swarm);

/// The swarm's bottleneck: the minimum block throughput, and 0 when some
/// block has no ONLINE or JOINING server.
double swarm_throughput(const swarm_state& swarm);

/// The blocks no ONLINE or JOINING server holds, ascending.
std::vector<int> uncovered_blocks(const swarm_state& swarm);

/// The throughput a server announces (tokens/s through its whole span):
/// min(compute_tokens_per_s / n_blocks, network_tokens_per_s), where
/// compute_tokens_per_s is its measured forward rate through ONE block and
/// network_tokens_per_s the hidden states per second its link carries
/// (bandwidth / bytes per hidden state). A network rate of 0 means unknown
/// (the NIC's speed cannot be read: VMs, Wi-Fi, many consumer machines):
/// the compute figure alone, never 0, so such servers still count in block
/// selection and rebalancing. Returns 0 for n_blocks <= 0 or a non-positive
/// compute rate.
double announced_throughput(double compute_tokens_per_s, int n_blocks,
                            double network_tokens_per_s);

/// The swarm with every record of `id` replaced by one ONLINE record over
/// `span` (keeping the first record's throughput, cache, step time and
/// pings): what the swarm looks like once a move has completed. Unknown ids
/// leave the swarm unchanged.
swarm_state with_server_moved(const swarm_state& swarm, const server_id& id, block_range span);

}  // namespace corolla::swarm
