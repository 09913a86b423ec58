// schedule/block_selection.cpp — joining, rebalancing and gap-free moves.
#include "schedule/block_selection.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace corolla::swarm {

namespace {

// Throughputs within a relative 1e-9 are equal: sums of the same servers in a
// different order, or after add/remove in a simulation, differ in the last
// bits, and such noise must neither break a tie nor trigger a move.
bool nearly_equal(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)) + 1e-12;
}

// -1, 0, +1 comparing two equally long ascending vectors lexicographically,
// elements compared with nearly_equal.
int lex_compare(const std::vector<double>& a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (nearly_equal(a[i], b[i])) continue;
    return a[i] < b[i] ? -1 : 1;
  }
  return 0;
}

// Per-block capacity of a (possibly simulated) swarm: throughput sums and the
// number of ONLINE/JOINING servers per block. Coverage is counted, never
// inferred from throughput, so a server announcing 0 still closes a gap.
struct capacity {
  std::vector<double> tp;
  std::vector<int> cover;

  explicit capacity(const swarm_state& s) : tp(block_throughputs(s)), cover(block_coverage(s)) {}

  int n() const { return static_cast<int>(tp.size()); }
  void add(block_range span, double t) {
    for (int b = span.start; b < span.end; ++b) tp[b] += t, ++cover[b];
  }
  void remove(block_range span, double t) {
    for (int b = span.start; b < span.end; ++b) tp[b] -= t, --cover[b];
  }
  // A gap ranks below every covered block, whatever its throughput.
  double key(int b) const { return cover[b] == 0 ? -1.0 : std::max(tp[b], 0.0); }
  std::vector<double> sorted_keys(block_range span) const {
    std::vector<double> k;
    k.reserve(span.length());
    for (int b = span.start; b < span.end; ++b) k.push_back(key(b));
    std::sort(k.begin(), k.end());
    return k;
  }
  std::vector<double> potential() const { return sorted_keys({0, n()}); }
  double bottleneck() const {
    double m = std::numeric_limits<double>::infinity();
    for (int b = 0; b < n(); ++b) m = cover[b] == 0 ? 0.0 : std::min(m, std::max(tp[b], 0.0));
    return n() == 0 ? 0.0 : m;
  }
  int gaps() const { return static_cast<int>(std::count(cover.begin(), cover.end(), 0)); }
  // The first block of `span` nobody else holds (-1 when none).
  int first_gap_in(block_range span) const {
    for (int b = span.start; b < span.end; ++b)
      if (cover[b] == 0) return b;
    return -1;
  }
};

// The start of the weakest window of length k (lexicographically smallest
// sorted keys), leftmost on ties, or `prefer` when it ties with the best.
int best_start(const capacity& cap, int k, int prefer = -1) {
  int best = 0;
  std::vector<double> best_keys = cap.sorted_keys({0, k});
  for (int s = 1; s + k <= cap.n(); ++s) {
    auto keys = cap.sorted_keys({s, s + k});
    if (lex_compare(keys, best_keys) < 0) best = s, best_keys = std::move(keys);
  }
  if (prefer >= 0 && prefer + k <= cap.n() && prefer != best &&
      lex_compare(cap.sorted_keys({prefer, prefer + k}), best_keys) == 0)
    return prefer;
  return best;
}

// One greedy re-choice of a server at `span` with throughput t in a
// simulation: leave (unless that opens a gap), take the best window, and keep
// the new place only if the swarm became strictly better. Returns whether it
// moved; `span` is updated.
bool rechoose(capacity& cap, block_range& span, double t) {
  const auto before = cap.potential();
  cap.remove(span, t);
  const int k = span.length();
  const int s = cap.first_gap_in(span) >= 0 ? span.start : best_start(cap, k, span.start);
  if (s != span.start) {
    cap.add({s, s + k}, t);
    if (lex_compare(cap.potential(), before) > 0) {
      span = {s, s + k};
      return true;
    }
    cap.remove({s, s + k}, t);
  }
  cap.add(span, t);
  return false;
}

std::string fmt(double x) {
  std::ostringstream o;
  o.precision(4);
  o << x;
  return o.str();
}

schedule_error bad_argument(std::string message) {
  return schedule_error{schedule_errc::invalid_argument, -1, std::move(message)};
}

}  // namespace

