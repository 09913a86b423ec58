// schedule/migration.cpp — the diff of two plans (schedule/migration.hpp).
#include "schedule/migration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <tuple>

namespace corolla::schedule {

namespace {

/// Slices that differ by less than this are the same (fractions of 1/d).
constexpr double fraction_eps = 1e-12;

/// One holder of a piece's optimizer state: the slice and the rank.
struct slice_holder {
  double from = 0, to = 1;
  int rank = -1;
};

/// Who holds what under one plan.
struct holdings {
  std::map<int, std::vector<int>> parameters;          ///< piece -> ranks (every replica)
  std::map<int, std::vector<slice_holder>> optimizer;  ///< piece -> slices with their rank
};

/// The pieces of one stage: its blocks, and the embeddings / head it holds.
std::vector<int> pieces_of(const stage_plan& s) {
  std::vector<int> out;
  if (s.embedding) out.push_back(embedding_piece);
  for (int b = s.first_layer; b < s.last_layer; ++b) out.push_back(b);
  if (s.head) out.push_back(head_piece);
  return out;
}

/// The slice of a piece's optimizer state replica `r` of `d` holds.
std::pair<double, double> slice_of(int r, int d, bool zero1) {
  if (!zero1 || d <= 1) return {0.0, 1.0};
  return {static_cast<double>(r) / d, static_cast<double>(r + 1) / d};
}

holdings holdings_of(const plan& p, bool zero1) {
  holdings h;
  for (const auto& s : p.stages) {
    const int d = static_cast<int>(s.workers.size());
    for (int piece : pieces_of(s))
      for (int r = 0; r < d; ++r) {
        h.parameters[piece].push_back(s.workers[r]);
        const auto [from, to] = slice_of(r, d, zero1);
        h.optimizer[piece].push_back({from, to, s.workers[r]});
      }
  }
  return h;
}

/// "" when the stages cover blocks [0, n) contiguously, once each, with the
/// embeddings on the first and the head on the last; else what is wrong.
std::string check_spans(const plan& p, int n, const char* which) {
  const std::string prefix = std::string("the ") + which + " plan ";
  if (p.stages.empty()) return prefix + "has no stages";
  int next = 0;
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    const auto& s = p.stages[i];
    if (s.first_layer != next || s.last_layer < s.first_layer)
      return prefix + "has a gap or overlap at block " + std::to_string(next);
    if (s.workers.empty()) return prefix + "has a stage without workers";
    if (s.embedding != (i == 0) || s.head != (i + 1 == p.stages.size()))
      return prefix + "does not put the embeddings first and the head last";
    next = s.last_layer;
  }
  if (next != n)
    return prefix + "covers " + std::to_string(next) + " blocks, the model has " + std::to_string(n);
  return {};
}

double params_of(const model_costs& costs, int piece) {
  if (piece == embedding_piece) return costs.embedding.params;
  if (piece == head_piece) return costs.head.params;
  return costs.blocks.at(static_cast<std::size_t>(piece)).params;
}

std::string fraction_text(double from, double to) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%g, %g)", from, to);
  return buf;
}

}  // namespace

std::string piece_name(int piece) {
  if (piece == embedding_piece) return "the embeddings";
  if (piece == head_piece) return "the head";
  return "block " + std::to_string(piece);
}

