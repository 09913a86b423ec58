// schedule/planner_baselines.cpp — the two layouts the planner is compared
// with, priced on the same cost model: the naive rank order (what a
// Megatron launch does with a host file) and the Holmes rule.
#include <algorithm>
#include <numeric>

#include "schedule/partition.hpp"
#include "schedule/planner.hpp"

namespace corolla::schedule {
namespace {

/// A plan that could not be laid out at all (no stages), with the reason.
plan not_applicable(const std::string& strategy, const std::string& reason, int pp, int dp) {
  plan out;
  out.strategy = strategy;
  out.pp = pp;
  out.dp = dp;
  out.reason = reason;
  return out;
}

/// Why p x d cannot be laid out on this cluster and batch, or "".
std::string shape_problem(const cluster_description& cluster, const model_config& cfg,
                          const training_setup& setup, int pp, int dp) {
  if (pp < 1 || dp < 1) return "needs at least one stage and one replica";
  if (static_cast<long long>(pp) * dp > cluster.size())
    return "PP " + std::to_string(pp) + " x DP " + std::to_string(dp) + " needs " +
           std::to_string(pp * dp) + " workers; the cluster has " + std::to_string(cluster.size());
  if (pp > cfg.n_layers)
    return std::to_string(pp) + " stages for " + std::to_string(cfg.n_layers) + " layers";
  if (setup.micro_batches(dp) == 0)
    return "the global batch " + std::to_string(setup.global_batch) + " does not split over DP " +
           std::to_string(dp) + " x micro-batch " + std::to_string(setup.micro_batch);
  return "";
}

/// Stage i on ranks[i*d .. (i+1)*d).
std::vector<std::vector<int>> consecutive_stages(const std::vector<int>& ranks, int pp, int dp) {
  std::vector<std::vector<int>> stages(pp);
  for (int i = 0; i < pp; ++i) stages[i].assign(ranks.begin() + i * dp, ranks.begin() + (i + 1) * dp);
  return stages;
}

}  // namespace

plan naive_plan(const cluster_description& cluster, const model_config& cfg,
                const training_setup& setup, int pp, int dp) {
  std::string why = shape_problem(cluster, cfg, setup, pp, dp);
  if (!why.empty()) return not_applicable("naive", why, pp, dp);
  std::vector<int> ranks(cluster.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  auto stages = consecutive_stages(ranks, pp, dp);
  return price_layout(cluster, compute_costs(cfg, setup), setup,
                      make_layout(stages, even_split(cfg.n_layers, pp)), "naive");
}

plan holmes_plan(const cluster_description& cluster, const model_config& cfg,
                 const training_setup& setup, int pp, int dp) {
  std::string why = shape_problem(cluster, cfg, setup, pp, dp);
  if (!why.empty()) return not_applicable("holmes", why, pp, dp);
  // Holmes orders ranks by NIC type (IB, then RoCE, then Ethernet): here by
  // class speed, fastest first, file order within a class.
  std::vector<int> ranks(cluster.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
    const link_spec& x = cluster.nics[cluster.workers[a].nic].link;
    const link_spec& y = cluster.nics[cluster.workers[b].nic].link;
    if (x.bandwidth != y.bandwidth) return x.bandwidth > y.bandwidth;
    if (x.latency != y.latency) return x.latency < y.latency;
    return cluster.workers[a].nic < cluster.workers[b].nic;
  });
  auto stages = consecutive_stages(ranks, pp, dp);
  // Layers in proportion to each stage's throughput (its workers' TFLOP/s).
  std::vector<double> speeds;
  for (const auto& s : stages) {
    double sum = 0;
    for (int r : s) sum += cluster.workers[r].flops;
    speeds.push_back(sum);
  }
  return price_layout(cluster, compute_costs(cfg, setup), setup,
                      make_layout(stages, proportional_split(cfg.n_layers, speeds)), "holmes");
}

}  // namespace corolla::schedule