result<block_choice> choose_blocks(const swarm_state& swarm, int num_blocks, double my_throughput,
                                   const server_id& self) {
  if (auto e = validate(swarm)) return *e;
  if (num_blocks < 1)
    return bad_argument("a server must hold at least one block (asked for " + std::to_string(num_blocks) + ")");
  if (!std::isfinite(my_throughput) || my_throughput < 0)
    return bad_argument("throughput " + std::to_string(my_throughput) + " is not a finite number >= 0");
  swarm_state others = swarm;
  std::erase_if(others.servers, [&](const server_record& r) { return !self.empty() && r.id == self; });
  const int k = std::min(num_blocks, swarm.n_blocks);
  capacity cap(others);
  block_choice c;
  c.throughput_before = cap.bottleneck();
  const int s = best_start(cap, k);
  c.span = {s, s + k};
  cap.add(c.span, my_throughput);
  c.throughput_after = cap.bottleneck();
  return c;
}

result<int> blocks_that_fit(const memory_budget& m, int n_blocks) {
  if (n_blocks < 1) return bad_argument("the model has " + std::to_string(n_blocks) + " blocks");
  if (m.bytes_per_block == 0) return bad_argument("bytes_per_block is 0; a block has weights");
  const std::uint64_t per_block = m.bytes_per_block + m.cache_bytes_per_block;
  const std::uint64_t usable = m.available_bytes > m.reserved_bytes ? m.available_bytes - m.reserved_bytes : 0;
  const std::uint64_t fit = usable / per_block;
  if (fit == 0)
    return schedule_error{schedule_errc::not_enough_memory, -1,
                          "not even one block fits: " + std::to_string(m.available_bytes) +
                              " bytes available, " + std::to_string(m.reserved_bytes) + " reserved, " +
                              std::to_string(per_block) + " needed per block (" +
                              std::to_string(m.bytes_per_block) + " weights + " +
                              std::to_string(m.cache_bytes_per_block) + " cache)"};
  return static_cast<int>(std::min<std::uint64_t>(fit, static_cast<std::uint64_t>(n_blocks)));
}

result<std::int64_t> cache_tokens_that_fit(const memory_budget& m, int blocks, std::uint64_t kv_bytes_per_token,
                                           int page_tokens, std::int64_t min_tokens) {
  if (blocks < 1) return bad_argument("a server must hold at least one block (asked for " + std::to_string(blocks) + ")");
  if (kv_bytes_per_token == 0) return bad_argument("kv_bytes_per_token is 0; a cached token has keys and values");
  if (page_tokens < 1) return bad_argument("page_tokens must be at least 1, got " + std::to_string(page_tokens));
  if (min_tokens < 0) return bad_argument("min_tokens must be >= 0, got " + std::to_string(min_tokens));
  const std::uint64_t weights = m.bytes_per_block * static_cast<std::uint64_t>(blocks);
  const std::uint64_t taken = m.reserved_bytes + weights;
  const std::uint64_t left = m.available_bytes > taken ? m.available_bytes - taken : 0;
  const std::uint64_t page_bytes = kv_bytes_per_token * static_cast<std::uint64_t>(blocks) *
                                   static_cast<std::uint64_t>(page_tokens);
  const auto tokens = static_cast<std::int64_t>(left / page_bytes * static_cast<std::uint64_t>(page_tokens));
  return std::max(tokens, min_tokens);
}

result<block_choice> choose_blocks_for_memory(const swarm_state& swarm, const memory_budget& memory,
                                              double my_throughput, const server_id& self) {
  if (auto e = validate(swarm)) return *e;
  auto n = blocks_that_fit(memory, swarm.n_blocks);
  if (!n) return n.error();
  return choose_blocks(swarm, n.value(), my_throughput, self);
}

const char* to_string(rebalance_reason r) {
  switch (r) {
    case rebalance_reason::move_fills_gap: return "move_fills_gap";
    case rebalance_reason::move_improves: return "move_improves";
    case rebalance_reason::invalid_swarm: return "invalid_swarm";
    case rebalance_reason::unknown_server: return "unknown_server";
    case rebalance_reason::move_in_progress: return "move_in_progress";
    case rebalance_reason::not_online: return "not_online";
    case rebalance_reason::sole_server: return "sole_server";
    case rebalance_reason::already_best: return "already_best";
    case rebalance_reason::not_better_now: return "not_better_now";
    case rebalance_reason::below_threshold: return "below_threshold";
  }
  return "unknown";
}

