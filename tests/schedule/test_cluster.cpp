// Cluster TOML: parsing the example files, the link rule, validation errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "model/error.hpp"
#include "tests/schedule/example_clusters.hpp"
#include "schedule/cluster.hpp"

using namespace corolla;
using namespace corolla::schedule;

namespace {

using corolla::schedule::testing::example;
using corolla::schedule::testing::example_cluster;

/// The message parse_cluster throws for `text`, or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "bad.toml");
  } catch (const model_error& e) {
    return e.what();
  }
  return "";
}

const char* kOneNode = R"(
[[cluster]]
name = "a"
  [[cluster.node]]
  name = "n"
  nic = "ib"
    [[cluster.node.worker]]
    tflops = 100
    memory_gib = 40
    count = 2
)";

}  // namespace

TEST_CASE("the example cluster files parse into clusters, nodes and ranked workers") {
  cluster_description c = example_cluster("ib_roce.toml");
  CHECK(c.name == "ib-roce");
  REQUIRE(c.clusters.size() == 2);
  CHECK(c.clusters[0].name == "ib-pod");
  CHECK(c.nodes.size() == 8);
  REQUIRE(c.size() == 64);
  CHECK(c.nodes[0].name == "ib0");
  CHECK(c.nodes[3].name == "ib3");
  CHECK(c.nodes[4].name == "roce0");
  CHECK(c.workers[0].name == "ib0/0");
  CHECK(c.workers[63].name == "roce3/7");
  for (int r = 0; r < c.size(); ++r) CHECK(c.workers[r].rank == r);
  CHECK(c.workers[9].node == 1);
  CHECK(c.workers[40].cluster == 1);
  CHECK(c.workers[0].model == "A100-80G");
  CHECK(c.workers[0].kind == worker_kind::gpu);
  CHECK(c.workers[0].flops == doctest::Approx(180e12));
  CHECK(c.workers[0].memory == doctest::Approx(80.0 * 1024 * 1024 * 1024));
  CHECK(c.nics[c.workers[0].nic].name == "ib");
  CHECK(c.nics[c.workers[40].nic].name == "roce");

  for (const char* f : {"ib_ethernet.toml", "three_clusters.toml", "unequal_gpus.toml", "memory_tight.toml"}) {
    CAPTURE(f);
    CHECK_NOTHROW(example_cluster(f));
  }
  cluster_description three = example_cluster("three_clusters.toml");
  CHECK(three.clusters.size() == 3);
  CHECK(three.size() == 48);
  CHECK(three.nodes[0].name == "h0");  // from a `names` list
  CHECK(three.nodes[5].name == "v1");
}

TEST_CASE("NIC classes have the documented defaults and can be overridden or measured") {
  cluster_description c = parse_cluster(kOneNode, "one.toml");
  auto nic = [&](const char* n) { return c.nics.at(c.find_nic(n)).link; };
  CHECK(nic("ib").bandwidth == doctest::Approx(200e9 / 8));
  CHECK(nic("ib").latency == doctest::Approx(2e-6));
  CHECK(nic("roce").bandwidth == doctest::Approx(100e9 / 8));
  CHECK(nic("roce").latency == doctest::Approx(5e-6));
  CHECK(nic("ethernet").bandwidth == doctest::Approx(25e9 / 8));
  CHECK(nic("ethernet").latency == doctest::Approx(30e-6));

  // three_clusters.toml overrides RoCE's numbers.
  cluster_description three = example_cluster("three_clusters.toml");
  const link_spec& roce = three.nics.at(three.find_nic("roce")).link;
  CHECK(roce.bandwidth == doctest::Approx(100e9 / 8));
  CHECK(roce.latency == doctest::Approx(4e-6));

  // memory_tight.toml has measured nodes: one class shared by both nodes.
  cluster_description tight = example_cluster("memory_tight.toml");
  int ws0 = tight.nodes.at(4).nic, ws1 = tight.nodes.at(5).nic;
  CHECK(ws0 == ws1);
  CHECK(tight.nics[ws0].name == "measured 50 Gbit/s, 8 us");
  CHECK(tight.nics[ws0].link.bandwidth == doctest::Approx(50e9 / 8));
  CHECK(tight.nodes.at(4).intra.bandwidth == doctest::Approx(400e9 / 8));

  // A named class of its own.
  cluster_description custom = parse_cluster(R"(
[nic.slingshot]
bandwidth_gbps = 180
latency_us = 3
[[cluster]]
name = "a"
  [[cluster.node]]
  name = "n"
  count = 2
  nic = "slingshot"
    [[cluster.node.worker]]
    tflops = 1
    memory_gib = 1
)", "custom.toml");
  CHECK(custom.nics[custom.workers[0].nic].name == "slingshot");
  CHECK(custom.link_between(0, 1).latency == doctest::Approx(3e-6));
}

