// schedule/cluster.cpp — the link rule and helpers of cluster_description.
// (Reading the TOML format lives in cluster_toml.cpp.)
#include "schedule/cluster.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "model/error.hpp"

namespace corolla::schedule {

double link_spec::time(double bytes) const {
  if (bytes <= 0) return 0.0;
  if (std::isinf(bandwidth)) return latency;
  return latency + bytes / bandwidth;
}

link_spec default_nic_link(std::string_view builtin_class) {
  if (builtin_class == "ib") return {gbit_per_s(200), microseconds(2)};
  if (builtin_class == "roce") return {gbit_per_s(100), microseconds(5)};
  if (builtin_class == "ethernet") return {gbit_per_s(25), microseconds(30)};
  throw model_error("unknown built-in NIC class '" + std::string(builtin_class) +
                    "' (built-in classes: ib, roce, ethernet)");
}

namespace {

/// The slower of two links on a path: data moves at the narrowest
/// bandwidth and waits for the longest latency.
link_spec slowest(const link_spec& a, const link_spec& b) {
  return {std::min(a.bandwidth, b.bandwidth), std::max(a.latency, b.latency)};
}

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

const link_spec& cluster_description::cluster_link(int a, int b) const {
  return inter_cluster.at(static_cast<std::size_t>(a) * clusters.size() + b);
}

link_spec cluster_description::link_between(int rank_a, int rank_b) const {
  const worker_spec& a = workers.at(rank_a);
  const worker_spec& b = workers.at(rank_b);
  if (rank_a == rank_b) return {std::numeric_limits<double>::infinity(), 0.0};
  if (!measured.empty())
    if (auto m = measured.find({a.name, b.name}); m != measured.end()) return m->second;
  if (a.node == b.node) return nodes[a.node].intra;
  const link_spec& na = nics[a.nic].link;
  const link_spec& nb = nics[b.nic].link;
  if (a.cluster == b.cluster) return a.nic == b.nic ? na : slowest(na, nb);
  return slowest(cluster_link(a.cluster, b.cluster), slowest(na, nb));
}

link_spec cluster_description::concurrent_link(const std::vector<std::pair<int, int>>& transfers) const {
  // Transfers per direction of each inter-cluster link share its bandwidth.
  std::map<std::pair<int, int>, int> crossing;
  for (auto [a, b] : transfers) {
    int ca = workers.at(a).cluster, cb = workers.at(b).cluster;
    if (ca != cb) ++crossing[{ca, cb}];
  }
  link_spec worst{std::numeric_limits<double>::infinity(), 0.0};
  for (auto [a, b] : transfers) {
    link_spec l = link_between(a, b);
    int ca = workers[a].cluster, cb = workers[b].cluster;
    if (ca != cb) l.bandwidth = std::min(l.bandwidth, cluster_link(ca, cb).bandwidth / crossing[{ca, cb}]);
    worst = slowest(worst, l);
  }
  return worst;
}

int cluster_description::find_nic(std::string_view n) const {
  for (std::size_t i = 0; i < nics.size(); ++i)
    if (nics[i].name == n) return static_cast<int>(i);
  return -1;
}

void cluster_description::validate() const {
  auto fail = [&](const std::string& what) { throw model_error(origin + ": " + what); };
  if (clusters.empty()) fail("no clusters are described");
  if (workers.empty()) fail("no workers are described");
  auto good_link = [](const link_spec& l) {
    return l.bandwidth > 0 && !std::isnan(l.bandwidth) && l.latency >= 0 &&
           std::isfinite(l.latency);
  };
  for (const auto& n : nics)
    if (!good_link(n.link)) fail("NIC class '" + n.name + "' has a non-positive bandwidth or a negative latency");
  for (std::size_t c = 0; c < clusters.size(); ++c) {
    if (clusters[c].nodes.empty()) fail("cluster '" + clusters[c].name + "' has no nodes");
    for (int n : clusters[c].nodes)
      if (n < 0 || n >= static_cast<int>(nodes.size()) || nodes[n].cluster != static_cast<int>(c))
        fail("cluster '" + clusters[c].name + "' lists a node that is not its own");
  }
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const node_spec& node = nodes[n];
    if (node.workers.empty()) fail("node '" + node.name + "' has no workers");
    if (node.nic < 0 || node.nic >= static_cast<int>(nics.size()))
      fail("node '" + node.name + "' has no NIC class");
    if (!good_link(node.intra)) fail("node '" + node.name + "' has a bad intra-node link");
    for (int r : node.workers)
      if (r < 0 || r >= size() || workers[r].node != static_cast<int>(n))
        fail("node '" + node.name + "' lists a worker that is not its own");
  }
  for (int r = 0; r < size(); ++r) {
    const worker_spec& w = workers[r];
    if (w.rank != r) fail("worker '" + w.name + "' has rank " + std::to_string(w.rank) + " at index " + std::to_string(r));
    if (!(w.flops > 0) || !std::isfinite(w.flops)) fail("worker '" + w.name + "' has no positive speed");
    if (!(w.memory > 0) || !std::isfinite(w.memory)) fail("worker '" + w.name + "' has no positive memory");
    if (w.node < 0 || w.node >= static_cast<int>(nodes.size()) || nodes[w.node].cluster != w.cluster ||
        nodes[w.node].nic != w.nic)
      fail("worker '" + w.name + "' disagrees with its node about cluster or NIC");
  }
  if (inter_cluster.size() != clusters.size() * clusters.size())
    fail("the inter-cluster link matrix is not clusters x clusters");
  for (std::size_t a = 0; a < clusters.size(); ++a)
    for (std::size_t b = 0; b < clusters.size(); ++b)
      if (a != b && !good_link(cluster_link(static_cast<int>(a), static_cast<int>(b))))
        fail("the link between clusters '" + clusters[a].name + "' and '" + clusters[b].name +
             "' has a non-positive bandwidth or a negative latency");
}

cluster_description without_workers(const cluster_description& c, const std::vector<int>& gone) {
  const std::set<int> drop(gone.begin(), gone.end());
  cluster_description out;
  out.name = c.name;
  out.origin = c.origin;
  out.nics = c.nics;
  // Measurements of the workers that stay stay with them (by name).
  std::set<std::string> dropped_names;
  for (int r : drop) dropped_names.insert(c.workers.at(static_cast<std::size_t>(r)).name);
  for (const auto& [pair, l] : c.measured)
    if (!dropped_names.count(pair.first) && !dropped_names.count(pair.second)) out.measured[pair] = l;
  for (const auto& [name, flops] : c.nominal_flops)
    if (!dropped_names.count(name)) out.nominal_flops[name] = flops;
  std::vector<int> cluster_map(c.clusters.size(), -1);
  for (std::size_t ci = 0; ci < c.clusters.size(); ++ci) {
    cluster_spec kept{c.clusters[ci].name, {}};
    for (int n : c.clusters[ci].nodes) {
      node_spec node = c.nodes[static_cast<std::size_t>(n)];
      node.workers.clear();
      node.cluster = static_cast<int>(out.clusters.size());
      const int node_index = static_cast<int>(out.nodes.size());
      for (int r : c.nodes[static_cast<std::size_t>(n)].workers) {
        if (drop.count(r)) continue;
        worker_spec w = c.workers[static_cast<std::size_t>(r)];
        w.rank = out.size();
        w.node = node_index;
        w.cluster = node.cluster;
        node.workers.push_back(w.rank);
        out.workers.push_back(std::move(w));
      }
      if (node.workers.empty()) continue;
      kept.nodes.push_back(node_index);
      out.nodes.push_back(std::move(node));
    }
    if (kept.nodes.empty()) continue;
    cluster_map[ci] = static_cast<int>(out.clusters.size());
    out.clusters.push_back(std::move(kept));
  }
  if (out.workers.empty()) throw model_error("no worker of " + c.origin + " is left");
  const std::size_t k = out.clusters.size(), n = c.clusters.size();
  out.inter_cluster.assign(k * k, link_spec{});
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = 0; b < n; ++b)
      if (cluster_map[a] >= 0 && cluster_map[b] >= 0)
        out.inter_cluster[static_cast<std::size_t>(cluster_map[a]) * k + static_cast<std::size_t>(cluster_map[b])] =
            c.inter_cluster[a * n + b];
  out.validate();
  return out;
}

