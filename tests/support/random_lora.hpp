// tests/support/random_lora.hpp — LoRA adapters whose B is drawn at random
// (a fresh adapter's B is zero: it would change nothing a test could see).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "tests/support/numeric_checks.hpp"

namespace corolla::testing {

/// Every B of `a` drawn N(0, scale), block by block from `seed`.
inline void randomise_b(lora_adapter& a, std::uint64_t seed, float scale = 0.2f) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (const lora_module& m : a.modules()) {
      Tensor B = a.block(l).get(m.path + ".lora_B");
      B.copy_from(random_tensor(B.shape(), seed++, scale));
    }
}

/// An adapter of `cfg` (rank, alpha, targets; on the host) with A as PEFT
/// draws it from `seed` and B drawn N(0, scale).
inline lora_adapter random_lora(const model_config& cfg, std::uint64_t seed, float scale = 0.2f, int rank = 4,
                                float alpha = 8.0f, std::vector<std::string> targets = {"all-linear"}) {
  lora_config c;
  c.rank = rank;
  c.alpha = alpha;
  c.targets = std::move(targets);
  lora_adapter a = lora_adapter::init(cfg, c, seed, cpu_backend());
  randomise_b(a, seed + 1000, scale);
  return a;
}

}  // namespace corolla::testing
