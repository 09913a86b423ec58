// model/initialisation.cpp — the GPT-2 initialisation, drawn group by
// group (model/initialisation.hpp).
#include "model/initialisation.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/block.hpp"
#include "model/head.hpp"

namespace corolla {

namespace {

constexpr std::int64_t tile = 65536;

/// Draws one group's values in layout order into `set`, or, without a set,
/// draws as many and drops them (the generator ends where it would).
class drawer {
 public:
  drawer(const model_config& cfg, std::uint64_t seed, bool tiled)
      : rng_(seed), residual_std_(0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layers))), tiled_(tiled) {}

  void fill(const std::vector<std::pair<std::string, shape_t>>& layout, param_set* set) {
    for (const auto& [name, shape] : layout) {
      const std::int64_t numel = shape_numel(shape);
      float* p = set ? set->get(name).data<float>() : nullptr;
      const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      const bool is_norm = name.find("norm") != std::string::npos;
      if (is_bias || is_norm) {
        if (p) std::fill(p, p + numel, is_bias ? 0.0f : 1.0f);
        continue;
      }
      // The projections that write into the residual stream get the GPT-2
      // scaled init so the stream's variance does not grow with depth. A
      // distribution of its own per tensor, as the whole model always had.
      const bool residual = name == "o.weight" || name.ends_with("down.weight");  // experts' too
      std::normal_distribution<float> normal(0.0f, residual ? residual_std_ : 0.02f);
      if (!tiled_ || numel <= tile) {
        if (p) {
          for (std::int64_t i = 0; i < numel; ++i) p[i] = normal(rng_);
        } else {
          for (std::int64_t i = 0; i < numel; ++i) (void)normal(rng_);
        }
        continue;
      }
      drawn_.resize(static_cast<std::size_t>(tile));
      for (auto& v : drawn_) v = normal(rng_);
      if (p)
        for (std::int64_t i = 0; i < numel; i += tile) std::copy_n(drawn_.data(), std::min(tile, numel - i), p + i);
    }
  }

 private:
  std::mt19937_64 rng_;
  float residual_std_;
  bool tiled_;
  std::vector<float> drawn_;
};

}  // namespace

initial_groups initial_groups::all() {
  initial_groups g;
  g.head = true;
  g.block = [](int) { return true; };
  return g;
}

initial_params draw_initial_params(const model_config& cfg, std::uint64_t seed, const initial_groups& keep,
                                   Backend& be, bool tiled) {
  cfg.validate();
  int last_kept = -1;
  for (int i = 0; i < cfg.n_layers; ++i)
    if (keep.block && keep.block(i)) last_kept = i;
  initial_params out;
  if (!keep.head && last_kept < 0) return out;
  drawer d(cfg, seed, tiled);
  const auto head_shapes = head_layout(cfg);
  if (keep.head) {
    param_set h(head_shapes);
    d.fill(head_shapes, &h);
    place_params(h, be);
    out.head.emplace(std::move(h));
  } else {
    d.fill(head_shapes, nullptr);
  }
  const auto block_shapes = block_layout(cfg);
  for (int i = 0; i <= last_kept; ++i) {
    if (!keep.block(i)) {
      d.fill(block_shapes, nullptr);
      continue;
    }
    param_set p(block_shapes);
    d.fill(block_shapes, &p);
    place_params(p, be);
    out.blocks.emplace(i, std::move(p));
  }
  return out;
}

}  // namespace corolla
