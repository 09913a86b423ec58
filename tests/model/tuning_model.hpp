// A tiny model on disk with what a fine-tuning client holds of it (the head)
// and local blocks behind a runner: the fixture of the tuner's tests
// (tests/model/test_prompt_tuning.cpp, test_carried_lora.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/config.hpp"
#include "model/head.hpp"
#include "model/prompt_tuning.hpp"
#include "model/span_engine.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla::testing {

/// A tiny model (3 blocks of width 16) on disk, its head, and a span engine
/// over all its blocks behind a local_span_runner.
struct tuning_model {
  temp_dir_guard dir;
  model_config cfg;
  std::unique_ptr<head> h;
  std::unique_ptr<span_engine> blocks;
  std::unique_ptr<local_span_runner> runner;

  explicit tuning_model(architecture arch) : dir("tuning-model") {
    tiny_model_options o;
    o.arch = arch;
    o.layers = 3;
    o.hidden = 16;
    o.intermediate = 24;
    o.vocab = 32;
    o.max_positions = 32;
    write_tiny_model(dir.path(), o);
    cfg = load_config(dir.path());
    const checkpoint ck = checkpoint::open(dir.path());
    h = std::make_unique<head>(head::load(ck, cfg, cpu_backend()));
    blocks = std::make_unique<span_engine>(span_engine::load(ck, cfg, 0, cfg.n_layers, cpu_backend(), 64));
    runner = std::make_unique<local_span_runner>(*blocks);
  }
};

/// `n` token ids below `vocab`, drawn from `seed`.
inline std::vector<std::int32_t> tuning_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

}  // namespace corolla::testing
