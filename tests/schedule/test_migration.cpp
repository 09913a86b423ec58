// schedule/migration: the diff of two plans into moves of parameters and
// optimizer state, byte counts, predicted time, and what cannot be reached.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "schedule/migration.hpp"
#include "tests/schedule/two_sites.hpp"

using namespace corolla;
using namespace corolla::schedule;
using corolla::schedule::testing::two_sites;

namespace {


/// Eight blocks of 100 parameters, embeddings of 50, a head of 30.
model_costs costs8() {
  model_costs c;
  c.blocks.resize(8);
  for (auto& b : c.blocks) b.params = 100;
  c.embedding.params = 50;
  c.head.params = 30;
  return c;
}

training_setup fp32_setup(bool zero1 = true) {
  training_setup s;
  s.weight_bytes = 4;
  s.optimizer_bytes = 8;
  s.zero1 = zero1;
  return s;
}

/// A plan from (first, last, workers) per stage.
plan make_plan(const std::vector<std::tuple<int, int, std::vector<int>>>& stages) {
  plan p;
  p.feasible = true;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    stage_plan s;
    s.index = static_cast<int>(i);
    std::tie(s.first_layer, s.last_layer, s.workers) = stages[i];
    s.embedding = i == 0;
    s.head = i + 1 == stages.size();
    p.stages.push_back(s);
  }
  p.pp = static_cast<int>(stages.size());
  p.dp = static_cast<int>(std::get<2>(stages[0]).size());
  return p;
}

std::string describe(const migration& m) {
  std::string s = m.error;
  for (const auto& l : m.lost) s += "\n lost: " + l;
  for (const auto& mv : m.moves)
    s += "\n " + std::string(mv.kind == state_kind::parameters ? "params " : "optim ") + piece_name(mv.piece) + " [" +
         std::to_string(mv.from_fraction) + "," + std::to_string(mv.to_fraction) + ") " +
         std::to_string(mv.from_rank) + "->" + std::to_string(mv.to_rank) + " " + std::to_string(mv.bytes);
  return s;
}

}  // namespace

TEST_CASE("migration: the same plan moves nothing") {
  const auto c = two_sites();
  const plan p = make_plan({{0, 4, {0, 1}}, {4, 8, {2, 3}}});
  const migration m = plan_migration(p, p, costs8(), fp32_setup(), c, {0, 1, 2, 3});
  INFO(describe(m));
  CHECK(m.reachable());
  CHECK(m.moves.empty());
  CHECK(m.bytes == 0);
  CHECK(m.seconds == 0);
}

TEST_CASE("migration: a moved stage boundary moves exactly the blocks that change owner") {
  const auto c = two_sites();
  const plan from = make_plan({{0, 4, {0}}, {4, 8, {2}}});
  const plan to = make_plan({{0, 3, {0}}, {3, 8, {2}}});
  const migration m = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 2});
  INFO(describe(m));
  REQUIRE(m.reachable());
  REQUIRE(m.moves.size() == 2);
  for (const auto& mv : m.moves) {
    CHECK(mv.piece == 3);
    CHECK(mv.from_rank == 0);
    CHECK(mv.to_rank == 2);
  }
  CHECK(m.moves[0].kind == state_kind::parameters);
  CHECK(m.moves[0].bytes == 400);  // 100 parameters x 4 bytes
  CHECK(m.moves[1].kind == state_kind::optimizer);
  CHECK(m.moves[1].bytes == 800);  // 100 x 8, the whole state (dp = 1)
  CHECK(m.bytes == 1200);
  const link_spec l = c.link_between(0, 2);
  CHECK(m.seconds == doctest::Approx(l.time(400) + l.time(800)));

  // And back again: the same bytes the other way.
  const migration back = plan_migration(to, from, costs8(), fp32_setup(), c, {0, 2});
  CHECK(back.bytes == 1200);
  CHECK(back.moves.at(0).from_rank == 2);
}

TEST_CASE("migration: a dead replica's optimizer slice is lost without a buddy and moved from its buddy with one") {
  const auto c = two_sites();
  const plan from = make_plan({{0, 4, {0, 1}}, {4, 8, {2, 3}}});
  const plan to = make_plan({{0, 4, {0}}, {4, 8, {2, 3}}});  // rank 1 died; rank 0 carries stage 0 alone
  const migration lost = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 2, 3});
  INFO(describe(lost));
  CHECK(lost.error.empty());
  CHECK_FALSE(lost.reachable());
  CHECK(lost.lost.size() == 5);  // the second half of the embeddings' and blocks 0-3's state
  CHECK(lost.lost.front().find("optimizer state [0.5, 1)") == 0);

  const migration saved = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 2, 3}, {{1, 2}});
  INFO(describe(saved));
  REQUIRE(saved.reachable());
  REQUIRE(saved.moves.size() == 5);
  for (const auto& mv : saved.moves) {
    CHECK(mv.kind == state_kind::optimizer);
    CHECK(mv.from_rank == 2);  // the buddy
    CHECK(mv.to_rank == 0);
    CHECK(mv.from_fraction == 0.5);
    CHECK(mv.to_fraction == 1.0);
  }
  CHECK(saved.bytes == doctest::Approx(0.5 * 8 * (50 + 4 * 100)));

  SUBCASE("a buddy on the receiver itself means nothing moves") {
    const migration self = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 2, 3}, {{1, 0}});
    CHECK(self.reachable());
    CHECK(self.moves.empty());
  }
}

