// apps/lora_flags.hpp — the flags that describe a LoRA adapter to train,
// shared by `corolla train` and `corolla finetune`: --lora-rank,
// --lora-alpha, --lora-targets, --lora-rslora and --adapter.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/lora.hpp"

namespace corolla::app {

struct lora_flags {
  int rank = 0;                      ///< r; 0 = no new adapter
  float alpha = 0.0f;                ///< 0 = the rank (s = 1)
  std::vector<std::string> targets;  ///< empty: the family's default
  bool rslora = false;
  std::string adapter;               ///< a PEFT directory to train on from (its r, alpha, targets)

  /// Whether an adapter trains: a new one or a saved one.
  bool given() const { return rank != 0 || !adapter.empty(); }
  /// The new adapter --lora-rank, --lora-alpha (default: the rank),
  /// --lora-targets and --lora-rslora describe.
  lora_config config() const;
  /// The first flags that do not go together, as the error to show ("" =
  /// none): the shape flags without --lora-rank, --lora-rank beside
  /// --adapter, the shape flags beside --adapter.
  std::string problem() const;
};

/// Registers the five flags on `cmd`; `rank_help` says what a new adapter
/// is for in this command.
void add_lora_flags(CLI::App* cmd, lora_flags& f, const std::string& rank_help);

}  // namespace corolla::app
