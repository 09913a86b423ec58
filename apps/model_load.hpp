// apps/model_load.hpp — loading a model for local decoding (`generate`,
// `api --local`): with f32 weights its parameters, with bf16, int8 or nf4
// only those weights (transformer::load_inference, block by block), under
// a progress bar on a terminal either way; optionally with a LoRA adapter
// merged into the weights as they load.
#pragma once

#include <string>

#include "kernels/backend.hpp"
#include "kernels/weight_format.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

/// The model in `dir` on `be`, holding the weights decode reads in format
/// `f`: transformer::load for f32, transformer::load_inference otherwise
/// (no f32 block parameters kept). `who` names the command in the bar's
/// label ("generate"). With `adapter` (a PEFT LoRA directory, model/lora.hpp)
/// each block's weights are merged with it as they load, before any
/// conversion to `f`. The bar is drawn on a terminal unless `progress` is
/// false (--json). Throws as those, and model_error for an adapter that
/// does not fit the model.
transformer load_for_decoding(const std::string& dir, Backend& be, weight_format f, const std::string& who,
                              const std::string& adapter = "", bool progress = true);

}  // namespace corolla::app
