// schedule/cluster_toml.cpp — reads the cluster TOML format (docs/planner.md).
//
// Every error names the file, the line, where in the description the key
// sits (cluster 'a', node 'b', worker 2) and what is wrong; unknown keys are
// errors too, so a typo ("bandwith_gbps") never silently becomes a default.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <limits>
#include <sstream>

#include <toml++/toml.h>

#include "model/error.hpp"
#include "schedule/cluster.hpp"

namespace corolla::schedule {
namespace {

/// Reads values from TOML tables, naming file, line and context in errors.
class reader {
 public:
  explicit reader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const toml::node* at, const std::string& where,
                         const std::string& what) const {
    std::string loc = origin_;
    if (at && at->source().begin.line > 0) loc += ":" + std::to_string(at->source().begin.line);
    throw model_error(loc + ": " + (where.empty() ? "" : where + ": ") + what);
  }

  /// Rejects keys outside `allowed` (catches typos).
  void only_keys(const toml::table& t, const std::string& where,
                 std::initializer_list<const char*> allowed) const {
    for (const auto& [key, value] : t) {
      bool ok = std::any_of(allowed.begin(), allowed.end(),
                            [&](const char* a) { return key.str() == a; });
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        fail(&value, where, "unknown key '" + std::string(key.str()) + "' (expected: " + list + ")");
      }
    }
  }

  std::string string(const toml::table& t, const char* key, const std::string& where,
                     const std::string* fallback = nullptr) const {
    const toml::node* n = t.get(key);
    if (!n) {
      if (fallback) return *fallback;
      fail(&t, where, "missing key '" + std::string(key) + "'");
    }
    if (!n->is_string()) fail(n, where, "'" + std::string(key) + "' must be a string");
    std::string v = n->as_string()->get();
    if (v.empty()) fail(n, where, "'" + std::string(key) + "' must not be empty");
    return v;
  }

  /// A positive number (integer or float); `unit` explains it in errors.
  double positive(const toml::table& t, const char* key, const std::string& where,
                  const char* unit, const double* fallback = nullptr,
                  double most = std::numeric_limits<double>::max()) const {
    return number(t, key, where, unit, fallback, false, most);
  }
  double non_negative(const toml::table& t, const char* key, const std::string& where,
                      const char* unit, const double* fallback = nullptr) const {
    return number(t, key, where, unit, fallback, true);
  }

  int count(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node* n = t.get(key);
    if (!n) return 1;
    if (!n->is_integer() || n->as_integer()->get() < 1 || n->as_integer()->get() > 1000000)
      fail(n, where, "'" + std::string(key) + "' must be an integer from 1 to 1000000");
    return static_cast<int>(n->as_integer()->get());
  }

  /// The array of tables under `key` (an absent key is an empty list).
  const toml::array* tables(const toml::table& t, const char* key, const std::string& where) const {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    const toml::array* a = n->as_array();
    if (!a || !a->is_array_of_tables())
      fail(n, where, "'" + std::string(key) + "' must be an array of tables ([[" + key + "]])");
    return a;
  }

