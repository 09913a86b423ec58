// schedule/partition.cpp — even, proportional and DP layer partitions.
#include "schedule/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "model/error.hpp"

namespace corolla::schedule {

std::vector<stage_slot> make_slots(const cluster_description& cluster, const training_setup& setup,
                                   const std::vector<std::vector<int>>& workers) {
  const int p = static_cast<int>(workers.size());
  const int d = p > 0 ? static_cast<int>(workers.front().size()) : 0;
  const int m = setup.micro_batches(d);
  std::vector<stage_slot> slots(p);
  for (int i = 0; i < p; ++i) {
    stage_slot& s = slots[i];
    if (static_cast<int>(workers[i].size()) != d || d == 0)
      throw std::invalid_argument("make_slots: every stage needs the same, non-zero number of workers");
    s.flops_per_s = std::numeric_limits<double>::infinity();
    s.capacity = std::numeric_limits<double>::infinity();
    for (int r : workers[i]) {
      s.flops_per_s = std::min(s.flops_per_s, cluster.workers.at(r).flops);
      s.capacity = std::min(s.capacity, cluster.workers.at(r).memory * (1.0 - setup.memory_headroom));
    }
    s.in_flight = in_flight_micro_batches(i, p, m);
    s.dp = d;
    std::vector<std::pair<int, int>> ring;
    for (int k = 0; d > 1 && k < d; ++k) ring.emplace_back(workers[i][k], workers[i][(k + 1) % d]);
    s.dp_link = cluster.concurrent_link(ring);
    s.first = i == 0;
    s.last = i == p - 1;
  }
  return slots;
}

namespace {

/// Prefix sums over the blocks so that any span costs O(1).
struct prefix_sums {
  std::vector<double> flops, backward, params, trained, held, activations;
  prefix_sums(const model_costs& c, const training_setup& setup) {
    const std::size_t L = c.blocks.size();
    flops.assign(L + 1, 0.0);
    backward.assign(L + 1, 0.0);
    params.assign(L + 1, 0.0);
    trained.assign(L + 1, 0.0);
    held.assign(L + 1, 0.0);
    activations.assign(L + 1, 0.0);
    for (std::size_t l = 0; l < L; ++l) {
      flops[l + 1] = flops[l] + c.blocks[l].forward_flops + c.blocks[l].backward_flops;
      backward[l + 1] = backward[l] + c.blocks[l].backward_flops;
      params[l + 1] = params[l] + c.blocks[l].params;
      trained[l + 1] = trained[l] + c.blocks[l].trained();
      held[l + 1] = held[l] + c.blocks[l].held(setup);
      activations[l + 1] = activations[l] + c.blocks[l].activation_bytes;
    }
  }
};

/// Cost and memory of stage `slot` running blocks [a, b).
struct span_pricer {
  const model_costs& costs;
  const training_setup& setup;
  const prefix_sums& sums;
  int p;

