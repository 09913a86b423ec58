// What the swarm fine-tuning tests share (tests/actors/mp_swarm_finetune.cpp,
// mp_swarm_finetune_lora.cpp): seeded batches, and a runner that lets a test
// break a server between a step's forward and its backward.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "actors/swarm_finetune.hpp"
#include "model/prompt_tuning.hpp"

namespace corolla::swarm_test {

/// `steps` seeded [B, T] batches of ids and their next-token targets.
struct tuning_batches {
  std::vector<std::vector<std::int32_t>> ids, targets;
  tuning_batches(int vocab, int steps, int batch, int seq, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int s = 0; s < steps; ++s) {
      std::vector<std::int32_t> row(static_cast<std::size_t>(batch * seq + 1));
      for (auto& id : row) id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
      ids.emplace_back(row.begin(), row.end() - 1);
      targets.emplace_back(row.begin() + 1, row.end());
    }
  }
};

/// A swarm runner that calls `after_forward` after each forward (to kill or
/// corrupt a server between a step's forward and its backward).
struct hooked_runner final : span_runner {
  swarm_span_runner& inner;
  std::function<void()> after_forward;
  hooked_runner(swarm_span_runner& r, std::function<void()> f) : inner(r), after_forward(std::move(f)) {}
  Tensor forward(const Tensor& h, int b, int t, const Tensor& p, lora_adapter* a) override {
    Tensor out = inner.forward(h, b, t, p, a);
    after_forward();
    return out;
  }
  span_gradients backward(const Tensor& g) override { return inner.backward(g); }
};

}  // namespace corolla::swarm_test
