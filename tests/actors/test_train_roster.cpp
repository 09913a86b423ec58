// A rank's rings and neighbours (actors/train_roster.hpp): who reduces with
// whom, and which links a rank opens.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "actors/train_roster.hpp"

using namespace corolla;

TEST_CASE("a rank's data-parallel ring is its stage's replicas and the head ring joins the first and last stages") {
  const train_layout l = even_layout(6, 3, 2);  // ranks: stage 0 = {0,1}, stage 1 = {2,3}, stage 2 = {4,5}
  const rank_rings r3 = rings_of(l, 3);
  CHECK(r3.dp.ranks == std::vector<int>{2, 3});
  CHECK(r3.dp.position == 1);
  CHECK(r3.head.size() == 0);  // a middle stage holds no head
  const rank_rings r5 = rings_of(l, 5);
  CHECK(r5.dp.ranks == std::vector<int>{4, 5});
  CHECK(r5.head.ranks == std::vector<int>{0, 1, 4, 5});
  CHECK(r5.head.position == 3);
  CHECK(r5.head.next() == 0);
  CHECK(r5.head.prev() == 4);
  // Every member of a ring sees the same ring, at its own position.
  for (int rank : {0, 1, 4, 5}) {
    const rank_rings r = rings_of(l, rank);
    CHECK(r.head.ranks == r5.head.ranks);
    CHECK(r.head.ranks[static_cast<std::size_t>(r.head.position)] == rank);
  }
}

TEST_CASE("without a pipeline the head ring is the data-parallel ring") {
  const train_layout l = even_layout(4, 1, 3);
  for (int rank = 0; rank < 3; ++rank) {
    const rank_rings r = rings_of(l, rank);
    CHECK(r.head.ranks == r.dp.ranks);
    CHECK(r.head.position == r.dp.position);
  }
}

TEST_CASE("a rank links to its pipeline neighbours of the same replica and its ring neighbours only") {
  const train_layout l = even_layout(8, 4, 2);  // stages of ranks {0,1} {2,3} {4,5} {6,7}
  CHECK(neighbours_of(l, 2, rings_of(l, 2)) == std::set<int>{0, 3, 4});
  CHECK(neighbours_of(l, 0, rings_of(l, 0)) == std::set<int>{1, 2, 7});  // head ring 0 -> 1 -> 6 -> 7 -> 0
  CHECK(neighbours_of(l, 7, rings_of(l, 7)) == std::set<int>{0, 5, 6});
  // One rank alone has no one to talk to.
  const train_layout single = even_layout(2, 1, 1);
  CHECK(neighbours_of(single, 0, rings_of(single, 0)).empty());
  // Links are symmetric: if a talks to b, b talks to a (the lower one connects).
  for (int a = 0; a < l.world(); ++a)
    for (int b : neighbours_of(l, a, rings_of(l, a))) CHECK(neighbours_of(l, b, rings_of(l, b)).count(a) == 1);
}