  /// A link given as { bandwidth_gbps, latency_us } (both required unless
  /// `defaults` supplies them).
  link_spec link(const toml::table& t, const std::string& where, const link_spec* defaults,
                 std::initializer_list<const char*> extra_keys = {}) const {
    std::vector<const char*> keys{"bandwidth_gbps", "latency_us"};
    keys.insert(keys.end(), extra_keys.begin(), extra_keys.end());
    for (const auto& [key, value] : t)
      if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return key.str() == k; }) ==
          keys.end())
        fail(&value, where,
             "unknown key '" + std::string(key.str()) + "' (expected: bandwidth_gbps, latency_us)");
    double bw_default = defaults ? defaults->bandwidth * 8.0 / 1e9 : 0.0;
    double lat_default = defaults ? defaults->latency * 1e6 : 0.0;
    double bw = positive(t, "bandwidth_gbps", where, "Gbit/s", defaults ? &bw_default : nullptr);
    double lat = non_negative(t, "latency_us", where, "microseconds", defaults ? &lat_default : nullptr);
    return {gbit_per_s(bw), microseconds(lat)};
  }

  const std::string& origin() const { return origin_; }

 private:
  double number(const toml::table& t, const char* key, const std::string& where, const char* unit,
                const double* fallback, bool zero_ok,
                double most = std::numeric_limits<double>::max()) const {
    const toml::node* n = t.get(key);
    if (!n) {
      if (fallback) return *fallback;
      fail(&t, where, "missing key '" + std::string(key) + "' (" + unit + ")");
    }
    double v = 0;
    if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
    else if (n->is_floating_point()) v = n->as_floating_point()->get();
    else fail(n, where, "'" + std::string(key) + "' must be a number (" + unit + ")");
    if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0)) {
      std::ostringstream got;
      got << v;
      fail(n, where, "'" + std::string(key) + "' must be a " + (zero_ok ? "non-negative" : "positive") +
                         " number (" + unit + "), got " + got.str());
    }
    if (v > most) {
      char limit[32], got[32];
      std::snprintf(limit, sizeof limit, "%.15g", most);
      std::snprintf(got, sizeof got, "%.15g", v);
      fail(n, where, "'" + std::string(key) + "' must be at most " + limit + " (" + unit + "), got " + got);
    }
    return v;
  }

  const std::string& origin_;
};

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

/// Intra-node presets: NVLink (A100/H100 class, per direction), PCIe 4.0
/// x16, and shared memory between processes of one host.
link_spec intra_preset(const std::string& name, const reader& r, const toml::node* at,
                       const std::string& where) {
  if (name == "nvlink") return {gbit_per_s(2400), microseconds(1)};
  if (name == "pcie") return {gbit_per_s(256), microseconds(2)};
  if (name == "shm") return {gbit_per_s(160), microseconds(1)};
  r.fail(at, where, "'intra_node' is '" + name +
                        "'; expected nvlink, pcie, shm or a table { bandwidth_gbps, latency_us }");
}

struct node_group {
  std::vector<std::string> names;
  int nic = 0;
  link_spec intra;
  std::vector<worker_spec> workers;  // one node's workers (rank/node/cluster filled later)
};

class cluster_parser {
 public:
  cluster_parser(const toml::table& root, const std::string& origin) : root_(root), r_(origin) {}

  cluster_description parse() {
    r_.only_keys(root_, "", {"name", "nic", "cluster", "link"});
    c_.origin = r_.origin();
    std::string stem = std::filesystem::path(r_.origin()).stem().string();
    c_.name = r_.string(root_, "name", "", &stem);
    for (const char* builtin : {"ib", "roce", "ethernet"})
      c_.nics.push_back({builtin, default_nic_link(builtin), true});
    read_nic_classes();
    read_clusters();
    read_links();
    c_.validate();
    return std::move(c_);
  }

 private:
  void read_nic_classes() {
    const toml::node* n = root_.get("nic");
    if (!n) return;
    const toml::table* t = n->as_table();
    if (!t) r_.fail(n, "", "'nic' must be a table of NIC classes ([nic.<name>])");
    for (const auto& [key, value] : *t) {
      std::string name(key.str());
      std::string where = "NIC class " + in_quotes(name);
      const toml::table* ct = value.as_table();
      if (!ct) r_.fail(&value, where, "must be a table { bandwidth_gbps, latency_us }");
      int i = c_.find_nic(name);
      if (i >= 0) {
        // A built-in class: override only what is given.
        c_.nics[i].link = r_.link(*ct, where, &c_.nics[i].link);
      } else {
        c_.nics.push_back({name, r_.link(*ct, where, nullptr), false});
      }
    }
  }