rebalance_decision should_move(const swarm_state& swarm, const server_id& self, const rebalance_params& params) {
  rebalance_decision d;
  auto stay = [&](rebalance_reason why, std::string text) {
    d.move = false;
    d.reason = why;
    d.target = d.current;
    d.explanation = std::move(text);
    return d;
  };
  if (auto e = validate(swarm)) return stay(rebalance_reason::invalid_swarm, e->message);

  std::vector<const server_record*> mine;
  for (const auto* r : swarm.records_of(self))
    if (counts_for_balancing(r->state)) mine.push_back(r);
  if (mine.empty()) return stay(rebalance_reason::unknown_server, "no ONLINE or JOINING record of '" + self + "'");
  d.current = mine.front()->span;
  if (mine.size() > 1)
    return stay(rebalance_reason::move_in_progress, "'" + self + "' announces several spans: a move is in progress");
  const server_record& me = *mine.front();
  if (me.state != server_state::online)
    return stay(rebalance_reason::not_online, "'" + self + "' is still JOINING");

  capacity cap(swarm);
  d.throughput_now = cap.bottleneck();
  d.throughput_immediate = d.throughput_simulated = d.throughput_now;
  const auto potential_now = cap.potential();
  const int gaps_now = cap.gaps();
  const int k = me.span.length();

  // 1. Simulate leaving.
  cap.remove(me.span, me.throughput);
  if (int b = cap.first_gap_in(me.span); b >= 0)
    return stay(rebalance_reason::sole_server,
                "'" + self + "' is the only server of block " + std::to_string(b) + "; leaving would open a gap");

  // 2. Best window, current one on ties.
  const int s = best_start(cap, k, me.span.start);
  if (s == me.span.start) return stay(rebalance_reason::already_best, "already on the weakest window " + to_string(me.span));
  const block_range target{s, s + k};

  // 3. The move alone must make the swarm strictly better: the sorted block
  //    throughputs are a potential that grows with every move, so moves
  //    cannot cycle (docs/swarm_scheduling.md).
  cap.add(target, me.throughput);
  d.throughput_immediate = cap.bottleneck();
  const int gaps_after = cap.gaps();
  if (lex_compare(cap.potential(), potential_now) <= 0)
    return stay(rebalance_reason::not_better_now,
                "moving to " + to_string(target) + " alone would not raise the weakest blocks");

  // 4. Local search: the other ONLINE servers (one record each) re-choose
  //    greedily, in id order, under the same rules.
  struct mover {
    const server_record* rec;
    block_range span;
  };
  std::vector<mover> others;
  for (const auto& r : swarm.servers)
    if (r.id != self && r.state == server_state::online && swarm.records_of(r.id).size() == 1)
      others.push_back({&r, r.span});
  std::sort(others.begin(), others.end(), [](const mover& a, const mover& b) { return a.rec->id < b.rec->id; });
  for (int round = 0; round < params.local_search_rounds; ++round) {
    bool moved = false;
    for (auto& o : others) moved |= rechoose(cap, o.span, o.rec->throughput);
    if (!moved) break;
  }
  d.throughput_simulated = cap.bottleneck();

  // 5. Decide.
  if (gaps_now > 0) {
    if (gaps_after < gaps_now) {
      d.move = true;
      d.reason = rebalance_reason::move_fills_gap;
      d.target = target;
      d.explanation = "moving " + to_string(me.span) + " -> " + to_string(target) + " fills " +
                      std::to_string(gaps_now - gaps_after) + " of " + std::to_string(gaps_now) + " uncovered blocks";
      return d;
    }
    return stay(rebalance_reason::below_threshold, "the swarm has gaps this move does not fill");
  }
  const double ratio = d.throughput_simulated / d.throughput_now;
  if (!(ratio > 1.0 + params.min_improvement) || nearly_equal(ratio, 1.0 + params.min_improvement))
    return stay(rebalance_reason::below_threshold,
                "moving to " + to_string(target) + " would raise the bottleneck only " + fmt(d.throughput_now) +
                    " -> " + fmt(d.throughput_simulated) + " tokens/s (x" + fmt(ratio) + ", threshold x" +
                    fmt(1.0 + params.min_improvement) + ")");
  d.move = true;
  d.reason = rebalance_reason::move_improves;
  d.target = target;
  d.explanation = "moving " + to_string(me.span) + " -> " + to_string(target) + " raises the bottleneck " +
                  fmt(d.throughput_now) + " -> " + fmt(d.throughput_simulated) + " tokens/s (x" + fmt(ratio) + ")";
  return d;
}

