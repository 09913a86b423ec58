// model/initialisation.hpp — the GPT-2 initialisation of a model's
// parameters from a seed (what transformer::init gives): one generator
// drawn in one fixed order, the head first, then each block in turn, so a
// seed names exactly one model. A caller that holds only part of the model
// (a training rank's stage) keeps only its groups: the others are drawn
// into nothing, so it gets exactly the values the whole model has while
// never holding more than its part.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "model/config.hpp"
#include "model/params.hpp"

namespace corolla {

class Backend;

/// Which parameter groups to keep.
struct initial_groups {
  bool head = false;
  /// Whether block `i` is kept; empty: none.
  std::function<bool(int block)> block;
  /// Every group: the whole model.
  static initial_groups all();
};

/// The kept groups, each placed on the backend it was drawn for.
struct initial_params {
  std::optional<param_set> head;
  std::map<int, param_set> blocks;  ///< by block index
};

/// Draws the initialisation of `cfg` for `seed` (weights ~ N(0, 0.02),
/// the residual projections N(0, 0.02/sqrt(2L)), norms 1, biases 0) and
/// keeps the groups `keep` names, each drawn on the host and then placed on
/// `be`. Nothing is drawn past the last kept group. With `tiled`, each
/// parameter repeats one block of 65536 draws (transformer::init_tiled: a
/// different model, for speed benchmarks of large shapes).
initial_params draw_initial_params(const model_config& cfg, std::uint64_t seed, const initial_groups& keep,
                                   Backend& be, bool tiled = false);

}  // namespace corolla
