// apps/plan_print.hpp — the human-readable plan table of `corolla plan`,
// also printed by `corolla train --cluster` and the demo before training.
#pragma once

#include <cstdio>

#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

/// The plan's stages (layers, workers, cluster, NIC, speed, memory, times),
/// its predicted step and throughput, written to `out`.
void print_plan(std::FILE* out, const schedule::cluster_description& c, const schedule::plan& p);

}  // namespace corolla::app