TEST_CASE("migration: a stage whose only replica died loses its parameters, buddies do not keep parameters") {
  const auto c = two_sites();
  const plan from = make_plan({{0, 4, {0}}, {4, 8, {2}}});
  const plan to = make_plan({{0, 4, {0}}, {4, 8, {3}}});
  const migration m = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 3}, {{2, 3}});
  INFO(describe(m));
  CHECK(m.error.empty());
  CHECK_FALSE(m.reachable());
  CHECK(m.lost.size() == 5);  // blocks 4-7 and the head
  for (const auto& l : m.lost) CHECK(l.find("parameters of ") == 0);
}

TEST_CASE("migration: a joining rank gets its stage's parameters and its new optimizer slice, the others keep theirs") {
  const auto c = two_sites();
  const plan from = make_plan({{0, 4, {0}}, {4, 8, {2}}});
  const plan to = make_plan({{0, 4, {0, 4}}, {4, 8, {2, 5}}});
  const migration m = plan_migration(from, to, costs8(), fp32_setup(), c, {0, 2, 4, 5});
  INFO(describe(m));
  REQUIRE(m.reachable());
  double to4 = 0, to5 = 0;
  for (const auto& mv : m.moves) {
    CHECK((mv.to_rank == 4 || mv.to_rank == 5));
    if (mv.kind == state_kind::optimizer) {
      CHECK(mv.from_fraction == 0.5);  // replica 1 of 2 takes the second half
      CHECK(mv.to_fraction == 1.0);
    }
    (mv.to_rank == 4 ? to4 : to5) += mv.bytes;
  }
  CHECK(to4 == doctest::Approx(450 * 4 + 0.5 * 450 * 8));  // embeddings + blocks 0-3
  CHECK(to5 == doctest::Approx(430 * 4 + 0.5 * 430 * 8));  // blocks 4-7 + head
  // Both cross the 10 Gbit/s link between the sites; rank 4's share is the larger.
  const link_spec l = c.link_between(0, 4);
  CHECK(m.seconds >= l.time(to4 / 2));
  CHECK(m.seconds < 10 * l.time(to4));
}

TEST_CASE("migration: sources are the fastest live holders") {
  const auto c = two_sites();
  // Stage 0 is replicated on rank 0 (site a) and rank 4 (site b).
  const plan from = make_plan({{0, 4, {0, 4}}, {4, 8, {2, 3}}});
  const plan to = make_plan({{0, 2, {1, 5}}, {2, 8, {2, 3}}});
  const migration m = plan_migration(from, to, costs8(), fp32_setup(false), c, {0, 1, 2, 3, 4, 5});
  INFO(describe(m));
  REQUIRE(m.reachable());
  for (const auto& mv : m.moves) {
    if (mv.to_rank == 1) CHECK(mv.from_rank == 0);  // same node
    if (mv.to_rank == 5) CHECK(mv.from_rank == 4);  // same node
    // Blocks 2-3 go to stage 1's ranks from ranks 0 and 4: rank 0 is nearer
    // to both (rank 2 on its cluster; rank 3 too).
    if (mv.to_rank == 2 || mv.to_rank == 3) CHECK(mv.from_rank == 0);
  }
  // Without ZeRO-1 every replica holds the whole state: a replica that
  // stays needs nothing.
  const migration same = plan_migration(from, make_plan({{0, 4, {0}}, {4, 8, {2, 3}}}), costs8(), fp32_setup(false), c,
                                        {0, 2, 3});
  CHECK(same.reachable());
  CHECK(same.moves.empty());
}

TEST_CASE("migration: plans that cannot be compared, or that use a dead rank, are an error") {
  const auto c = two_sites();
  const plan from = make_plan({{0, 4, {0}}, {4, 8, {2}}});
  CHECK(plan_migration(from, make_plan({{0, 4, {0}}, {4, 8, {2}}}), costs8(), fp32_setup(), c, {0}).error ==
        "the new plan uses rank 2, which is not alive");
  CHECK(plan_migration(from, make_plan({{0, 3, {0}}, {4, 8, {2}}}), costs8(), fp32_setup(), c, {0, 2}).error ==
        "the new plan has a gap or overlap at block 3");
  CHECK(plan_migration(from, make_plan({{0, 4, {0}}, {4, 7, {2}}}), costs8(), fp32_setup(), c, {0, 2}).error ==
        "the new plan covers 7 blocks, the model has 8");
  CHECK(plan_migration(from, from, costs8(), fp32_setup(), c, {0, 9}).error == "rank 9 is not in the cluster");
}

TEST_CASE("migration pays off when the time saved over the steps left exceeds its cost by the margin") {
  CHECK(migration_pays_off(1.0, 0.8, 10.0, 100));        // saves 20 s for 10 s
  CHECK_FALSE(migration_pays_off(1.0, 0.8, 10.0, 55));   // saves 11 s: under 10 s + 20 %
  CHECK_FALSE(migration_pays_off(1.0, 1.1, 0.0, 1000));  // slower
  CHECK_FALSE(migration_pays_off(1.0, 0.5, 1.0, 0));
  CHECK(migration_pays_off(std::numeric_limits<double>::infinity(), 2.0, 100.0, 1));  // cannot stay
}