  /// The NIC class of a node: a class name or measured numbers.
  int node_nic(const toml::table& t, const std::string& where) {
    const toml::node* n = t.get("nic");
    if (!n) r_.fail(&t, where, "missing key 'nic' (ib, roce, ethernet, a [nic.<name>] class, or "
                               "{ bandwidth_gbps, latency_us })");
    if (n->is_string()) {
      std::string name = n->as_string()->get();
      int i = c_.find_nic(name);
      if (i < 0 || name.rfind("measured ", 0) == 0) {
        std::string known;
        for (const auto& k : c_.nics)
          if (k.name.rfind("measured ", 0) != 0) known += (known.empty() ? "" : ", ") + k.name;
        r_.fail(n, where, "unknown NIC class '" + name + "' (known: " + known +
                              "; or give measured numbers { bandwidth_gbps, latency_us })");
      }
      return i;
    }
    if (const toml::table* m = n->as_table()) {
      link_spec l = r_.link(*m, where + ", nic", nullptr);
      // Nodes with the same measurement share a class; different numbers
      // mean different fabrics, so a DP group never mixes them.
      std::string name = "measured " + describe_link(l);
      int i = c_.find_nic(name);
      if (i >= 0) return i;
      c_.nics.push_back({name, l, false});
      return static_cast<int>(c_.nics.size()) - 1;
    }
    r_.fail(n, where, "'nic' must be a class name or a table { bandwidth_gbps, latency_us }");
  }

  link_spec node_intra(const toml::table& t, const std::string& where) {
    const toml::node* n = t.get("intra_node");
    if (!n) return intra_preset("pcie", r_, &t, where);
    if (n->is_string()) return intra_preset(n->as_string()->get(), r_, n, where);
    if (const toml::table* m = n->as_table()) return r_.link(*m, where + ", intra_node", nullptr);
    r_.fail(n, where, "'intra_node' must be nvlink, pcie, shm or a table { bandwidth_gbps, latency_us }");
  }

  std::vector<worker_spec> node_workers(const toml::table& t, const std::string& where) {
    const toml::array* list = r_.tables(t, "worker", where);
    if (!list || list->empty())
      r_.fail(&t, where, "no workers: add at least one [[cluster.node.worker]] table "
                         "(tflops, memory_gib, optional model, kind, count)");
    std::vector<worker_spec> out;
    int index = 0;
    for (const toml::node& wn : *list) {
      const toml::table& w = *wn.as_table();
      std::string wwhere = where + ", worker " + std::to_string(index++);
      r_.only_keys(w, wwhere, {"model", "kind", "tflops", "memory_gib", "count"});
      worker_spec spec;
      std::string gpu = "gpu";
      std::string kind = r_.string(w, "kind", wwhere, &gpu);
      if (kind == "gpu") spec.kind = worker_kind::gpu;
      else if (kind == "cpu") spec.kind = worker_kind::cpu;
      else r_.fail(w.get("kind"), wwhere, "'kind' is '" + kind + "'; expected gpu or cpu");
      spec.model = r_.string(w, "model", wwhere, &kind);
      // Bounds far past any device: what lies beyond them is a typo, and
      // 1e300 GiB would overflow to infinite bytes.
      spec.flops = r_.positive(w, "tflops", wwhere, "effective TFLOP/s", nullptr, 1e6) * 1e12;
      spec.memory = gib(r_.positive(w, "memory_gib", wwhere, "GiB", nullptr, 1048576));
      int n = r_.count(w, "count", wwhere);
      if (out.size() + static_cast<std::size_t>(n) > max_node_workers)
        r_.fail(&w, wwhere, "a node of more than " + std::to_string(max_node_workers) +
                                " workers (describe the machine as several nodes)");
      for (int k = 0; k < n; ++k) out.push_back(spec);
    }
    return out;
  }

