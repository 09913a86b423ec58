// schedule/cluster.hpp — what a training job runs on: clusters of nodes,
// the workers (GPUs or CPU workers) of each node with their speed and
// memory, each node's NIC class, and the links between all of them.
//
// The description is pure data plus one rule, link_between(): how fast two
// workers talk. It is read from a TOML file (docs/planner.md documents the
// format) and consumed by the cost model and the planner; the runtime uses
// it to know which NIC class (and so which transport) a group shares.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace corolla::schedule {

/// One direction of a link as the cost model sees it.
struct link_spec {
  double bandwidth = 0;  ///< bytes per second (> 0; +inf for a worker to itself)
  double latency = 0;    ///< seconds per message, one way (>= 0)

  /// Seconds to move `bytes` over this link as one message: latency + bytes/bandwidth.
  double time(double bytes) const;
};

/// One probe of the link between two workers: what a training rank measured
/// and reports (train.report), the coordinator gathers per step, and the
/// elastic scheduler folds into the description (schedule/replan.hpp).
struct link_measurement {
  /// The prober and its peer: job ranks in a rank's report and the step
  /// report, worker ranks of the description in schedule/replan.hpp.
  int from = 0, to = 0;
  /// Bytes per second both ways averaged; 0 = too fast to tell with the
  /// probe's payload (at least as fast as anything the probe can see).
  double bandwidth = 0;
};

/// Gbit/s -> bytes/s.
constexpr double gbit_per_s(double gbit) { return gbit * 1e9 / 8.0; }
/// Microseconds -> seconds.
constexpr double microseconds(double us) { return us * 1e-6; }
/// GiB -> bytes.
constexpr double gib(double g) { return g * 1024.0 * 1024.0 * 1024.0; }

/// A NIC class: the transport every member of a communication group must
/// share for the group to run at full speed (Holmes: IB, RoCE, Ethernet).
/// Nodes with a measured NIC (numbers instead of a class name) get a class
/// of their own per distinct measurement.
struct nic_class {
  std::string name;   ///< "ib", "roce", "ethernet", a [nic.<name>] table, or "measured ..."
  link_spec link;     ///< between two nodes of this class in one cluster
  bool builtin = false;  ///< one of the three named classes (defaults overridable)
};

/// Default numbers of the built-in classes: ib 200 Gbit/s 2 us, roce
/// 100 Gbit/s 5 us, ethernet 25 Gbit/s 30 us.
link_spec default_nic_link(std::string_view builtin_class);

/// What kind of processor a worker is (the runtime picks a backend by it).
enum class worker_kind { gpu, cpu };

/// One worker: a GPU or a CPU worker, the unit that holds one (stage,
/// replica) of a plan. Its rank is its index in file order.
struct worker_spec {
  int rank = 0;            ///< index into cluster_description::workers (file order)
  std::string name;        ///< "<node>/<index within node>", unique in the file
  std::string model;       ///< "A100-80G", "H100", "epyc-7763", ...
  worker_kind kind = worker_kind::gpu;
  double flops = 0;        ///< effective FLOP/s this worker sustains on transformer blocks
  double memory = 0;       ///< bytes of memory usable by training
  int node = 0;            ///< index into cluster_description::nodes
  int cluster = 0;         ///< index into cluster_description::clusters
  int nic = 0;             ///< index into cluster_description::nics (the node's class)
};

/// One machine: its workers share the intra-node link and one NIC class.
struct node_spec {
  std::string name;        ///< unique in the file
  int cluster = 0;         ///< index into cluster_description::clusters
  int nic = 0;             ///< index into cluster_description::nics
  link_spec intra;         ///< between two workers of this node (NVLink, PCIe, shared memory)
  std::vector<int> workers;  ///< ranks, in order
};

/// A named set of nodes (a site, a data centre, a cloud region).
struct cluster_spec {
  std::string name;        ///< unique in the file
  std::vector<int> nodes;  ///< indices into cluster_description::nodes
};

/// The most workers a cluster description may have (the planner searches
/// layouts over them; a file describing more is refused as it is read).
inline constexpr int max_cluster_workers = 65536;
/// The most workers one node may have (a machine's GPUs or CPU workers;
/// the planner's work grows with the square of a node's workers).
inline constexpr std::size_t max_node_workers = 1024;

