// apps/faultlab.hpp — `corolla faultlab`'s runners: one run of a scenario's
// job (the failure-free reference, or the run with the faults injected) as
// real local processes, and what it observed. apps/faultlab.cpp runs both
// and checks the expectations; docs/faultlab.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "faultlab/scenario.hpp"

namespace corolla::app {

/// What one run observed.
struct faultlab_run {
  bool completed = false;
  std::string error;                 ///< why the job failed (when not completed)
  std::vector<std::int32_t> tokens;  ///< swarm: the generated ids
  std::vector<double> losses;        ///< train: loss by step (index step - 1)
  std::vector<double> step_seconds;  ///< train: each step's wall time as the job reported it (index step - 1)
  double max_stall_s = 0;            ///< longest wait between tokens / steps (from the start too)
  double seconds = 0;
  int recoveries = 0;                ///< swarm failovers, or training re-plans
  std::vector<std::string> events;   ///< the faults injected, "token 10: kill server 1 (s1, pid 123)"
  std::vector<std::string> corrupted;      ///< swarm: servers told to corrupt their outputs
  std::vector<std::string> wrong_servers;  ///< swarm: servers the client's spot checks found wrong
  std::uint64_t spot_checks = 0;           ///< swarm: hop steps the client compared with another server
};

/// Runs the scenario's swarm: its servers as `corolla serve` processes of
/// this binary, the client in this process generating greedily; with
/// `inject`, the faults at their moments. Logs go under `logs` (per
/// server). Never throws for a failing job (completed = false).
faultlab_run run_swarm_scenario(const faultlab::scenario& s, bool inject, std::mt19937_64& rng,
                                const std::filesystem::path& logs);

/// Runs the scenario's training job as `corolla train ... --json` (with
/// --elastic when the scenario says so); with `inject`, the faults at their
/// steps or seconds, on the launcher's rank processes.
faultlab_run run_train_scenario(const faultlab::scenario& s, bool inject, std::mt19937_64& rng,
                                const std::filesystem::path& logs);

}  // namespace corolla::app
