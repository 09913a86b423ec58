// apps/plan_print.hpp — the human-readable plan table of `corolla plan`,
// also printed by `corolla train --cluster` and the demo before training.
#pragma once

#include <cstdio>
#include <string>

#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

/// The plan's stages (layers, workers, cluster, NIC, speed, memory, times),
/// its predicted step and throughput, as lines of text.
std::string plan_text(const schedule::cluster_description& c, const schedule::plan& p);
/// plan_text written to `out` in one write (another thread's log line
/// cannot land inside it; a caller's prefix should go in the same write).
void print_plan(std::FILE* out, const schedule::cluster_description& c, const schedule::plan& p);

}  // namespace corolla::app