/// The whole description: clusters, nodes, workers, NIC classes and the
/// links between clusters. Indices are stable; workers are in file order.
struct cluster_description {
  std::string name;        ///< the file's `name`, else the file stem
  std::string origin;      ///< the file it came from (for messages)
  std::vector<nic_class> nics;
  std::vector<cluster_spec> clusters;
  std::vector<node_spec> nodes;
  std::vector<worker_spec> workers;
  /// inter_cluster[a * clusters.size() + b]: the WAN/backbone link between
  /// clusters a and b (a != b). Not capped by the nodes' NICs: see link_between.
  std::vector<link_spec> inter_cluster;
  /// Links measured while a job ran that replace the rule below, by the
  /// worker names of (sender, receiver) (names survive without_workers'
  /// renumbering). Set by schedule::with_measurements (replan.hpp), never
  /// read from a file.
  std::map<std::pair<std::string, std::string>, link_spec> measured;
  /// Workers whose `flops` a measurement replaced (a straggler), by worker
  /// name: the file's figure, what a recovery goes back to. Set by
  /// schedule::with_compute (replan.hpp), never read from a file.
  std::map<std::string, double> nominal_flops;

  /// The link between two workers, by rank: a measured one when there is
  /// one (`measured`), else the rule (docs/planner.md): the same worker: infinite bandwidth, no latency; the same node: the
  /// node's intra link; the same cluster and NIC class: the class link;
  /// the same cluster, different classes (a mixed group falls back to TCP,
  /// as in Holmes): the slower of the two classes (min bandwidth, max
  /// latency); different clusters: the inter-cluster link, further capped
  /// by both nodes' NIC classes (min bandwidth, max latency over the path).
  link_spec link_between(int rank_a, int rank_b) const;
  /// The slowest effective link among `transfers` (rank pairs, sender
  /// first) that run at the same time: each pair's link_between(), except
  /// that an inter-cluster link's bandwidth is the aggregate of the link and
  /// is divided among the transfers crossing it in the same direction.
  /// Infinite bandwidth and zero latency for no transfers.
  link_spec concurrent_link(const std::vector<std::pair<int, int>>& transfers) const;
  /// The link between two clusters (a != b) before capping by the NICs.
  const link_spec& cluster_link(int a, int b) const;
  /// Number of workers.
  int size() const { return static_cast<int>(workers.size()); }
  /// Index of the NIC class called `name`, or -1.
  int find_nic(std::string_view name) const;

  /// Checks the invariants the planner relies on (indices in range, every
  /// node has workers, positive speeds, memories and bandwidths, the
  /// inter-cluster matrix sized). Throws model_error naming `origin`.
  void validate() const;
};

/// `c` without the workers `gone` (ranks of `c`): the machines an elastic
/// job lost. Nodes and clusters left without workers go too (and their rows
/// of the inter-cluster links); the others keep their order, and the
/// workers are numbered again from 0. Throws model_error when no worker is
/// left.
cluster_description without_workers(const cluster_description& c, const std::vector<int>& gone);

/// Parses cluster TOML text; `origin` (a file name) appears in every error.
/// Throws model_error naming the file, the key (and its line) and what is wrong.
cluster_description parse_cluster(std::string_view toml_text, const std::string& origin);
/// `file` with one more machine: a node described in the file's terms by
/// `machine_toml`, a table with `cluster` (the name of one of the file's
/// clusters), `name` (a node name the file does not use), `nic`, optional
/// `intra_node`, and exactly one [[worker]] (kind, model, tflops,
/// memory_gib), as a [[cluster.node]] of the file. Its worker,
/// "<name>/0", comes last in file order. Throws model_error (naming
/// `origin`) for TOML or a description that does not fit the file.
cluster_description with_machine(const cluster_description& file, std::string_view machine_toml,
                                 const std::string& origin);

/// A single cluster of `nodes` identical nodes with `workers_per_node`
/// workers each, all on NIC class `nic` (a built-in class name) with its
/// default link: the layout `--pp P --dp D` on loopback stands for.
cluster_description uniform_cluster(int nodes, int workers_per_node, std::string_view nic,
                                    double tflops, double memory_gib,
                                    worker_kind kind = worker_kind::gpu);

/// "ib0/0-7" style short list of workers (by rank): consecutive indices of
/// one node are merged, nodes are separated by ", ".
std::string describe_workers(const cluster_description& c, const std::vector<int>& ranks);
/// "200 Gbit/s, 2 us".
std::string describe_link(const link_spec& l);

}  // namespace corolla::schedule
