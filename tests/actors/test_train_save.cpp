// The coordinator's side of a distributed --save (actors/train_save.hpp):
// which pieces it asks which rank for, in what order, and groups made
// whole from their pieces.
#include <doctest/doctest.h>

#include <map>
#include <vector>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_save.hpp"
#include "actors/train_store.hpp"
#include "model/lora.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

TEST_CASE("a save asks for the head from rank 0, then every block from replica 0 of its stage, each group's pieces "
          "in order, numbered per rank") {
  testing::tiny_model_options tiny;
  tiny.layers = 4;
  const model_config cfg = testing::tiny_config(tiny);
  const std::int64_t head = param_set::size_of(bucket_layout(cfg, head_bucket));
  const std::int64_t block = param_set::size_of(bucket_layout(cfg, 0));
  const train_layout l = even_layout(4, 2, 2);  // ranks 0, 1: stage 0; 2, 3: stage 1

  const auto whole = plan_param_asks(l, cfg, std::int64_t{256} << 20);
  REQUIRE(whole.size() == 5u);
  CHECK(whole[0].bucket == head_bucket);
  CHECK(whole[0].rank == 0);
  CHECK(whole[0].hi == head);
  CHECK(whole[0].what() == "parameters of head");
  const std::vector<int> rank_of_block{0, 0, 2, 2};
  for (int b = 0; b < 4; ++b) {
    const param_ask& a = whole[static_cast<std::size_t>(b + 1)];
    CHECK(a.bucket == b);
    CHECK(a.rank == rank_of_block[static_cast<std::size_t>(b)]);
    CHECK(a.lo == 0);
    CHECK(a.hi == block);
  }
  CHECK(whole[1].n == 1);  // rank 0's second ask, after the head
  CHECK(whole[3].n == 0);  // rank 2's first

  // Pieces of 4096 bytes: each group's in order, tiling it, and each
  // rank's asks numbered 0, 1, 2, ... in the order they are sent.
  const auto pieces = plan_param_asks(l, cfg, 4096);
  REQUIRE(pieces.size() > whole.size());
  std::map<int, int> next_n;
  std::map<int, std::int64_t> next_lo;
  for (const param_ask& a : pieces) {
    CHECK(a.n == next_n[a.rank]++);
    CHECK(a.lo == next_lo[a.bucket]);
    CHECK(a.hi - a.lo <= 1024);
    CHECK(a.hi > a.lo);
    next_lo[a.bucket] = a.hi;
  }
  CHECK(next_lo[head_bucket] == head);
  for (int b = 0; b < 4; ++b) CHECK(next_lo[b] == block);
  CHECK(pieces[1].what() == "parameters of head (values 1024..2047)");
}

TEST_CASE("a group is made whole from its pieces in order, and a piece of the wrong size or out of order fails the save") {
  testing::tiny_model_options tiny;
  const model_config cfg = testing::tiny_config(tiny);
  const train_layout l = even_layout(tiny.layers, 1, 1);
  const auto asks = plan_param_asks(l, cfg, 4096);
  const std::int64_t block = param_set::size_of(bucket_layout(cfg, 0));
  std::vector<param_ask> of_block0;
  for (const param_ask& a : asks)
    if (a.bucket == 0) of_block0.push_back(a);
  REQUIRE(of_block0.size() >= 2u);
  auto piece = [](const param_ask& a) {
    Tensor t = Tensor::empty({a.hi - a.lo});
    float* p = t.data<float>();
    for (std::int64_t i = a.lo; i < a.hi; ++i) p[i - a.lo] = static_cast<float>(i);
    return std::vector<Tensor>{t};
  };

  param_group_builder groups(cfg);
  for (std::size_t i = 0; i + 1 < of_block0.size(); ++i) CHECK_FALSE(groups.add(of_block0[i], piece(of_block0[i]), "rank 0"));
  auto group = groups.add(of_block0.back(), piece(of_block0.back()), "rank 0");
  REQUIRE(group);
  REQUIRE(group->size() == block);
  std::vector<float> want(static_cast<std::size_t>(block));
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i);
  CHECK(group->flat().to_vector() == want);

  param_group_builder wrong(cfg);
  std::vector<Tensor> short_piece{Tensor::empty({of_block0[0].hi - of_block0[0].lo - 1})};
  CHECK_THROWS_WITH_AS(wrong.add(of_block0[0], short_piece, "rank 0"),
                       doctest::Contains("parameters of block.0 (values 0.."), train_error);
  param_group_builder skipping(cfg);  // the second piece first
  CHECK_THROWS_WITH_AS(skipping.add(of_block0[1], piece(of_block0[1]), "rank 0"), doctest::Contains("out of order"),
                       train_error);
}

TEST_CASE("a LoRA job's save asks for every block's adapter factors from replica 0 of its stage, and no head") {
  testing::tiny_model_options tiny;
  tiny.layers = 4;
  const model_config cfg = testing::tiny_config(tiny);
  lora_config c;
  c.rank = 4;
  c.targets = {"q_proj", "v_proj"};
  const train_layout l = even_layout(4, 2, 2);
  const std::int64_t block = param_set::size_of(bucket_layout(cfg, 0, &c));
  CHECK(block == lora_adapter::zeros(cfg, c).block(0).size());
  CHECK(block < param_set::size_of(bucket_layout(cfg, 0)));
  CHECK_THROWS_AS(bucket_layout(cfg, head_bucket, &c), train_error);

  const auto asks = plan_param_asks(l, cfg, std::int64_t{256} << 20, &c);
  REQUIRE(asks.size() == 4u);
  const std::vector<int> rank_of_block{0, 0, 2, 2};
  for (int b = 0; b < 4; ++b) {
    const param_ask& a = asks[static_cast<std::size_t>(b)];
    CHECK(a.bucket == b);
    CHECK(a.rank == rank_of_block[static_cast<std::size_t>(b)]);
    CHECK(a.hi == block);
  }
  CHECK(asks[0].n == 0);  // rank 0's first ask: no head before it

  // The group made whole is the adapter block's layout.
  param_group_builder groups(cfg, c);
  Tensor values = Tensor::empty({block});
  for (std::int64_t i = 0; i < block; ++i) values.data<float>()[i] = static_cast<float>(i);
  const std::optional<param_set> g = groups.add(asks[1], {values}, "rank 0");
  REQUIRE(g);
  CHECK(g->has("self_attn.q_proj.lora_A"));
  CHECK(g->has("self_attn.v_proj.lora_B"));
  CHECK_FALSE(g->has("q.weight"));
}