migration plan_migration(const plan& from, const plan& to, const model_costs& costs, const training_setup& setup,
                         const cluster_description& cluster, const std::vector<int>& alive,
                         const std::map<int, int>& buddies) {
  migration m;
  const int n = static_cast<int>(costs.blocks.size());
  if (auto e = check_spans(from, n, "running"); !e.empty()) return m.error = e, m;
  if (auto e = check_spans(to, n, "new"); !e.empty()) return m.error = e, m;
  const std::set<int> live(alive.begin(), alive.end());
  const int ranks = static_cast<int>(cluster.workers.size());
  for (int r : live)
    if (r < 0 || r >= ranks) return m.error = "rank " + std::to_string(r) + " is not in the cluster", m;
  for (const auto& s : to.stages)
    for (int w : s.workers)
      if (!live.count(w)) return m.error = "the new plan uses rank " + std::to_string(w) + ", which is not alive", m;

  holdings old = holdings_of(from, setup.zero1);
  // The fastest live source among `candidates` for `to_rank` (itself first).
  auto best_source = [&](const std::vector<int>& candidates, int to_rank, double bytes) {
    int best = -1;
    double best_s = std::numeric_limits<double>::infinity();
    for (int c : candidates) {
      if (!live.count(c)) continue;
      const double s = c == to_rank ? -1.0 : cluster.link_between(c, to_rank).time(bytes);
      if (s < best_s || (s == best_s && c < best)) best = c, best_s = s;
    }
    return best;
  };
  auto add = [&](state_kind kind, int piece, double a, double b, int src, int dst, double bytes) {
    if (src == dst || bytes <= 0) return;
    m.moves.push_back({kind, piece, a, b, src, dst, bytes});
    m.bytes += bytes;
  };

  for (const auto& s : to.stages) {
    const int d = static_cast<int>(s.workers.size());
    for (int piece : pieces_of(s)) {
      const double params = params_of(costs, piece);
      const double param_bytes = params * setup.weight_bytes;
      const double optimizer_bytes = params * setup.optimizer_bytes;
      for (int r = 0; r < d; ++r) {
        const int w = s.workers[r];
        // Parameters: every replica of the old stage has them.
        const int src = best_source(old.parameters[piece], w, param_bytes);
        if (src < 0) {
          m.lost.push_back("parameters of " + piece_name(piece));
        } else {
          add(state_kind::parameters, piece, 0, 1, src, w, param_bytes);
        }
        // Optimizer state: the slice this replica needs, from the old
        // slices that overlap it (whole state copies: the best holder).
        const auto [a, b] = slice_of(r, d, setup.zero1);
        std::vector<slice_holder> holders = old.optimizer[piece];
        std::sort(holders.begin(), holders.end(),
                  [](const slice_holder& x, const slice_holder& y) { return std::tie(x.from, x.rank) < std::tie(y.from, y.rank); });
        double covered = a;
        std::size_t i = 0;
        while (covered < b - fraction_eps && i < holders.size()) {
          // The holders of the slice that starts where coverage stands.
          const double start = holders[i].from;
          const double end = holders[i].to;
          std::vector<int> candidates;
          for (; i < holders.size() && std::abs(holders[i].from - start) < fraction_eps; ++i) {
            candidates.push_back(holders[i].rank);
            if (!live.count(holders[i].rank))
              if (auto bd = buddies.find(holders[i].rank); bd != buddies.end()) candidates.push_back(bd->second);
          }
          const double lo = std::max(a, start), hi = std::min(b, end);
          if (hi <= lo + fraction_eps) continue;
          const double bytes = optimizer_bytes * (hi - lo);
          const int from_rank = best_source(candidates, w, bytes);
          if (from_rank < 0) {
            m.lost.push_back("optimizer state " + fraction_text(lo, hi) + " of " + piece_name(piece));
          } else {
            add(state_kind::optimizer, piece, lo, hi, from_rank, w, bytes);
          }
          covered = hi;
        }
      }
    }
  }
  std::sort(m.lost.begin(), m.lost.end());
  m.lost.erase(std::unique(m.lost.begin(), m.lost.end()), m.lost.end());
  std::sort(m.moves.begin(), m.moves.end(), [](const state_move& x, const state_move& y) {
    return std::tie(x.to_rank, x.piece, x.kind, x.from_fraction) < std::tie(y.to_rank, y.piece, y.kind, y.from_fraction);
  });
  // Every rank sends and receives its moves one after the other; the moves
  // crossing between two clusters also share that link's aggregate
  // bandwidth (per direction).
  std::map<int, double> busy;
  std::map<std::pair<int, int>, double> crossing;  // (from cluster, to cluster) -> bytes
  for (const auto& mv : m.moves) {
    const double s = cluster.link_between(mv.from_rank, mv.to_rank).time(mv.bytes);
    busy[mv.from_rank] += s;
    busy[mv.to_rank] += s;
    const int ca = cluster.workers[mv.from_rank].cluster, cb = cluster.workers[mv.to_rank].cluster;
    if (ca != cb) crossing[{ca, cb}] += mv.bytes;
  }
  for (const auto& [rank, s] : busy) m.seconds = std::max(m.seconds, s);
  for (const auto& [pair, bytes] : crossing)
    m.seconds = std::max(m.seconds, cluster.cluster_link(pair.first, pair.second).time(bytes));
  return m;
}

bool migration_pays_off(double old_step_s, double new_step_s, double migration_s, long steps_left, double margin) {
  if (!std::isfinite(old_step_s)) return true;
  if (!(new_step_s < old_step_s) || steps_left <= 0) return false;
  const double saved = (old_step_s - new_step_s) * static_cast<double>(steps_left);
  return saved > migration_s * (1 + margin);
}

}  // namespace corolla::schedule