const char* to_string(move_phase p) {
  switch (p) {
    case move_phase::joining: return "joining";
    case move_phase::serving_both: return "serving_both";
    case move_phase::left_old: return "left_old";
  }
  return "unknown";
}

namespace {

// The parts of `a` outside `b`: zero, one or two spans.
std::vector<block_range> minus(block_range a, block_range b) {
  std::vector<block_range> out;
  if (b.empty() || b.end <= a.start || a.end <= b.start) {
    if (!a.empty()) out.push_back(a);
    return out;
  }
  if (a.start < b.start) out.push_back({a.start, b.start});
  if (b.end < a.end) out.push_back({b.end, a.end});
  return out;
}

}  // namespace

result<std::vector<move_step>> plan_move(const swarm_state& swarm, const server_id& self, block_range target) {
  if (auto e = validate(swarm)) return *e;
  if (target.empty() || target.start < 0 || target.end > swarm.n_blocks)
    return bad_argument("move target " + to_string(target) + " is not a non-empty part of [0, " +
                        std::to_string(swarm.n_blocks) + ")");
  std::vector<const server_record*> mine;
  for (const auto* r : swarm.records_of(self))
    if (counts_for_balancing(r->state)) mine.push_back(r);
  if (mine.empty())
    return schedule_error{schedule_errc::unknown_server, -1, "no ONLINE or JOINING record of '" + self + "'"};
  if (mine.size() > 1)
    return bad_argument("'" + self + "' announces several spans: a move is already in progress");
  const server_record& me = *mine.front();

  swarm_state others{swarm.n_blocks, {}};
  for (const auto& r : swarm.servers)
    if (r.id != self) others.servers.push_back(r);
  auto record = [&](block_range span, server_state state) {
    server_record r = me;
    r.span = span;
    r.state = state;
    return r;
  };
  auto step = [&](move_phase phase, std::vector<server_record> records) {
    move_step st{phase, std::move(records), others};
    st.swarm.servers.insert(st.swarm.servers.end(), st.records.begin(), st.records.end());
    return st;
  };

  const auto added = minus(target, me.span);
  const auto dropped = minus(me.span, target);
  std::vector<move_step> plan;
  {
    std::vector<server_record> recs{record(me.span, me.state)};
    for (auto s : added) recs.push_back(record(s, server_state::joining));
    plan.push_back(step(move_phase::joining, std::move(recs)));
  }
  {
    std::vector<server_record> recs{record(me.span, me.state)};
    for (auto s : added) recs.push_back(record(s, server_state::online));
    plan.push_back(step(move_phase::serving_both, std::move(recs)));
  }
  {
    std::vector<server_record> recs{record(target, server_state::online)};
    for (auto s : dropped) recs.push_back(record(s, server_state::offline));
    plan.push_back(step(move_phase::left_old, std::move(recs)));
  }
  return plan;
}

move_check check_move(const swarm_state& swarm, const server_id& self, block_range target) {
  move_check c;
  auto plan = plan_move(swarm, self, target);
  if (!plan) {
    c.message = plan.error().message;
    return c;
  }
  const auto before = online_coverage(swarm);
  for (const auto& st : plan.value()) {
    const auto now = online_coverage(st.swarm);
    for (int b = 0; b < swarm.n_blocks; ++b)
      if (before[b] > 0 && now[b] == 0) c.uncovered_blocks.push_back(b);
    if (!c.uncovered_blocks.empty()) {
      c.failing_phase = st.phase;
      std::string blocks;
      for (int b : c.uncovered_blocks) blocks += (blocks.empty() ? "" : ", ") + std::to_string(b);
      c.message = "moving '" + self + "' to " + to_string(target) + " leaves block(s) " + blocks +
                  " without an ONLINE server in phase " + to_string(st.phase);
      return c;
    }
  }
  c.safe = true;
  return c;
}

}  // namespace corolla::swarm
