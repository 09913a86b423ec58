// schedule/regrid: the grid a training job continues on after losing ranks.
#include <doctest/doctest.h>

#include <string>

#include "schedule/regrid.hpp"

using namespace corolla::schedule;

namespace {

grid_limits limits(int ranks, int prefer_pp, int batch = 12, int layers = 4) {
  grid_limits l;
  l.ranks = ranks;
  l.n_layers = layers;
  l.global_batch = batch;
  l.prefer_pp = prefer_pp;
  return l;
}

}  // namespace

TEST_CASE("regrid uses every surviving rank when a grid fits, keeping the stage count when it can") {
  // 2x2 lost one rank: three remain; 1x3 and 3x1 use them all, equally far
  // from two stages; more replicas wins.
  auto g = regrid(limits(3, 2));
  REQUIRE(g);
  CHECK(g->pp == 1);
  CHECK(g->dp == 3);
  // 2x4 lost two: six remain; 2x3 keeps both stages.
  g = regrid(limits(6, 2));
  REQUIRE(g);
  CHECK(g->pp == 2);
  CHECK(g->dp == 3);
  // 4x1 lost one: 3x1 is closest to 4 stages.
  g = regrid(limits(3, 4));
  REQUIRE(g);
  CHECK(g->pp == 3);
  CHECK(g->dp == 1);
}

TEST_CASE("regrid respects the batch split, the block count and interleaving") {
  // A batch of 6 cannot be split over 4 or 5 replicas, and 4 blocks give at
  // most 4 stages: 5 ranks run as 4x1 (4 ranks), not 1x5.
  auto g = regrid(limits(5, 1, 6, 4));
  REQUIRE(g);
  CHECK(g->ranks() == 4);
  // Three ranks, a batch of 4, 2 blocks: 1x3 splits 4 unevenly, 3x1 needs 3
  // blocks; 2x1 and 1x2 use two ranks; 1x2 is closer to one stage.
  g = regrid(limits(3, 1, 4, 2));
  REQUIRE(g);
  CHECK(g->pp == 1);
  CHECK(g->dp == 2);
  // A given micro-batch of 3 must divide each replica's share.
  grid_limits l = limits(4, 2, 12);
  l.micro_batch = 3;
  g = regrid(l);
  REQUIRE(g);
  CHECK((12 / g->dp) % 3 == 0);
  CHECK(g->ranks() == 4);
  // Interleaving (2 chunks) needs pp * 2 blocks and micro-batches % pp == 0.
  l = limits(4, 2, 12, 4);
  l.chunks = 2;
  g = regrid(l);
  REQUIRE(g);
  CHECK(g->pp * 2 <= 4);
  CHECK(((12 / g->dp) % g->pp) == 0);
}

TEST_CASE("regrid says why when nothing fits") {
  std::string why;
  grid_limits l = limits(0, 1);
  CHECK_FALSE(regrid(l, &why));
  CHECK(why.find("at most 0 ranks") != std::string::npos);
  l = limits(2, 1, 6, 2);
  l.micro_batch = 4;  // divides no share of 6 or 3
  why.clear();
  CHECK_FALSE(regrid(l, &why));
  CHECK(why.find("micro-batches of 4") != std::string::npos);
}