  node_group read_node_group(const toml::table& t, const std::string& cluster_where, int index) {
    std::string where = cluster_where + ", node " + std::to_string(index);
    r_.only_keys(t, where, {"name", "names", "count", "nic", "intra_node", "worker"});
    node_group g;
    const toml::node* names = t.get("names");
    if (names && t.get("name")) r_.fail(names, where, "give either 'name' (with an optional 'count') or 'names', not both");
    if (names) {
      const toml::array* a = names->as_array();
      if (!a || a->empty()) r_.fail(names, where, "'names' must be a non-empty list of strings");
      for (const toml::node& e : *a) {
        if (!e.is_string() || e.as_string()->get().empty())
          r_.fail(&e, where, "'names' must be a non-empty list of strings");
        g.names.push_back(e.as_string()->get());
      }
      if (t.get("count")) r_.fail(t.get("count"), where, "'count' is implied by 'names'; remove it");
    } else {
      std::string base = r_.string(t, "name", where);
      int count = r_.count(t, "count", where);
      if (count == 1) g.names.push_back(base);
      for (int k = 0; count > 1 && k < count; ++k) g.names.push_back(base + std::to_string(k));
    }
    where = cluster_where + ", node " + in_quotes(g.names.front());
    g.nic = node_nic(t, where);
    g.intra = node_intra(t, where);
    g.workers = node_workers(t, where);
    // Before the workers are made: a file of a million nodes of a million
    // workers each would be allocated, not refused.
    if (static_cast<double>(c_.workers.size()) + static_cast<double>(g.names.size()) * g.workers.size() >
        max_cluster_workers)
      r_.fail(&t, where, "the file describes more than " + std::to_string(max_cluster_workers) +
                             " workers (the planner's limit)");
    return g;
  }

  void read_clusters() {
    const toml::array* list = r_.tables(root_, "cluster", "");
    if (!list || list->empty())
      r_.fail(&root_, "", "no clusters: add at least one [[cluster]] table with its [[cluster.node]] tables");
    std::map<std::string, const toml::node*> node_names;
    for (const toml::node& cn : *list) {
      const toml::table& t = *cn.as_table();
      std::string where = "cluster " + std::to_string(c_.clusters.size());
      r_.only_keys(t, where, {"name", "node"});
      std::string name = r_.string(t, "name", where);
      where = "cluster " + in_quotes(name);
      for (const auto& existing : c_.clusters)
        if (existing.name == name) r_.fail(t.get("name"), where, "the cluster name is used twice");
      int ci = static_cast<int>(c_.clusters.size());
      c_.clusters.push_back({name, {}});
      const toml::array* nodes = r_.tables(t, "node", where);
      if (!nodes || nodes->empty()) r_.fail(&t, where, "no nodes: add [[cluster.node]] tables");
      int index = 0;
      for (const toml::node& nn : *nodes) {
        node_group g = read_node_group(*nn.as_table(), where, index++);
        for (const std::string& node_name : g.names) {
          if (node_names.count(node_name))
            r_.fail(&nn, where, "node name " + in_quotes(node_name) + " is used twice (node names are unique in a file)");
          node_names[node_name] = &nn;
          add_node(node_name, g, ci);
        }
      }
    }
  }

  /// Node `name` of group `g` in cluster `ci`, its workers last in file order.
  void add_node(const std::string& name, const node_group& g, int ci) {
    node_spec node;
    node.name = name;
    node.cluster = ci;
    node.nic = g.nic;
    node.intra = g.intra;
    const int ni = static_cast<int>(c_.nodes.size());
    for (std::size_t k = 0; k < g.workers.size(); ++k) {
      worker_spec w = g.workers[k];
      w.rank = c_.size();
      w.name = name + "/" + std::to_string(k);
      w.node = ni;
      w.cluster = ci;
      w.nic = g.nic;
      node.workers.push_back(w.rank);
      c_.workers.push_back(std::move(w));
    }
    c_.clusters[static_cast<std::size_t>(ci)].nodes.push_back(ni);
    c_.nodes.push_back(std::move(node));
  }

