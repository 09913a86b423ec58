// model/model_writer.hpp — a HuggingFace model directory (model.safetensors
// and config.json, as transformer::save writes it) written group by group:
// the head and each block in any order, each when it comes, so whoever
// gathers a model from elsewhere (the training coordinator, from the
// ranks that hold it) holds one group at a time, not the whole model.
#pragma once

#include <filesystem>
#include <memory>

#include "model/config.hpp"
#include "model/params.hpp"
#include "model/safetensors_writer.hpp"

namespace corolla {

class model_writer {
 public:
  /// Creates `dir` and model.safetensors's temporary file with the header
  /// of every tensor of `cfg` (HF names and layouts: model/hf_names.hpp).
  /// Throws model_error when the directory or file cannot be written.
  model_writer(const std::filesystem::path& dir, const model_config& cfg);

  /// Writes the head's tensors (`head`: laid out by head_layout, on any
  /// device). Throws tensor_error when written already or shaped otherwise.
  void write_head(const param_set& head);
  /// Writes block `layer`'s (laid out by block_layout). As write_head.
  void write_block(int layer, const param_set& block);
  /// Every group written: model.safetensors takes its name (synced), then
  /// config.json is written. Throws model_error naming a tensor not given.
  void commit();

 private:
  std::filesystem::path dir_;
  model_config cfg_;
  std::unique_ptr<safetensors_writer> file_;
};

}  // namespace corolla
