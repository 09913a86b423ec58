// schedule/membership.hpp — which machines of a cluster file an elastic job
// runs on. The file describes every machine the job may use; some are
// absent: standby machines that have not joined yet (`--standby`), and
// machines the job lost. The planner plans on the present ones, with what
// the job has measured of them so far; a machine that joins (or comes
// back) adds itself to the description, and the running plan is priced on
// the grown description under its new worker numbering. Pure:
// descriptions in, descriptions and plans out.
#pragma once

#include <set>
#include <string>

#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::schedule {

/// `file` without the workers named in `absent` (without_workers: file
/// order kept, workers numbered again from 0), carrying over what
/// `learned` (an earlier present description of the same file, or null)
/// measured of the workers both hold: measured links between two present
/// workers, and a straggler's replaced FLOP/s with its nominal figure.
/// Throws model_error naming a worker of `absent` the file does not have,
/// or when no worker is left.
cluster_description present_workers(const cluster_description& file, const std::set<std::string>& absent,
                                    const cluster_description* learned = nullptr);

/// `p`, a plan over the workers of `from`, with its workers (every stage's
/// and the idle) numbered as in `to`, by worker name: the same layout on
/// a description that gained (or lost, elsewhere) workers. Throws
/// model_error naming a worker of the plan that `to` does not have.
plan renumber_plan(const plan& p, const cluster_description& from, const cluster_description& to);

}  // namespace corolla::schedule
