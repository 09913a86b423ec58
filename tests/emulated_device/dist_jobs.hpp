// tests/emulated_device/dist_jobs.hpp — a whole pipeline x data-parallel
// training job in one test process: a coordinator and one node per rank on
// loopback, each rank on its own thread, on the cpu or on emulated devices.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/node.hpp"
#include "actors/train_job.hpp"
#include "model/config.hpp"
#include "tests/emulated_device/emulated_device.hpp"

namespace corolla::testing {

/// What a job run in-process gives back.
struct job_result {
  std::vector<dist_step_report> steps;
  std::vector<std::unique_ptr<emulated_device_backend>> devices;  ///< one per rank (empty for cpu ranks)
};

/// A node on 127.0.0.1 with one scheduler thread.
std::unique_ptr<node> start_local_node();

/// Runs job `o` with a coordinator and one node per rank on loopback, each
/// rank on a thread of this process with its own freshly initialised copy
/// of the model (seed 7) and its own reader of `tokens`; ranks compute on
/// emulated devices cuda:<rank> when `on_devices`, else on the cpu.
/// Rethrows the first rank's error, else the coordinator's.
job_result run_job(const dist_train_options& o, const model_config& cfg, const std::vector<std::int32_t>& tokens,
                   bool on_devices);

/// `b`'s steps are `a`'s: the same step numbers, losses and gradient norms,
/// bit for bit.
void check_same_steps(const job_result& a, const job_result& b);
/// `b`'s losses and gradient norms are within `rel` (relative) of `a`'s.
void check_close_steps(const job_result& a, const job_result& b, double rel);

/// Runs `o` on emulated devices straight through (saving into
/// dir/straight), then to half its steps with a checkpoint there
/// (dir/ckpt), and resumes that to the end with `resumed_with` applied to
/// the options (saving into dir/resumed); checks the resumed run ends with
/// the straight run's loss and model bytes.
void check_resume_matches(dist_train_options o, const model_config& cfg, const std::vector<std::int32_t>& tokens,
                          const std::filesystem::path& dir,
                          const std::function<void(dist_train_options&)>& resumed_with = {});

/// An even pp x dp layout of `cfg`: batch 4, seq 16, AdamW lr 3e-3 with
/// weight decay 0.1, a 60 s message timeout.
dist_train_options job(const model_config& cfg, int pp, int dp, int steps);

}  // namespace corolla::testing
