// A small two-site cluster the schedule/ tests share.
#pragma once

#include "schedule/cluster.hpp"

namespace corolla::schedule::testing {

/// Ranks 0-3 on two IB nodes of cluster "a" (0,1 on node a0; 2,3 on a1),
/// ranks 4,5 on one RoCE node of cluster "b"; the clusters are joined by a
/// 10 Gbit/s link.
inline cluster_description two_sites() {
  return parse_cluster(R"(
name = "two-sites"
[[cluster]]
name = "a"
  [[cluster.node]]
  name = "a"
  count = 2
  nic = "ib"
    [[cluster.node.worker]]
    model = "gpu"
    tflops = 100
    memory_gib = 80
    count = 2
[[cluster]]
name = "b"
  [[cluster.node]]
  name = "b"
  nic = "roce"
    [[cluster.node.worker]]
    model = "gpu"
    tflops = 100
    memory_gib = 80
    count = 2
[[link]]
clusters = ["a", "b"]
bandwidth_gbps = 10
latency_us = 100
)",
                       "two_sites.toml");
}

}  // namespace corolla::schedule::testing