TEST_CASE("the link between two workers follows node, class and cluster") {
  cluster_description c = example_cluster("three_clusters.toml");
  // Ranks: h0 0-7, h1 8-15 (ib), a0 16-23, a1 24-31 (roce), v0 32-39, v1 40-47 (ethernet).
  CHECK(std::isinf(c.link_between(3, 3).bandwidth));
  CHECK(c.link_between(0, 1).bandwidth == doctest::Approx(2400e9 / 8));  // NVLink
  CHECK(c.link_between(32, 33).bandwidth == doctest::Approx(256e9 / 8));  // PCIe
  CHECK(c.link_between(0, 8).bandwidth == doctest::Approx(200e9 / 8));    // IB between nodes
  CHECK(c.link_between(0, 8).latency == doctest::Approx(2e-6));
  // Across clusters: the inter-cluster link capped by both NICs.
  link_spec ha = c.link_between(0, 16);
  CHECK(ha.bandwidth == doctest::Approx(100e9 / 8));  // RoCE NIC < 400 Gbit/s link
  CHECK(ha.latency == doctest::Approx(200e-6));
  link_spec hv = c.link_between(0, 40);
  CHECK(hv.bandwidth == doctest::Approx(25e9 / 8));
  CHECK(hv.latency == doctest::Approx(2000e-6));
  CHECK(c.link_between(40, 0).bandwidth == hv.bandwidth);

  // Replicas crossing to another cluster at once share its bandwidth.
  link_spec one = c.concurrent_link({{24, 32}});
  link_spec four = c.concurrent_link({{24, 32}, {25, 33}, {26, 34}, {27, 35}});
  CHECK(one.bandwidth == doctest::Approx(25e9 / 8));        // ethernet NIC caps 100 Gbit/s
  CHECK(four.bandwidth == doctest::Approx(100e9 / 8 / 4));  // 100 Gbit/s shared by four
  CHECK(four.latency == doctest::Approx(500e-6));
  // Opposite directions do not share.
  CHECK(c.concurrent_link({{24, 32}, {33, 25}}).bandwidth == doctest::Approx(25e9 / 8));

  // Mixed classes inside one cluster: the slower class.
  cluster_description mixed = parse_cluster(R"(
[[cluster]]
name = "a"
  [[cluster.node]]
  name = "fast"
  nic = "ib"
    [[cluster.node.worker]]
    tflops = 1
    memory_gib = 1
  [[cluster.node]]
  name = "slow"
  nic = "ethernet"
    [[cluster.node.worker]]
    tflops = 1
    memory_gib = 1
)", "mixed.toml");
  CHECK(mixed.link_between(0, 1).bandwidth == doctest::Approx(25e9 / 8));
  CHECK(mixed.link_between(0, 1).latency == doctest::Approx(30e-6));
}

TEST_CASE("an unlisted link between clusters defaults to the slowest NIC class of the file") {
  cluster_description c = parse_cluster(R"(
[[cluster]]
name = "a"
  [[cluster.node]]
  name = "x"
  nic = "ib"
    [[cluster.node.worker]]
    tflops = 1
    memory_gib = 1
[[cluster]]
name = "b"
  [[cluster.node]]
  name = "y"
  nic = "roce"
    [[cluster.node.worker]]
    tflops = 1
    memory_gib = 1
)", "two.toml");
  CHECK(c.cluster_link(0, 1).bandwidth == doctest::Approx(100e9 / 8));
  CHECK(c.cluster_link(1, 0).latency == doctest::Approx(5e-6));
}

