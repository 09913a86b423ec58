// schedule/planner.cpp — the layout search (baselines: planner_baselines.cpp).
//
// The search space, from the outside in:
//   d  every data-parallel width that divides global_batch / micro_batch;
//   groups  the workers of each (cluster, NIC class) pool, sorted so that
//      equal workers sit together, cut into DP groups of d ("packed": one
//      node's workers together, so DP rides NVLink and the pipeline the NIC;
//      "spread": the same local index across nodes, so consecutive stages
//      share nodes and DP rides the NIC). A group never leaves its pool:
//      that is the hard constraint;
//   order  pools are laid out contiguously, cluster by cluster, so each
//      slow inter-cluster link is crossed once; every order of the clusters
//      (and of the NIC classes inside a cluster) is tried;
//   p  every depth up to min(layers, groups); when fewer groups than exist
//      are used, the first p in the order or the p fastest;
//   spans  the dynamic program of partition.hpp, for two objectives.
// Each candidate is priced with estimate_step(); the cheapest wins. A lower
// bound (all work spread perfectly over the chosen stages) skips candidates
// that cannot win, and the partition of a given sequence of stage slots is
// computed once. The Holmes-rule and naive layouts are candidates too
// whenever they satisfy the constraint, so the planner is never worse
// than the Holmes rule at the planner's own p and d.
#include "schedule/planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "model/error.hpp"
#include "schedule/partition.hpp"

