// apps/bench_elastic.hpp — what the modes of `corolla bench elastic`
// (apps/bench_elastic.cpp; the launcher's death: bench_elastic_launcher.cpp)
// share: the options, the bench's model and job, and the figures of a
// faultlab run.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "apps/faultlab.hpp"
#include "faultlab/scenario.hpp"
#include "model/config.hpp"

namespace corolla::app {

struct elastic_bench_options {
  int steps = 60;
  int throttle_step = 4;
  int probe_every = 2;
  std::string profile = "bw=1Mbit,lat=200us";
  bool json = false;
  bool kill = false;          ///< --kill: the failure half
  int kill_step = 45;         ///< step after which rank 3 is killed
  int checkpoint_every = 50;  ///< both kill runs' checkpoints
  bool hang = false;          ///< --hang: a stage stuck with its node up
  bool lose = false;          ///< --lose: a message lost, every rank up
  bool stop = false;          ///< --stop: a rank's process stopped (SIGSTOP)
  double hang_s = 2;          ///< --hang's watchdog run: its --hang-s
  double baseline_timeout_s = 10;  ///< --hang's baseline run: its --timeout-s
  bool join = false;          ///< --join: a machine joining a --cluster job
  int join_step = 4;          ///< step after which it joins
  int join_check_every = 2;   ///< the growing run's --join-check-every
  bool drain = false;         ///< --drain: the join's drain through memory vs through a checkpoint
  bool launcher = false;      ///< --launcher: the launcher killed, a rank process takes over vs a restart by hand
};


namespace elastic_bench {

/// Width 32: small enough that two cores keep up with three ranks and the
/// links set the pace.
model_config bench_model();
double median(std::vector<double> v);
/// The model (bench_model() unless given) and token file of a run under `scratch`.
void write_bench_job(const std::filesystem::path& scratch, const model_config& model = bench_model());
/// The largest relative difference of two runs' losses.
double loss_diff(const faultlab_run& a, const faultlab_run& b);
/// Time lost to the fault of a run: from its injection to the first new
/// step after it, less the median step before it.
double time_lost(const faultlab_run& r, int fault_step);
/// The 2x2 job of the bench model (links of 4 ms, `o.steps` steps, `flags`
/// added, checkpoints every `checkpoint_every`) with fault `what` on rank 3
/// after --kill-step (a lose drops an activation).
faultlab::scenario rank3_fault(const std::filesystem::path& scratch, const elastic_bench_options& o,
                               const std::string& name, const std::string& flags, int checkpoint_every,
                               faultlab::action what);
/// A run of a fault bench must complete and recover from its fault.
void require_recovered(const faultlab_run& r, const std::string& fault);

}  // namespace elastic_bench

/// --launcher (apps/bench_elastic_launcher.cpp).
int run_bench_elastic_launcher(const elastic_bench_options& o);

}  // namespace corolla::app