  double flops(const stage_slot& s, int a, int b) const {
    double f = sums.flops[b] - sums.flops[a];
    if (s.first) f += costs.embedding.forward_flops + costs.embedding.backward_flops;
    if (s.last) f += costs.head.forward_flops + costs.head.backward_flops;
    return f;
  }
  double params(const stage_slot& s, int a, int b) const {
    double n = sums.params[b] - sums.params[a];
    if (s.first) n += costs.embedding.params;
    if (s.last) n += costs.head.params + (p > 1 ? costs.tied_copy_params : 0.0);
    return n;
  }
  /// Their weights' bytes as held (a QLoRA job's blocks in fewer).
  double held(const stage_slot& s, int a, int b) const {
    double n = sums.held[b] - sums.held[a];
    if (s.first) n += costs.embedding.held(setup);
    if (s.last) n += costs.head.held(setup) + (p > 1 ? costs.tied_copy_params * setup.weight_bytes : 0.0);
    return n;
  }
  /// Of those, the ones that train (all but a LoRA job's frozen weights).
  double trained(const stage_slot& s, int a, int b) const {
    double n = sums.trained[b] - sums.trained[a];
    if (s.first) n += costs.embedding.trained();
    if (s.last) n += costs.head.trained() + (p > 1 && costs.head.trained() > 0 ? costs.tied_copy_params : 0.0);
    return n;
  }
  double backward_flops(const stage_slot& s, int a, int b) const {
    double f = sums.backward[b] - sums.backward[a];
    if (s.first) f += costs.embedding.backward_flops;
    if (s.last) f += costs.head.backward_flops;
    return f;
  }
  bool fits(const stage_slot& s, int a, int b) const {
    double act = sums.activations[b] - sums.activations[a];
    if (s.first) act += costs.embedding.activation_bytes;
    if (s.last) act += costs.head.activation_bytes;
    const double transient = (b > a ? costs.widened_block_bytes : 0.0) + (s.last ? costs.head_transient_bytes : 0.0);
    memory_breakdown mem = stage_memory(params(s, a, b), act, s.in_flight, transient, s.dp, setup, trained(s, a, b),
                                        held(s, a, b));
    return mem.total() <= s.capacity;
  }
  /// Forward + backward seconds per micro-batch.
  double time(const stage_slot& s, int a, int b) const { return flops(s, a, b) / s.flops_per_s; }
  /// The stage's exposed DP reduction (see estimate_step).
  double exposed(const stage_slot& s, int a, int b) const {
    double n = trained(s, a, b);
    double grads = n * setup.grad_bytes;
    int buckets = std::max(1, static_cast<int>(std::ceil(grads / setup.bucket_bytes)));
    double reduce = setup.zero1 ? zero1_reduction_time(s.dp, grads, n * setup.weight_bytes, s.dp_link, buckets)
                                : ring_allreduce_time(s.dp, grads, s.dp_link, buckets);
    double backward = backward_flops(s, a, b) / s.flops_per_s;
    return exposed_reduction(reduce, backward, setup.dp_overlap);
  }
};

/// (max, sum) compared lexicographically, the max with a relative tolerance
/// so that rounding noise does not decide ties.
struct value {
  double max = std::numeric_limits<double>::infinity();
  double sum = std::numeric_limits<double>::infinity();
  bool valid() const { return std::isfinite(max); }
  bool operator<(const value& o) const {
    double tol = 1e-12 * std::max(std::abs(max), std::abs(o.max));
    if (max < o.max - tol) return true;
    if (max > o.max + tol) return false;
    return sum < o.sum;
  }
};

}  // namespace

std::optional<std::vector<int>> partition_layers(const model_costs& costs, const training_setup& setup,
                                                 const std::vector<stage_slot>& slots, int m,
                                                 partition_objective objective) {
  const int p = static_cast<int>(slots.size());
  const int L = static_cast<int>(costs.blocks.size());
  if (p < 1 || p > L) return std::nullopt;
  prefix_sums sums(costs, setup);
  span_pricer price{costs, setup, sums, p};

  // best[i][l]: the best value of stages 0..i-1 covering blocks [0, l);
  // from[i][l]: where stage i-1's span starts in that solution.
  std::vector<std::vector<value>> best(p + 1, std::vector<value>(L + 1));
  std::vector<std::vector<int>> from(p + 1, std::vector<int>(L + 1, -1));
  best[0][0] = {0.0, 0.0};
  for (int i = 0; i < p; ++i) {
    const stage_slot& s = slots[i];
    // Stage i ends at l; the stages after it need one layer each.
    for (int l = i + 1; l <= L - (p - 1 - i); ++l) {
      // Walking the start a down from l-1 grows the span, so memory only
      // grows: the first span that does not fit ends the walk.
      for (int a = l - 1; a >= i; --a) {
        if (!price.fits(s, a, l)) break;
        if (!best[i][a].valid()) continue;
        double t = price.time(s, a, l);
        double c = objective == partition_objective::bottleneck
                       ? t
                       : (m + p - 1) * t + price.exposed(s, a, l);
        value cand{std::max(best[i][a].max, c), best[i][a].sum + c};
        if (cand < best[i + 1][l]) {
          best[i + 1][l] = cand;
          from[i + 1][l] = a;
        }
      }
    }
  }
  if (!best[p][L].valid()) return std::nullopt;
  std::vector<int> bounds(p + 1);
  bounds[p] = L;
  for (int i = p; i > 0; --i) bounds[i - 1] = from[i][bounds[i]];
  return bounds;
}

std::vector<int> even_split(int layers, int stages) {
  if (stages < 1 || stages > layers) throw std::invalid_argument("even_split: need 1 <= stages <= layers");
  std::vector<int> bounds(stages + 1, 0);
  int base = layers / stages, extra = layers % stages;
  for (int i = 0; i < stages; ++i) bounds[i + 1] = bounds[i] + base + (i < extra ? 1 : 0);
  return bounds;
}

std::vector<int> proportional_split(int layers, const std::vector<double>& speeds) {
  const int p = static_cast<int>(speeds.size());
  if (p < 1 || p > layers) throw std::invalid_argument("proportional_split: need 1 <= stages <= layers");
  double total = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  if (!(total > 0)) throw std::invalid_argument("proportional_split: speeds must be positive");
  // Largest remainder: floor every share, then hand the missing layers to
  // the largest fractional parts (ties to the earlier stage). Then make
  // sure no stage is empty by taking from the stage with the most.
  std::vector<int> count(p);
  std::vector<std::pair<double, int>> remainder(p);
  int assigned = 0;
  for (int i = 0; i < p; ++i) {
    double share = layers * speeds[i] / total;
    count[i] = static_cast<int>(std::floor(share));
    remainder[i] = {share - count[i], i};
    assigned += count[i];
  }
  std::stable_sort(remainder.begin(), remainder.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  for (int k = 0; assigned < layers; ++k, ++assigned) ++count[remainder[k % p].second];
  for (int i = 0; i < p; ++i) {
    while (count[i] == 0) {
      int donor = static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin());
      --count[donor];
      ++count[i];
    }
  }
  std::vector<int> bounds(p + 1, 0);
  for (int i = 0; i < p; ++i) bounds[i + 1] = bounds[i] + count[i];
  return bounds;
}

pipeline_layout make_layout(const std::vector<std::vector<int>>& workers, const std::vector<int>& bounds) {
  if (bounds.size() != workers.size() + 1) throw std::invalid_argument("make_layout: p + 1 boundaries needed");
  pipeline_layout layout;
  for (std::size_t i = 0; i < workers.size(); ++i)
    layout.stages.push_back({workers[i], bounds[i], bounds[i + 1]});
  return layout;
}

}  // namespace corolla::schedule
