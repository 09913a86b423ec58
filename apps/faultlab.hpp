// apps/faultlab.hpp — `corolla faultlab`'s runners: one run of a scenario's
// job (the failure-free reference, or the run with the faults injected) as
// real local processes, and what it observed. apps/faultlab.cpp runs both
// and checks the expectations; docs/faultlab.md.
#pragma once

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "faultlab/scenario.hpp"
#include "model/config.hpp"

namespace corolla::app {

/// One injected fault and when its effects were seen.
struct fault_timeline {
  std::string at, what, target;  ///< as the scenario says ("token 10", "kill", "route.hop 1")
  std::string hit;               ///< whom it hit ("s1", "j0"; "" when skipped or not known)
  std::string outcome;           ///< the harness's line ("kill route.hop 1 (s1)")
  bool landed = false;           ///< it fired and found its target (not skipped, not refused)
  double injected_at_s = -1;     ///< seconds after the run's start; -1 = never fired
  double detected_at_s = -1;     ///< the job noticed (a failover, a spot check, a re-plan); -1 = never
  double recovered_at_s = -1;    ///< the first token / step after that; -1 = never
  std::string detected_by;       ///< who noticed, and the line that says so
};

/// What firing a fault did: the harness's line, and whether it found its
/// target (false: skipped, its target gone or never there, or refused).
struct fault_outcome {
  std::string line;
  bool landed = false;
};
inline fault_outcome landed(std::string line) { return {std::move(line), true}; }
inline fault_outcome missed(std::string line) { return {std::move(line), false}; }

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
  std::vector<fault_timeline> faults;      ///< every fault of the scenario, in its order (faulted run)
  std::vector<double> progress_s;          ///< when each token / step arrived, seconds after the start

  /// A token or step arrived at `t`: recoveries of faults detected by then.
  void progressed(double t) {
    progress_s.push_back(t);
    for (auto& f : faults)
      if (f.detected_at_s >= 0 && f.recovered_at_s < 0 && f.detected_at_s <= t) f.recovered_at_s = t;
  }
  /// `who` reported `line` at `t`: the faults still undetected that it
  /// names (by the id they hit as a whole word; any, when `any`) are
  /// detected now.
  /// `also` counts as named too (a relay, when the line names a server
  /// reached through it).
  void noticed(const std::string& who, const std::string& line, double t, bool any = false,
               const std::string& also = "") {
    const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
    for (auto& f : faults) {
      if (f.injected_at_s < 0 || f.detected_at_s >= 0) continue;
      bool named = any || (!also.empty() && f.hit == also);
      for (std::size_t p = f.hit.empty() ? std::string::npos : line.find(f.hit); !named && p != std::string::npos;
           p = line.find(f.hit, p + 1)) {
        const std::size_t e = p + f.hit.size();
        named = (p == 0 || !word(line[p - 1])) && (e == line.size() || !word(line[e]));
      }
      if (!named) continue;
      f.detected_at_s = t;
      f.detected_by = who + ": " + line;
    }
  }
};

/// Replaces built-in names in `s` (`model = "builtin:llama"` or
/// "builtin:gpt2", `data = "builtin:tokens"`) with files written under
/// `dir`: a seeded random model as real HuggingFace files (4 blocks, width
/// 64), raw uint16 tokens. Throws std::invalid_argument for an unknown name.
void materialize_builtins(faultlab::scenario& s, const std::filesystem::path& dir);

/// The config of `model`: a built-in name's ("builtin:gpt2"), or read from
/// the directory's config.json.
model_config model_config_of(const std::string& model);

/// Writes `timeline.svg` into `dir`: tokens (or steps) over time for the
/// reference and the faulted run, each fault marked where it was injected
/// and where it was recovered from.
void write_timeline_svg(const std::filesystem::path& dir, const std::string& title, const std::string& unit,
                        const faultlab_run& reference, const faultlab_run& faulted);

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
