// apps/plan_print.hpp — the human-readable plan table of `corolla plan`,
// also printed by `corolla train --cluster` and the demo before training.
#pragma once

#include <cstdio>
#include <string>

#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

/// Seconds in a readable unit ("12.345 s", "3.2 ms", "4.1 h", "2.5 days",
/// "1.2e+03 years"; "forever" when not finite): a slow cluster's step can
/// take years, and is not printed as a hundred digits of seconds.
std::string duration_text(double seconds);

/// The plan's stages (layers, workers, cluster, NIC, speed, memory, times),
/// its predicted step and throughput, as lines of text.
std::string plan_text(const schedule::cluster_description& c, const schedule::plan& p);
/// plan_text written to `out` in one write (another thread's log line
/// cannot land inside it; a caller's prefix should go in the same write).
void print_plan(std::FILE* out, const schedule::cluster_description& c, const schedule::plan& p);

}  // namespace corolla::app