namespace corolla::schedule {

// ---- plan ----------------------------------------------------------------------

pipeline_layout plan::layout() const {
  pipeline_layout l;
  for (const auto& s : stages) l.stages.push_back({s.workers, s.first_layer, s.last_layer});
  return l;
}

std::optional<placement> plan::place(int rank) const {
  for (const auto& s : stages) {
    auto it = std::find(s.workers.begin(), s.workers.end(), rank);
    if (it == s.workers.end()) continue;
    placement pl;
    pl.rank = rank;
    pl.stage = s.index;
    pl.replica = static_cast<int>(it - s.workers.begin());
    pl.first_layer = s.first_layer;
    pl.last_layer = s.last_layer;
    pl.embedding = s.embedding;
    pl.head = s.head;
    if (s.index > 0) pl.prev_rank = stages[s.index - 1].workers[pl.replica];
    if (s.index + 1 < static_cast<int>(stages.size())) pl.next_rank = stages[s.index + 1].workers[pl.replica];
    pl.dp_group = s.workers;
    pl.grad_buckets = s.cost.grad_buckets;
    return pl;
  }
  return std::nullopt;
}

double plan::step_s() const {
  return feasible ? estimate.step_s : std::numeric_limits<double>::infinity();
}

bool dp_groups_within_nic_class(const cluster_description& cluster, const pipeline_layout& layout) {
  for (const auto& s : layout.stages) {
    if (s.workers.empty()) continue;
    const worker_spec& first = cluster.workers.at(s.workers.front());
    for (int r : s.workers) {
      const worker_spec& w = cluster.workers.at(r);
      if (w.cluster != first.cluster || w.nic != first.nic) return false;
    }
  }
  return true;
}

plan price_layout(const cluster_description& cluster, const model_costs& costs,
                  const training_setup& setup, const pipeline_layout& layout,
                  const std::string& strategy) {
  plan out;
  out.strategy = strategy;
  out.estimate = estimate_step(cluster, costs, setup, layout);
  out.pp = layout.pp();
  out.dp = layout.dp();
  out.micro_batches = out.estimate.micro_batches;
  out.micro_batch = costs.micro_batch;
  out.seq = costs.seq;
  std::vector<bool> used(cluster.size(), false);
  for (int i = 0; i < out.pp; ++i) {
    const stage_layout& sl = layout.stages[i];
    stage_plan s;
    s.index = i;
    s.first_layer = sl.first_layer;
    s.last_layer = sl.last_layer;
    s.embedding = i == 0;
    s.head = i == out.pp - 1;
    s.workers = sl.workers;
    s.cluster = cluster.workers[sl.workers.front()].cluster;
    s.nic = cluster.workers[sl.workers.front()].nic;
    for (int r : sl.workers) {
      used[r] = true;
      if (cluster.workers[r].cluster != s.cluster) s.cluster = -1;
      if (cluster.workers[r].nic != s.nic) s.nic = -1;
    }
    s.cost = out.estimate.stages[i];
    out.stages.push_back(std::move(s));
  }
  for (int r = 0; r < cluster.size(); ++r)
    if (!used[r]) out.idle.push_back(r);
  out.feasible = out.estimate.fits;
  out.reason = out.estimate.memory_problem;
  return out;
}

// ---- search ------------------------------------------------------------------------

namespace {

using stage_workers = std::vector<std::vector<int>>;

/// A DP group candidate: d workers of one pool.
struct group {
  std::vector<int> ranks;
  double speed = 0;   ///< slowest member
  double memory = 0;  ///< smallest member
};

/// Workers of one (cluster, NIC class).
struct pool {
  int cluster = 0;
  int nic = 0;
  std::vector<int> ranks;
};

std::vector<pool> make_pools(const cluster_description& c) {
  std::vector<pool> pools;
  for (const worker_spec& w : c.workers) {
    auto it = std::find_if(pools.begin(), pools.end(),
                           [&](const pool& p) { return p.cluster == w.cluster && p.nic == w.nic; });
    if (it == pools.end()) {
      pools.push_back({w.cluster, w.nic, {}});
      it = pools.end() - 1;
    }
    it->ranks.push_back(w.rank);
  }
  return pools;
}

/// Index of `rank` within its node.
int local_index(const cluster_description& c, int rank) {
  const auto& ws = c.nodes[c.workers[rank].node].workers;
  return static_cast<int>(std::find(ws.begin(), ws.end(), rank) - ws.begin());
}

/// Cuts a pool into DP groups of d. Faster and bigger workers first so
/// that groups are homogeneous (a group runs at its slowest member's pace)
/// and leftovers are the weakest workers.
std::vector<group> make_groups(const cluster_description& c, const pool& pl, int d, bool spread) {
  std::vector<int> ranks = pl.ranks;
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    const worker_spec& x = c.workers[a];
    const worker_spec& y = c.workers[b];
    if (x.flops != y.flops) return x.flops > y.flops;
    if (x.memory != y.memory) return x.memory > y.memory;
    if (spread) {
      int la = local_index(c, a), lb = local_index(c, b);
      if (la != lb) return la < lb;
    }
    return a < b;  // file order: node by node
  });
  std::vector<group> groups;
  for (std::size_t k = 0; k + d <= ranks.size(); k += d) {
    group g;
    g.ranks.assign(ranks.begin() + k, ranks.begin() + k + d);
    g.speed = std::numeric_limits<double>::infinity();
    g.memory = std::numeric_limits<double>::infinity();
    for (int r : g.ranks) {
      g.speed = std::min(g.speed, c.workers[r].flops);
      g.memory = std::min(g.memory, c.workers[r].memory);
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

/// Every permutation of `items` when there are at most `limit`!, else the
/// given order and its reverse.
std::vector<std::vector<int>> orders_of(std::vector<int> items, int limit) {
  std::vector<std::vector<int>> out;
  if (static_cast<int>(items.size()) <= limit) {
    std::sort(items.begin(), items.end());
    do out.push_back(items);
    while (std::next_permutation(items.begin(), items.end()));
  } else {
    out.push_back(items);
    std::reverse(items.begin(), items.end());
    out.push_back(items);
  }
  return out;
}

/// Orders of the pools: clusters contiguous (each slow inter-cluster link
/// crossed once), NIC classes contiguous inside a cluster.
std::vector<std::vector<int>> pool_orders(const std::vector<pool>& pools) {
  std::vector<int> clusters;
  for (const pool& p : pools)
    if (std::find(clusters.begin(), clusters.end(), p.cluster) == clusters.end()) clusters.push_back(p.cluster);
  // Inside each cluster: its pools (NIC classes), every order when few.
  std::map<int, std::vector<std::vector<int>>> inner;
  long long combos = 1;
  for (int c : clusters) {
    std::vector<int> mine;
    for (std::size_t i = 0; i < pools.size(); ++i)
      if (pools[i].cluster == c) mine.push_back(static_cast<int>(i));
    inner[c] = orders_of(mine, 3);
    combos *= static_cast<long long>(inner[c].size());
  }
  auto outer = orders_of(clusters, 5);
  if (combos * static_cast<long long>(outer.size()) > 512)
    for (auto& [c, list] : inner) list.resize(1);  // keep the cluster orders, fix the class order
  std::vector<std::vector<int>> out;
  for (const auto& co : outer) {
    // The product of the inner orders, cluster by cluster.
    std::vector<std::vector<int>> partial{{}};
    for (int c : co) {
      std::vector<std::vector<int>> next;
      for (const auto& prefix : partial)
        for (const auto& in : inner[c]) {
          auto v = prefix;
          v.insert(v.end(), in.begin(), in.end());
          next.push_back(std::move(v));
        }
      partial = std::move(next);
    }
    out.insert(out.end(), partial.begin(), partial.end());
  }
  return out;
}

class search {
 public:
  search(const cluster_description& c, const model_config& cfg, const training_setup& setup)
      : c_(c), cfg_(cfg), setup_(setup), costs_(compute_costs(cfg, setup)) {
    for (const auto& b : costs_.blocks) work_ += b.forward_flops + b.backward_flops;
    work_ += costs_.embedding.forward_flops + costs_.embedding.backward_flops + costs_.head.forward_flops +
             costs_.head.backward_flops;
  }

  plan_report run() {
    const int W = c_.size(), L = cfg_.n_layers;
    std::vector<pool> pools = make_pools(c_);
    for (int d = 1; d <= W; ++d) {
      if (setup_.dp > 0 && d != setup_.dp) continue;
      if (setup_.micro_batches(d) == 0) continue;
      for (int spread = 0; spread <= (d > 1 ? 1 : 0); ++spread) {
        std::vector<std::vector<group>> groups(pools.size());
        std::size_t total = 0;
        for (std::size_t i = 0; i < pools.size(); ++i) {
          groups[i] = make_groups(c_, pools[i], d, spread == 1);
          total += groups[i].size();
        }
        int max_p = std::min<int>(L, static_cast<int>(total));
        for (const auto& order : pool_orders(pools)) {
          std::vector<const group*> ordered;
          for (int pi : order)
            for (const group& g : groups[pi]) ordered.push_back(&g);
          for (int p = max_p; p >= 1; --p) {
            if (setup_.pp > 0 && p != setup_.pp) continue;
            consider_selection(ordered, p);
          }
        }
      }
      // The baselines' own layouts, where they keep DP groups in one class.
      for (int p = std::min(L, W / d); p >= 1; --p) {
        if (setup_.pp > 0 && p != setup_.pp) continue;
        for (const plan& base : {holmes_plan(c_, cfg_, setup_, p, d), naive_plan(c_, cfg_, setup_, p, d)}) {
          if (base.stages.empty()) continue;
          pipeline_layout l = base.layout();
          if (!dp_groups_within_nic_class(c_, l)) continue;
          stage_workers w;
          for (const auto& s : l.stages) w.push_back(s.workers);
          consider(w, &l);
        }
      }
    }
    plan_report report;
    report.layouts_priced = priced_;
    if (best_.feasible) {
      report.best = std::move(best_);
      report.best.strategy = "planner";
      report.naive = naive_plan(c_, cfg_, setup_, report.best.pp, report.best.dp);
      report.holmes = holmes_plan(c_, cfg_, setup_, report.best.pp, report.best.dp);
    } else {
      report.best.strategy = "planner";
      report.best.reason = infeasible_reason();
      report.naive.strategy = "naive";
      report.naive.reason = "not priced: the planner found no feasible layout to compare with";
      report.holmes.strategy = "holmes";
      report.holmes.reason = report.naive.reason;
    }
    report.holmes_two_stages = holmes_two_stages();
    return report;
  }

 private:
  /// The first p groups of the order, and the p fastest kept in order.
  void consider_selection(const std::vector<const group*>& ordered, int p) {
    std::vector<const group*> prefix(ordered.begin(), ordered.begin() + p);
    consider(to_workers(prefix), nullptr);
    if (static_cast<int>(ordered.size()) == p) return;
    std::vector<std::size_t> idx(ordered.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      if (ordered[a]->speed != ordered[b]->speed) return ordered[a]->speed > ordered[b]->speed;
      return ordered[a]->memory > ordered[b]->memory;
    });
    idx.resize(p);
    std::sort(idx.begin(), idx.end());
    std::vector<const group*> fastest;
    for (std::size_t i : idx) fastest.push_back(ordered[i]);
    consider(to_workers(fastest), nullptr);
  }

  static stage_workers to_workers(const std::vector<const group*>& groups) {
    stage_workers w;
    for (const group* g : groups) w.push_back(g->ranks);
    return w;
  }

  /// Prices the best spans of one assignment of workers to stages; `own`
  /// is a baseline layout whose own spans are a candidate too.
  void consider(const stage_workers& workers, const pipeline_layout* own) {
    if (!seen_.insert(workers).second && !own) return;
    const int d = static_cast<int>(workers.front().size());
    const int m = setup_.micro_batches(d);
    std::vector<stage_slot> slots = make_slots(c_, setup_, workers);

    // Lower bound: every stage at least work/sum(speeds) per micro-batch in
    // steady state, and the first micro-batch at least work/max(speed).
    double sum_speed = 0, max_speed = 0;
    for (const auto& s : slots) {
      sum_speed += s.flops_per_s;
      max_speed = std::max(max_speed, s.flops_per_s);
    }
    if (own) offer(*own);
    double bound = (m - 1) * work_ / sum_speed + work_ / max_speed;
    if (best_.feasible && bound >= best_.estimate.step_s) return;

    bool any = false;
    for (auto objective : {partition_objective::bottleneck, partition_objective::bottleneck_with_reduction}) {
      const auto& bounds = partition_for(slots, m, objective);
      if (!bounds) continue;
      any = true;
      offer(make_layout(workers, *bounds));
    }
    if (!any && !best_.feasible) note_infeasible(workers, slots);
  }

  const std::optional<std::vector<int>>& partition_for(const std::vector<stage_slot>& slots, int m,
                                                       partition_objective objective) {
    std::vector<double> key{static_cast<double>(m), static_cast<double>(objective)};
    for (const auto& s : slots)
      key.insert(key.end(), {s.flops_per_s, s.capacity, double(s.in_flight), double(s.dp),
                             s.dp_link.bandwidth, s.dp_link.latency});
    auto it = partitions_.find(key);
    if (it != partitions_.end()) return it->second;
    return partitions_[key] = partition_layers(costs_, setup_, slots, m, objective);
  }

  void offer(const pipeline_layout& layout) {
    ++priced_;
    step_estimate e = estimate_step(c_, costs_, setup_, layout);
    if (!e.fits) return;
    if (best_.feasible && !(e.step_s < best_.estimate.step_s * (1 - 1e-12))) return;
    best_ = price_layout(c_, costs_, setup_, layout, "planner");
  }

  /// Remembers the candidate that comes closest to fitting (layers in
  /// proportion to stage memory), to explain an infeasible job.
  void note_infeasible(const stage_workers& workers, const std::vector<stage_slot>& slots) {
    std::vector<double> caps;
    for (const auto& s : slots) caps.push_back(s.capacity);
    pipeline_layout l = make_layout(workers, proportional_split(cfg_.n_layers, caps));
    step_estimate e = estimate_step(c_, costs_, setup_, l);
    double ratio = 0;
    for (const auto& s : e.stages) ratio = std::max(ratio, s.memory.total() / s.capacity);
    if (ratio < closest_ratio_) {
      closest_ratio_ = ratio;
      closest_ = "PP " + std::to_string(l.pp()) + " x DP " + std::to_string(l.dp()) + ": " +
                 e.memory_problem;
    }
  }

  std::string infeasible_reason() const {
    if (closest_.empty()) {
      std::string why = "no layout of " + std::to_string(c_.size()) + " workers";
      if (setup_.pp > 0) why += " with " + std::to_string(setup_.pp) + " pipeline stages";
      if (setup_.dp > 0) why += (setup_.pp > 0 ? " and " : " with ") + std::to_string(setup_.dp) + " data-parallel replicas";
      return why + " keeps every data-parallel group inside one cluster and NIC class, with a micro-batch count " +
             "dividing the global batch of " + std::to_string(setup_.global_batch);
    }
    return "the model does not fit in memory in any layout; closest: " + closest_;
  }

  /// The Holmes rule as in its original code: two stages over all workers
  /// (the widest d that divides the batch).
  plan holmes_two_stages() const {
    const int W = c_.size();
    for (int d = W / 2; d >= 1; --d)
      if (setup_.micro_batches(d) > 0 && cfg_.n_layers >= 2) {
        plan h = holmes_plan(c_, cfg_, setup_, 2, d);
        h.strategy = "holmes-2-stages";
        return h;
      }
    plan h;
    h.strategy = "holmes-2-stages";
    h.reason = "not applicable: needs two stages of at least one worker and two layers";
    return h;
  }

  const cluster_description& c_;
  const model_config& cfg_;
  const training_setup& setup_;
  model_costs costs_;
  double work_ = 0;  ///< FLOPs of forward + backward of one micro-batch through the model
  plan best_;
  int priced_ = 0;
  std::set<stage_workers> seen_;
  std::map<std::vector<double>, std::optional<std::vector<int>>> partitions_;
  double closest_ratio_ = std::numeric_limits<double>::infinity();
  std::string closest_;
};

}  // namespace

plan_report make_plan(const cluster_description& cluster, const model_config& cfg,
                      const training_setup& setup) {
  setup.validate(cfg);
  return search(cluster, cfg, setup).run();
}

}  // namespace corolla::schedule