TEST_CASE("cluster validation errors name the file, the line, the place and the key") {
  struct bad_case {
    const char* what;
    std::string text;
    std::vector<std::string> expected;
  };
  std::string node_head = "[[cluster]]\nname = \"a\"\n  [[cluster.node]]\n  name = \"n\"\n";
  std::vector<bad_case> cases = {
      {"missing tflops", node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n    memory_gib = 40\n",
       {"bad.toml:6:", "cluster 'a', node 'n', worker 0", "missing key 'tflops'"}},
      {"negative memory",
       node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n    tflops = 1\n    memory_gib = -3\n",
       {"bad.toml:8:", "'memory_gib' must be a positive number (GiB), got -3"}},
      {"unknown NIC class", node_head + "  nic = \"infiniband\"\n    [[cluster.node.worker]]\n    tflops = 1\n    memory_gib = 1\n",
       {"bad.toml:5:", "node 'n'", "unknown NIC class 'infiniband'", "ib, roce, ethernet"}},
      {"typo in a key",
       "[nic.ib]\nbandwith_gbps = 100\n" + node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n    tflops = 1\n    memory_gib = 1\n",
       {"bad.toml:2:", "NIC class 'ib'", "unknown key 'bandwith_gbps'"}},
      {"measured class without latency", "[nic.opa]\nbandwidth_gbps = 100\n" + node_head + "  nic = \"opa\"\n",
       {"bad.toml:1:", "NIC class 'opa'", "missing key 'latency_us'"}},
      {"no workers", node_head + "  nic = \"ib\"\n", {"bad.toml:3:", "node 'n'", "no workers"}},
      {"no clusters", "name = \"x\"\n", {"bad.toml", "no clusters"}},
      {"unknown worker kind",
       node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n    kind = \"tpu\"\n    tflops = 1\n    memory_gib = 1\n",
       {"bad.toml:7:", "'kind' is 'tpu'; expected gpu or cpu"}},
      {"zero count", node_head + "  count = 0\n  nic = \"ib\"\n", {"bad.toml:5:", "'count' must be an integer from 1 to 1000000"}},
      {"a node of a million workers", node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n"
                                                   "    tflops = 1\n    memory_gib = 1\n    count = 1000000\n",
       {"bad.toml:6:", "a node of more than 1024 workers"}},
      {"a million nodes of a thousand workers", node_head + "  count = 1000000\n  nic = \"ib\"\n    [[cluster.node.worker]]\n"
                                                             "    tflops = 1\n    memory_gib = 1\n    count = 1000\n",
       {"bad.toml:3:", "more than 65536 workers"}},
      {"names and name", "[[cluster]]\nname = \"a\"\n  [[cluster.node]]\n  name = \"n\"\n  names = [\"x\"]\n  nic = \"ib\"\n",
       {"bad.toml:5:", "either 'name'", "not both"}},
      {"duplicate node names",
       std::string("[[cluster]]\nname = \"a\"\n  [[cluster.node]]\n  names = [\"n\", \"n\"]\n  nic = \"ib\"\n") +
           "    [[cluster.node.worker]]\n    tflops = 1\n    memory_gib = 1\n",
       {"node name 'n' is used twice"}},
      {"duplicate cluster names",
       std::string(kOneNode) + "[[cluster]]\nname = \"a\"\n", {"cluster 'a'", "the cluster name is used twice"}},
      {"link to an unknown cluster",
       std::string(kOneNode) + "[[link]]\nclusters = [\"a\", \"b\"]\nbandwidth_gbps = 1\nlatency_us = 1\n",
       {"link 0", "unknown cluster 'b'"}},
      {"link of a cluster to itself",
       std::string(kOneNode) + "[[link]]\nclusters = [\"a\", \"a\"]\nbandwidth_gbps = 1\nlatency_us = 1\n",
       {"link 0", "joins two different clusters"}},
      {"bad intra_node preset", node_head + "  nic = \"ib\"\n  intra_node = \"pci\"\n",
       {"bad.toml:6:", "'intra_node' is 'pci'", "nvlink, pcie, shm"}},
      {"unknown top-level key", std::string("clusterz = 1\n") + kOneNode, {"bad.toml:1:", "unknown key 'clusterz'"}},
      {"invalid TOML", "[[cluster]\nname = 1\n", {"bad.toml:1:", "invalid TOML"}},
      {"string where a number belongs",
       node_head + "  nic = \"ib\"\n    [[cluster.node.worker]]\n    tflops = \"fast\"\n    memory_gib = 1\n",
       {"bad.toml:7:", "'tflops' must be a number (effective TFLOP/s)"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    std::string msg = error_of(c.text);
    CAPTURE(msg);
    REQUIRE(!msg.empty());
    for (const auto& e : c.expected) CHECK(msg.find(e) != std::string::npos);
  }
}

TEST_CASE("a cluster without a name is named after its file") {
  cluster_description c = parse_cluster(kOneNode, "/some/where/c.toml");
  CHECK(c.name == "c");  // no `name`: the file stem
  CHECK(c.origin == "/some/where/c.toml");
  CHECK(c.size() == 2);
}

TEST_CASE("uniform clusters and worker lists for messages") {
  cluster_description u = uniform_cluster(2, 4, "roce", 10, 16, worker_kind::cpu);
  CHECK(u.size() == 8);
  CHECK(u.workers[5].name == "node1/1");
  CHECK(u.workers[5].kind == worker_kind::cpu);
  CHECK(u.link_between(0, 4).bandwidth == doctest::Approx(100e9 / 8));
  CHECK(describe_workers(u, {0, 1, 2, 3, 4, 5}) == "node0/0-3, node1/0-1");
  CHECK(describe_workers(u, {0, 2, 3}) == "node0/0, node0/2-3");
  CHECK(describe_link({gbit_per_s(25), microseconds(30)}) == "25 Gbit/s, 30 us");
  CHECK_THROWS_AS(uniform_cluster(0, 1, "ib", 1, 1), model_error);
  CHECK_THROWS_AS(uniform_cluster(1, 1, "myrinet", 1, 1), model_error);
}

TEST_CASE("a cluster without the workers an elastic job lost: nodes and clusters left empty go, links follow") {
  cluster_description c = parse_cluster(R"(
name = "two"
[nic.ib]
bandwidth_gbps = 8
latency_us = 20
[nic.ethernet]
bandwidth_gbps = 1
latency_us = 100
[[cluster]]
name = "fast"
  [[cluster.node]]
  name = "fast"
  count = 2
  nic = "ib"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.2
    memory_gib = 4
[[cluster]]
name = "slow"
  [[cluster.node]]
  name = "eth"
  count = 1
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.1
    memory_gib = 4
    count = 2
[[cluster]]
name = "far"
  [[cluster.node]]
  name = "far"
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.1
    memory_gib = 4
[[link]]
clusters = ["fast", "slow"]
bandwidth_gbps = 1
latency_us = 500
[[link]]
clusters = ["slow", "far"]
bandwidth_gbps = 0.5
latency_us = 900
[[link]]
clusters = ["fast", "far"]
bandwidth_gbps = 0.25
latency_us = 1000
)", "two.toml");
  REQUIRE(c.size() == 5);  // fast0/0, fast1/0, eth/0, eth/1, far/0
  // One worker of a two-worker node: its node stays with the other.
  cluster_description a = without_workers(c, {3});
  CHECK(a.size() == 4);
  CHECK(a.workers[2].name == "eth/0");
  CHECK(a.workers[3].name == "far/0");
  CHECK(a.workers[3].rank == 3);
  CHECK(a.nodes[a.workers[2].node].workers == std::vector<int>{2});
  CHECK(a.link_between(2, 3).latency == doctest::Approx(c.link_between(2, 4).latency));
  // A whole node (fast1) and then a whole cluster (far): gone with their links.
  cluster_description b = without_workers(c, {1, 4});
  CHECK(b.size() == 3);
  CHECK(b.clusters.size() == 2u);
  CHECK(b.nodes.size() == 2u);
  CHECK(b.workers[0].name == "fast0/0");
  CHECK(b.workers[1].name == "eth/0");
  CHECK(b.link_between(0, 1).latency == doctest::Approx(c.link_between(0, 2).latency));
  CHECK(b.link_between(0, 1).bandwidth == doctest::Approx(c.link_between(0, 2).bandwidth));
  CHECK_NOTHROW(b.validate());
  CHECK_THROWS_AS(without_workers(c, {0, 1, 2, 3, 4}), model_error);
}
