// schedule/swarm.cpp — swarm description: validation and per-block capacity.
#include "schedule/swarm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace corolla::swarm {

std::vector<const server_record*> swarm_state::records_of(const server_id& id) const {
  std::vector<const server_record*> out;
  for (const auto& r : servers)
    if (r.id == id) out.push_back(&r);
  return out;
}

namespace {

schedule_error invalid(std::string message) {
  return schedule_error{schedule_errc::invalid_swarm, -1, std::move(message)};
}

// Records in (id, start) order: sums and scans in this order do not depend on
// how the runtime happened to list the records.
std::vector<const server_record*> ordered(const swarm_state& swarm) {
  std::vector<const server_record*> out;
  out.reserve(swarm.servers.size());
  for (const auto& r : swarm.servers) out.push_back(&r);
  std::stable_sort(out.begin(), out.end(), [](const server_record* a, const server_record* b) {
    return a->id != b->id ? a->id < b->id : a->span.start < b->span.start;
  });
  return out;
}

template <class Count>
std::vector<int> coverage_where(const swarm_state& swarm, Count counts) {
  std::vector<int> cover(std::max(swarm.n_blocks, 0), 0);
  for (const auto& r : swarm.servers) {
    if (!counts(r.state)) continue;
    for (int b = std::max(r.span.start, 0); b < std::min(r.span.end, swarm.n_blocks); ++b) ++cover[b];
  }
  return cover;
}

}  // namespace

std::optional<schedule_error> validate(const swarm_state& swarm) {
  if (swarm.n_blocks <= 0)
    return invalid("swarm has " + std::to_string(swarm.n_blocks) + " blocks; a model has at least one");
  for (const auto& r : swarm.servers) {
    if (r.id.empty()) return invalid("a server record has an empty id");
    const std::string who = "server '" + r.id + "'";
    if (r.span.empty() || r.span.start < 0 || r.span.end > swarm.n_blocks)
      return invalid(who + " announces span " + to_string(r.span) + ", which is not a non-empty part of [0, " +
                     std::to_string(swarm.n_blocks) + ")");
    if (!std::isfinite(r.throughput) || r.throughput < 0)
      return invalid(who + " announces throughput " + std::to_string(r.throughput) +
                     "; it must be a finite number >= 0");
    if (!std::isfinite(r.step_s_per_block) || r.step_s_per_block < 0)
      return invalid(who + " announces a step time of " + std::to_string(r.step_s_per_block) +
                     " s per block; it must be a finite number >= 0");
  }
  const auto recs = ordered(swarm);
  for (std::size_t i = 1; i < recs.size(); ++i) {
    const auto& a = *recs[i - 1];
    const auto& b = *recs[i];
    if (a.id == b.id && b.span.start < a.span.end)
      return invalid("server '" + a.id + "' has overlapping records " + to_string(a.span) + " and " +
                     to_string(b.span));
  }
  return std::nullopt;
}

std::vector<double> block_throughputs(const swarm_state& swarm) {
  std::vector<double> tp(std::max(swarm.n_blocks, 0), 0.0);
  for (const server_record* r : ordered(swarm)) {
    if (!counts_for_balancing(r->state)) continue;
    for (int b = std::max(r->span.start, 0); b < std::min(r->span.end, swarm.n_blocks); ++b)
      tp[b] += r->throughput;
  }
  return tp;
}

std::vector<int> block_coverage(const swarm_state& swarm) {
  return coverage_where(swarm, [](server_state s) { return counts_for_balancing(s); });
}

std::vector<int> online_coverage(const swarm_state& swarm) {
  return coverage_where(swarm, [](server_state s) { return s == server_state::online; });
}

double swarm_throughput(const swarm_state& swarm) {
  if (swarm.n_blocks <= 0) return 0.0;
  const auto cover = block_coverage(swarm);
  if (std::find(cover.begin(), cover.end(), 0) != cover.end()) return 0.0;
  const auto tp = block_throughputs(swarm);
  return *std::min_element(tp.begin(), tp.end());
}

std::vector<int> uncovered_blocks(const swarm_state& swarm) {
  std::vector<int> out;
  const auto cover = block_coverage(swarm);
  for (int b = 0; b < static_cast<int>(cover.size()); ++b)
    if (cover[b] == 0) out.push_back(b);
  return out;
}

double announced_throughput(double compute_tokens_per_s, int n_blocks, double network_tokens_per_s) {
  if (n_blocks <= 0 || !(compute_tokens_per_s > 0)) return 0.0;
  const double compute = compute_tokens_per_s / n_blocks;
  return network_tokens_per_s > 0 ? std::min(compute, network_tokens_per_s) : compute;
}

swarm_state with_server_moved(const swarm_state& swarm, const server_id& id, block_range span) {
  swarm_state out;
  out.n_blocks = swarm.n_blocks;
  bool placed = false;
  for (const auto& r : swarm.servers) {
    if (r.id != id) {
      out.servers.push_back(r);
    } else if (!placed) {
      server_record moved = r;
      moved.span = span;
      moved.state = server_state::online;
      out.servers.push_back(std::move(moved));
      placed = true;
    }
  }
  return out;
}

}  // namespace corolla::swarm