cluster_description uniform_cluster(int node_count, int workers_per_node, std::string_view nic,
                                    double tflops, double memory_gib, worker_kind kind) {
  if (node_count <= 0 || workers_per_node <= 0)
    throw model_error("a uniform cluster needs at least one node and one worker per node");
  cluster_description c;
  c.name = "uniform-" + std::to_string(node_count) + "x" + std::to_string(workers_per_node);
  c.origin = "(generated " + c.name + ")";
  c.nics.push_back({std::string(nic), default_nic_link(nic), true});
  c.clusters.push_back({"local", {}});
  for (int n = 0; n < node_count; ++n) {
    node_spec node;
    node.name = "node" + std::to_string(n);
    node.cluster = 0;
    node.nic = 0;
    // Shared memory between processes of one host: fast and close.
    node.intra = {gbit_per_s(256), microseconds(1)};
    for (int k = 0; k < workers_per_node; ++k) {
      worker_spec w;
      w.rank = c.size();
      w.name = node.name + "/" + std::to_string(k);
      w.model = kind == worker_kind::gpu ? "gpu" : "cpu";
      w.kind = kind;
      w.flops = tflops * 1e12;
      w.memory = gib(memory_gib);
      w.node = n;
      w.cluster = 0;
      w.nic = 0;
      node.workers.push_back(w.rank);
      c.workers.push_back(w);
    }
    c.clusters[0].nodes.push_back(n);
    c.nodes.push_back(std::move(node));
  }
  c.inter_cluster.assign(1, c.nics[0].link);
  c.validate();
  return c;
}

std::string describe_workers(const cluster_description& c, const std::vector<int>& ranks) {
  // Runs of consecutive local indices on one node, in the given order.
  std::string out;
  std::size_t i = 0;
  while (i < ranks.size()) {
    const worker_spec& first = c.workers.at(ranks[i]);
    const node_spec& node = c.nodes[first.node];
    auto local = [&](int rank) {
      const auto& ws = c.nodes[c.workers[rank].node].workers;
      return static_cast<int>(std::find(ws.begin(), ws.end(), rank) - ws.begin());
    };
    int lo = local(ranks[i]);
    int hi = lo;
    std::size_t j = i + 1;
    while (j < ranks.size() && c.workers.at(ranks[j]).node == first.node && local(ranks[j]) == hi + 1) {
      ++hi;
      ++j;
    }
    if (!out.empty()) out += ", ";
    out += node.name + "/" + std::to_string(lo);
    if (hi > lo) out += "-" + std::to_string(hi);
    i = j;
  }
  return out;
}

std::string describe_link(const link_spec& l) {
  if (std::isinf(l.bandwidth)) return "local";
  return format_number(l.bandwidth * 8.0 / 1e9) + " Gbit/s, " + format_number(l.latency * 1e6) + " us";
}

}  // namespace corolla::schedule
