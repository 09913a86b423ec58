// Where a training rank gets a fresh initialisation (actors/rank_weights.cpp,
// weights_from_seed): each rank holds exactly its own groups, with the
// values of the whole model drawn from the same seed, and nothing else;
// each group is handed over once.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "kernels/backend.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

bool same_bits(const param_set& a, const param_set& b) {
  return a.size() == b.size() &&
         std::memcmp(a.flat().data<float>(), b.flat().data<float>(), static_cast<std::size_t>(a.size()) * 4) == 0;
}

}  // namespace

TEST_CASE("rank weights: a fresh start keeps only the rank's blocks and head, with the whole model's values") {
  testing::tiny_model_options mo;
  mo.layers = 8;
  const model_config cfg = testing::tiny_config(mo);
  transformer whole = transformer::init(cfg, 7, cpu_backend());
  // Plain 1F1B 2x2, interleaved 2x1 in two chunks (stage 0 holds blocks
  // 0..1 and 4..5), and a 4-stage pipeline whose middle ranks hold no head.
  for (const train_layout& l : {even_layout(8, 2, 2), even_layout(8, 2, 1, 2), even_layout(8, 4, 1)}) {
    CAPTURE(l.describe());
    for (int rank = 0; rank < l.world(); ++rank) {
      CAPTURE(rank);
      const rank_weights w = weights_from_seed(cfg, 7, cpu_backend(), l, rank);
      const int stage = l.stage_of(rank);
      std::set<int> own;
      for (int c = 0; c < l.chunks; ++c) {
        const auto v = static_cast<std::size_t>(l.virtual_stage(stage, c));
        const int first = l.boundaries[v], last = l.boundaries[v + 1];
        const auto blocks = w.blocks(first, last);
        REQUIRE(static_cast<int>(blocks.size()) == last - first);
        for (int i = first; i < last; ++i) {
          CHECK(same_bits(blocks[static_cast<std::size_t>(i - first)], whole.blocks()[static_cast<std::size_t>(i)]));
          own.insert(i);
        }
        // Handed over, not shared: a second ask is refused.
        CHECK_THROWS_AS(w.blocks(first, first + 1), train_error);
      }
      for (int i = 0; i < cfg.n_layers; ++i)
        if (!own.count(i)) CHECK_THROWS_AS(w.blocks(i, i + 1), train_error);
      if (stage == 0 || stage == l.pp - 1) {
        CHECK(same_bits(w.head(), whole.head()));
        CHECK_THROWS_AS(w.head(), train_error);
      } else {
        CHECK_THROWS_AS(w.head(), train_error);
      }
    }
  }
}

TEST_CASE("rank weights: a rank that restores gets zeroed parameters of its groups' shapes, drawn from nothing") {
  testing::tiny_model_options mo;
  mo.layers = 4;
  const model_config cfg = testing::tiny_config(mo);
  transformer whole = transformer::init(cfg, 7, cpu_backend());
  const rank_weights w = weights_to_restore(cfg, cpu_backend());
  auto zero_like = [](const param_set& got, const param_set& want) {
    REQUIRE(got.size() == want.size());
    REQUIRE(got.entries().size() == want.entries().size());
    for (std::size_t i = 0; i < got.entries().size(); ++i) {
      CHECK(got.entries()[i].name == want.entries()[i].name);
      CHECK(got.entries()[i].shape == want.entries()[i].shape);
    }
    const float* v = got.flat().data<float>();
    for (std::int64_t i = 0; i < got.size(); ++i)
      if (v[i] != 0.0f) FAIL("a restored rank's parameter is not zero at " << i);
  };
  const auto blocks = w.blocks(1, 3);
  REQUIRE(blocks.size() == 2);
  zero_like(blocks[0], whole.blocks()[1]);
  zero_like(blocks[1], whole.blocks()[2]);
  zero_like(w.head(), whole.head());
}
