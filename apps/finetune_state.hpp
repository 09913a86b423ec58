// apps/finetune_state.hpp — `corolla finetune`'s checkpoint of the client:
// DIR/finetune_state.safetensors holds what trains and its optimiser
// (prompt_tuner::save_state), the data position, and a key naming the run
// (the frozen model's fingerprint, what trains and how, the batches' shape,
// the data's fingerprint), so that `--resume` goes on only from this run's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "model/lora.hpp"
#include "model/prompt_tuning.hpp"
#include "model/token_data.hpp"

namespace corolla::app {

/// What a checkpoint must have been written by for a run to go on from it.
struct finetune_run {
  std::string model;  ///< the model directory (its weight files' fingerprint)
  std::string tuning;
  int prompt_len = 0;
  const lora_adapter* adapter = nullptr;
  int batch = 0, seq = 0;
  float lr = 0.0f;
};

class finetune_checkpoint {
 public:
  /// The state file in `dir`, keyed by `run` and `data`. Throws
  /// std::invalid_argument for `dir` inside the model directory (its files
  /// would change the model's fingerprint).
  finetune_checkpoint(const std::filesystem::path& dir, const finetune_run& run, const token_dataset& data);

  const std::filesystem::path& file() const { return file_; }
  /// Restores the state into `tuner` and `data` when it is this run's and
  /// before `steps`; returns the step it was written after. Throws
  /// model_error naming what differs, nothing changed then.
  std::int64_t resume(prompt_tuner& tuner, token_dataset& data, int steps) const;
  /// Writes `tuner`'s state after its last step, the next batch at
  /// `position`, through a temporary file and a rename; a state that is not
  /// finite is not written (false: the file keeps what it held).
  bool write(const prompt_tuner& tuner, std::int64_t position);
  /// The step the last write() of this run wrote (-1: none).
  std::int64_t written_step() const { return written_; }

 private:
  std::filesystem::path file_;
  std::map<std::string, std::string> key_;
  std::int64_t written_ = -1;
};

}  // namespace corolla::app
