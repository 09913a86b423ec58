// schedule/block_selection.hpp — which blocks a swarm server serves, and when
// it moves.
//
// Three decisions, all pure functions of a swarm_state (schedule/swarm.hpp):
//
// 1. Joining: a new server takes the window of consecutive blocks that needs
//    it most: the window whose sorted block throughputs are lexicographically
//    smallest (gaps first, then the weakest blocks), leftmost on ties
//    (choose_blocks). With a memory budget instead of a block count it first
//    takes as many blocks as fit (choose_blocks_for_memory).
//
// 2. Rebalancing: every minute or two (the runtime randomises the period) a
//    server asks should_move(): it simulates leaving, re-chooses its best
//    window, lets the other servers re-choose greedily for a few rounds, and
//    moves only when the simulated bottleneck beats today's by more than a
//    threshold AND the move on its own already makes the swarm strictly better
//    (see docs/swarm_scheduling.md for why that second rule ends oscillation).
//
// 3. Moving without a gap: plan_move() lists what the server announces in each
//    phase (new blocks JOINING while the old span serves, both ONLINE, then the
//    old span leaves) and check_move() verifies that no block that clients can
//    route through today loses its last ONLINE server in any phase. The
//    runtime calls check_move() again with a fresh view right before leaving
//    the old span, and waits while it says unsafe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "schedule/swarm.hpp"