 public:
  /// with_machine: `base` and the machine root_ describes.
  cluster_description add_machine(cluster_description base) {
    c_ = std::move(base);
    const std::string where = "machine";
    r_.only_keys(root_, where, {"cluster", "name", "nic", "intra_node", "worker"});
    const std::string cluster = r_.string(root_, "cluster", where);
    int ci = -1;
    std::string known;
    for (std::size_t i = 0; i < c_.clusters.size(); ++i) {
      if (c_.clusters[i].name == cluster) ci = static_cast<int>(i);
      known += (known.empty() ? "" : ", ") + in_quotes(c_.clusters[i].name);
    }
    if (ci < 0) r_.fail(root_.get("cluster"), where, "unknown cluster " + in_quotes(cluster) + " (the file has " + known + ")");
    toml::table node = root_;
    node.erase("cluster");
    const node_group g = read_node_group(node, "cluster " + in_quotes(cluster), 0);
    const std::string& name = g.names.front();
    for (const node_spec& n : c_.nodes)
      if (n.name == name) r_.fail(root_.get("name"), where, "node name " + in_quotes(name) + " is the file's already");
    if (g.workers.size() != 1)
      r_.fail(&root_, where, "a machine that joins runs one rank: describe exactly one worker (count 1), not " +
                                 std::to_string(g.workers.size()));
    add_node(name, g, ci);
    c_.validate();
    return std::move(c_);
  }

 private:
  /// The slowest NIC class used by any node: the default link between
  /// clusters (an inter-cluster path is no faster than the worst fabric
  /// the file mentions unless the file says so).
  link_spec slowest_used_class() const {
    const nic_class* worst = nullptr;
    for (const auto& n : c_.nodes) {
      const nic_class& k = c_.nics[n.nic];
      if (!worst || k.link.bandwidth < worst->link.bandwidth ||
          (k.link.bandwidth == worst->link.bandwidth && k.link.latency > worst->link.latency))
        worst = &k;
    }
    return worst->link;
  }

  void read_links() {
    std::size_t k = c_.clusters.size();
    c_.inter_cluster.assign(k * k, slowest_used_class());
    std::vector<bool> given(k * k, false);
    const toml::array* list = r_.tables(root_, "link", "");
    if (!list) return;
    int index = 0;
    for (const toml::node& ln : *list) {
      const toml::table& t = *ln.as_table();
      std::string where = "link " + std::to_string(index++);
      const toml::node* cn = t.get("clusters");
      if (!cn) r_.fail(&t, where, "missing key 'clusters' (the two cluster names it joins)");
      const toml::array* a = cn->as_array();
      if (!a || a->size() != 2 || !(*a)[0].is_string() || !(*a)[1].is_string())
        r_.fail(cn, where, "'clusters' must be a list of two cluster names");
      int ends[2];
      for (int e = 0; e < 2; ++e) {
        std::string name = (*a)[e].as_string()->get();
        auto it = std::find_if(c_.clusters.begin(), c_.clusters.end(),
                               [&](const cluster_spec& c) { return c.name == name; });
        if (it == c_.clusters.end()) r_.fail(cn, where, "unknown cluster " + in_quotes(name));
        ends[e] = static_cast<int>(it - c_.clusters.begin());
      }
      if (ends[0] == ends[1]) r_.fail(cn, where, "a link joins two different clusters");
      where = "link " + in_quotes(c_.clusters[ends[0]].name) + " - " + in_quotes(c_.clusters[ends[1]].name);
      link_spec l = r_.link(t, where, nullptr, {"clusters"});
      std::size_t ab = ends[0] * k + ends[1], ba = ends[1] * k + ends[0];
      if (given[ab]) r_.fail(&t, where, "this pair of clusters has two links");
      given[ab] = given[ba] = true;
      c_.inter_cluster[ab] = c_.inter_cluster[ba] = l;
    }
  }

  const toml::table& root_;
  reader r_;
  cluster_description c_;
};

/// The TOML table of `text`; model_error naming origin, line and column.
toml::table parse_toml(std::string_view text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw model_error(origin + ":" + std::to_string(e.source().begin.line) + ":" +
                      std::to_string(e.source().begin.column) + ": invalid TOML: " + std::string(e.description()));
  }
}

}  // namespace

cluster_description parse_cluster(std::string_view toml_text, const std::string& origin) {
  const toml::table root = parse_toml(toml_text, origin);
  return cluster_parser(root, origin).parse();
}

cluster_description with_machine(const cluster_description& file, std::string_view machine_toml,
                                 const std::string& origin) {
  const toml::table root = parse_toml(machine_toml, origin);
  return cluster_parser(root, origin).add_machine(file);
}

}  // namespace corolla::schedule
