// actors/train_snapshot_reads.hpp: a rank of the next grid reads what its
// own process holds there, and over a link only the rest.
#include <doctest/doctest.h>

#include <algorithm>

#include "actors/train_snapshot_reads.hpp"

using namespace corolla;

namespace {

/// Rank `owner`'s snapshot of step 5 of a 2-replica stage over `buckets`
/// (4 values each; moments [2 * replica, 2 * replica + 2)), with or without
/// parameters.
snapshot_listing listing(int owner, int replica, std::initializer_list<const char*> buckets, bool params) {
  snapshot_listing l;
  l.owner = owner;
  l.step = 5;
  l.job = 42;
  for (const std::string b : buckets) {
    if (params) l.tensors.emplace_back("params." + b, 4);
    l.tensors.emplace_back("m." + b, 2);
    l.tensors.emplace_back("v." + b, 2);
    l.ranges[b] = {2 * replica, 2 * replica + 2, 4};
  }
  return l;
}

using reads = std::map<std::pair<std::string, int>, std::vector<std::string>>;

}  // namespace

TEST_CASE("a rank reads its state from its own process's copies first, and over links only what they lack") {
  // A 2x2 grid over blocks 0..3 lost rank 3; owners 0, 1 (stage 0) and 2
  // (stage 1) hold their own copies, rank 3's moments are at its buddy 2.
  std::map<int, chosen_copy> chosen = {
      {0, {"n0", listing(0, 0, {"block.0", "block.1", "head"}, true)}},
      {1, {"n1", listing(1, 1, {"block.0", "block.1", "head"}, true)}},
      {2, {"n2", listing(2, 0, {"block.2", "block.3", "head"}, true)}},
      {3, {"n2", listing(3, 1, {"block.2", "block.3", "head"}, false)}},
  };
  // The next grid is 1x1: its one rank needs every bucket, all moments.
  const std::vector<shard_want> all = {{"block.0", 0, 4}, {"block.1", 0, 4}, {"block.2", 0, 4}, {"block.3", 0, 4},
                                       {"head", 0, 4}};
  SUBCASE("a new process reads every chosen copy over the links") {
    const reads r = plan_snapshot_reads(chosen, {}, "n9", all);
    CHECK(r.at({"n0", 0}) == std::vector<std::string>{"params.block.0", "m.block.0", "v.block.0", "params.block.1",
                                                      "m.block.1", "v.block.1", "params.head", "m.head", "v.head"});
    CHECK(r.at({"n1", 1}) == std::vector<std::string>{"m.block.0", "v.block.0", "m.block.1", "v.block.1", "m.head", "v.head"});
    CHECK(r.at({"n2", 2}).front() == "params.block.2");
    CHECK(r.at({"n2", 3}) == std::vector<std::string>{"m.block.2", "v.block.2", "m.block.3", "v.block.3", "m.head", "v.head"});
    CHECK(r.size() == 4u);
  }
  SUBCASE("run in rank 2's process (it holds its own copy and rank 3's): only stage 0's state crosses a link") {
    const std::vector<snapshot_listing> local = {chosen.at(2).listing, chosen.at(3).listing};
    const reads r = plan_snapshot_reads(chosen, local, "n2", all);
    CHECK(r.at({"n2", 2}) == std::vector<std::string>{"params.block.2", "params.block.3", "params.head", "m.block.2",
                                                      "v.block.2", "m.block.3", "v.block.3", "m.head", "v.head"});
    CHECK(r.at({"n2", 3}).size() == 6u);
    // The head's parameters came from here: stage 0's copies give only blocks 0, 1.
    CHECK(r.at({"n0", 0}) == std::vector<std::string>{"params.block.0", "m.block.0", "v.block.0", "params.block.1",
                                                      "m.block.1", "v.block.1", "m.head", "v.head"});
    CHECK(r.at({"n1", 1}).size() == 6u);
    CHECK(r.size() == 4u);
  }
  SUBCASE("a rank that needs only its shard reads only the owners whose ranges overlap it") {
    // 1x2: replica 0 wants [0, 2) of every bucket: owners 0 and 2 (replica 0 of their stages).
    std::vector<shard_want> half;
    for (const shard_want& w : all) half.push_back({w.bucket, 0, 2});
    const std::vector<snapshot_listing> local = {chosen.at(0).listing};
    const reads r = plan_snapshot_reads(chosen, local, "n0", half);
    CHECK(r.at({"n0", 0}).size() == 9u);  // all of owner 0 from here
    CHECK(r.count({"n1", 1}) == 0u);
    CHECK(r.count({"n2", 3}) == 0u);
    CHECK(r.at({"n2", 2}) == std::vector<std::string>{"params.block.2", "m.block.2", "v.block.2", "params.block.3",
                                                      "m.block.3", "v.block.3", "m.head", "v.head"});
  }
}