namespace corolla::swarm {

/// Where a joining server should go, and what it changes.
struct block_choice {
  block_range span;                ///< the blocks to load
  double throughput_before = 0;   ///< swarm_throughput() without this server
  double throughput_after = 0;    ///< swarm_throughput() once it serves `span`
};

/// The window of `num_blocks` consecutive blocks a joining server should
/// cover: among all windows inside [0, n_blocks), the one whose block
/// throughputs, sorted ascending, are lexicographically smallest, where a
/// block no ONLINE/JOINING server holds ranks below every covered block (so
/// gaps are filled first). Ties (within a relative 1e-9) go to the leftmost
/// window; an empty swarm therefore starts at block 0. `num_blocks` larger
/// than the model is clamped to n_blocks. Records of `self` (a server
/// re-joining under its own id) are ignored. `my_throughput` (tokens/s, >= 0)
/// only feeds throughput_after. Errors: invalid swarm, num_blocks < 1,
/// negative or non-finite my_throughput.
result<block_choice> choose_blocks(const swarm_state& swarm, int num_blocks, double my_throughput,
                                   const server_id& self = {});

/// Memory a server can give to blocks. All sizes in bytes.
struct memory_budget {
  std::uint64_t available_bytes = 0;        ///< memory for weights, cache and workspace
  std::uint64_t bytes_per_block = 0;        ///< weights of one block (> 0)
  std::uint64_t cache_bytes_per_block = 0;  ///< attention cache budget set aside per hosted block
  std::uint64_t reserved_bytes = 0;         ///< workspace/activations, independent of the block count
};

/// The most blocks that fit: floor((available - reserved) / (bytes_per_block
/// + cache_bytes_per_block)), at most n_blocks. Error not_enough_memory (with
/// the numbers) when not even one block fits; invalid_argument when
/// bytes_per_block is 0 or n_blocks < 1.
result<int> blocks_that_fit(const memory_budget& memory, int n_blocks);

/// The attention-cache tokens `blocks` blocks get from `memory`: what is
/// left after their weights and the reserve, shared by the blocks at
/// `kv_bytes_per_token` (one token's keys and values in one block), in whole
/// pages of `page_tokens`; never fewer than `min_tokens` (what
/// cache_bytes_per_block was set aside for when the blocks were counted).
/// So a server whose budget holds every block of a model gives the rest to
/// its cache instead of leaving it unused. Errors: invalid_argument for
/// blocks < 1, kv_bytes_per_token 0, page_tokens < 1 or min_tokens < 0.
result<std::int64_t> cache_tokens_that_fit(const memory_budget& memory, int blocks, std::uint64_t kv_bytes_per_token,
                                           int page_tokens, std::int64_t min_tokens);

/// choose_blocks() with num_blocks = blocks_that_fit(memory, swarm.n_blocks).
/// `my_throughput` is what the server will announce for that many blocks.
result<block_choice> choose_blocks_for_memory(const swarm_state& swarm, const memory_budget& memory,
                                              double my_throughput, const server_id& self = {});

/// Knobs of the periodic rebalancing check.
struct rebalance_params {
  /// Move only when simulated_throughput / throughput_now > 1 + min_improvement.
  /// 0.25: above the 1.1/0.9 ~ 1.22 ratio that two +-10% throughput
  /// measurements can fake, below Petals' 1/0.75 because our moves never
  /// open a gap (see docs/swarm_scheduling.md).
  double min_improvement = 0.25;
  /// Rounds of the local search in which the other servers re-choose.
  int local_search_rounds = 16;
  /// Bounds of the randomised period between checks, for the runtime.
  double check_period_min_s = 60.0;
  double check_period_max_s = 120.0;
};

/// Why should_move() decided as it did.
enum class rebalance_reason {
  move_fills_gap,       ///< move: the swarm has a gap and the move shrinks it
  move_improves,        ///< move: bottleneck gain beyond the threshold
  invalid_swarm,        ///< stay: the description is inconsistent
  unknown_server,       ///< stay: no ONLINE/JOINING record of this server
  move_in_progress,     ///< stay: the server already announces several records
  not_online,           ///< stay: still JOINING (loading)
  sole_server,          ///< stay: leaving would open a gap (explanation names the block)
  already_best,         ///< stay: its current window is already the best one
  not_better_now,       ///< stay: the move alone would not make the swarm strictly better
  below_threshold,      ///< stay: simulated gain not above the threshold
};

/// "move_improves", ...: for logs.
const char* to_string(rebalance_reason r);

/// The outcome of one rebalancing check.
struct rebalance_decision {
  bool move = false;               ///< true: go to `target` (with plan_move)
  rebalance_reason reason = rebalance_reason::already_best;
  block_range current;              ///< the span served now
  block_range target;               ///< the span to serve (== current when !move)
  double throughput_now = 0;       ///< swarm throughput today
  double throughput_immediate = 0; ///< once this server moved, nobody else
  double throughput_simulated = 0; ///< once the others also re-chose (local search)
  std::string explanation;         ///< one line for the log
};

/// The periodic check of server `self` (one ONLINE record of span length k):
///  1. remove its throughput; if it is the only ONLINE/JOINING server of some
///     block, stay (sole_server): leaving would open a gap;
///  2. choose its best window of length k as choose_blocks() does, preferring
///     its current window on ties (hysteresis); unchanged -> already_best;
///  3. the move alone must make the sorted vector of block throughputs
///     (gaps lowest) lexicographically strictly larger, else not_better_now;
///  4. local search: the other servers, in id order, each re-choose greedily
///     under the same rules (never opening a gap, only strict improvements),
///     up to local_search_rounds rounds or until nobody moves;
///  5. move when the swarm has a gap today and the move shrinks it, or when
///     simulated / now > 1 + min_improvement.
/// Deterministic: the same swarm gives the same decision.
rebalance_decision should_move(const swarm_state& swarm, const server_id& self,
                               const rebalance_params& params = {});

/// The phases of a move, in order.
enum class move_phase {
  joining,       ///< old span ONLINE, new blocks announced JOINING and loading
  serving_both,  ///< old span and new blocks ONLINE
  left_old,      ///< only the new span ONLINE; blocks dropped are announced OFFLINE
};

/// "joining", "serving_both", "left_old".
const char* to_string(move_phase p);

/// One phase of a move: what the moving server announces, and the swarm as
/// it then looks.
struct move_step {
  move_phase phase = move_phase::joining;
  std::vector<server_record> records;  ///< the moving server's records in this phase
  swarm_state swarm;                   ///< the whole swarm during this phase
};

/// The announcements of server `self` moving from its single record to
/// `target` (which may overlap the old span): joining, serving_both,
/// left_old. Records keep the server's throughput, cache, step time and
/// pings. Errors: invalid swarm, unknown server, several records (a move in
/// progress), target empty or outside [0, n_blocks).
result<std::vector<move_step>> plan_move(const swarm_state& swarm, const server_id& self,
                                         block_range target);

/// Whether a planned move keeps clients served.
struct move_check {
  bool safe = false;
  std::optional<move_phase> failing_phase;  ///< the first phase that loses a block
  std::vector<int> uncovered_blocks;        ///< blocks that lose their last ONLINE server there
  std::string message;                      ///< why unsafe (empty when safe)
};

/// Checks plan_move(swarm, self, target): every block that has an ONLINE
/// server today keeps at least one in every phase. (Blocks that already have
/// none stay out of the check: a move may fill a gap, never open one.)
/// Unsafe with a message when the plan itself is an error.
move_check check_move(const swarm_state& swarm, const server_id& self, block_range target);

}  // namespace corolla::swarm
