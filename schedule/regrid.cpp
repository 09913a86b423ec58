#include "schedule/regrid.hpp"

#include <cstdlib>

namespace corolla::schedule {

namespace {

/// Whether pp x dp satisfies `l`'s batch split and block count.
bool fits(const grid_limits& l, int pp, int dp) {
  if (pp * l.chunks > l.n_layers) return false;
  if (l.global_batch % dp != 0) return false;
  const int share = l.global_batch / dp;
  const int micro = l.micro_batch > 0 ? l.micro_batch : (pp > 1 ? 1 : share);
  if (micro < 1 || share % micro != 0) return false;
  if (l.chunks > 1 && (share / micro) % pp != 0) return false;
  return true;
}

}  // namespace

std::optional<grid> regrid(const grid_limits& l, std::string* why) {
  std::optional<grid> best;
  auto better = [&](const grid& g) {
    if (!best) return true;
    if (g.ranks() != best->ranks()) return g.ranks() > best->ranks();
    const int d = std::abs(g.pp - l.prefer_pp), bd = std::abs(best->pp - l.prefer_pp);
    if (d != bd) return d < bd;
    return g.dp > best->dp;
  };
  if (l.ranks >= 1 && l.n_layers >= 1 && l.global_batch >= 1 && l.chunks >= 1)
    for (int pp = 1; pp <= l.ranks; ++pp)
      for (int dp = 1; pp * dp <= l.ranks; ++dp)
        if (fits(l, pp, dp) && better({pp, dp})) best = grid{pp, dp};
  if (!best && why)
    *why = "no pipeline x data-parallel grid of at most " + std::to_string(l.ranks) + " ranks fits " +
           std::to_string(l.n_layers) + " blocks" + (l.chunks > 1 ? " in " + std::to_string(l.chunks) + " chunks" : "") +
           " and a global batch of " + std::to_string(l.global_batch) +
           (l.micro_batch > 0 ? " in micro-batches of " + std::to_string(l.micro_batch) : "");
  return best;
}

}  // namespace corolla::schedule
