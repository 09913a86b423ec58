// schedule/process_match.hpp: the next grid's ranks run in the held
// processes that hold most of what they need.
#include <doctest/doctest.h>

#include "schedule/process_match.hpp"

using namespace corolla::schedule;

namespace {

std::set<std::string> blocks(std::initializer_list<int> ids, bool head = false) {
  std::set<std::string> s;
  for (int i : ids) s.insert("block." + std::to_string(i));
  if (head) s.insert("head");
  return s;
}

}  // namespace

TEST_CASE("each new rank runs in the process holding most of its buckets, whatever the order they come in") {
  // A 3x1 grid over blocks 0..5 (stage 0 and 2 hold the head) left by a
  // 2x2 one: processes 0, 1 hold blocks 0..2 and the head, 2 holds 3..5
  // and the head.
  const std::vector<std::set<std::string>> holds = {blocks({0, 1, 2}, true), blocks({0, 1, 2}, true),
                                                    blocks({3, 4, 5}, true)};
  const std::vector<std::set<std::string>> needs = {blocks({4, 5}, true), blocks({2, 3}), blocks({0, 1}, true)};
  const std::vector<int> m = match_processes(needs, holds);
  REQUIRE(m.size() == 3u);
  CHECK(m[0] == 2);  // 3 of 3 shared
  CHECK(m[2] == 0);  // 3 of 3, the lower process of two equal ones
  CHECK(m[1] == 1);  // what is left: 1 shared
  CHECK(shared_bytes(needs[1], holds[1]) == 1);
}

TEST_CASE("with the buckets' sizes, the process holding the most bytes a rank needs wins, not the most buckets") {
  // The head (embeddings and LM head) outweighs blocks: a 50k-token
  // vocabulary of width 768 against 7M-value blocks.
  const bucket_bytes bytes = {{"head", 4.0 * 38.6e6}, {"block.0", 4.0 * 7.1e6}, {"block.1", 4.0 * 7.1e6},
                              {"block.2", 4.0 * 7.1e6}, {"block.3", 4.0 * 7.1e6}};
  // Process 0 holds two blocks, process 1 one block and the head.
  const std::vector<std::set<std::string>> holds = {blocks({0, 1}), blocks({2}, true)};
  // Rank 0 needs blocks 0..2 and the head; rank 1 blocks 3.
  const std::vector<std::set<std::string>> needs = {blocks({0, 1, 2}, true), blocks({3})};
  CHECK(match_processes(needs, holds) == std::vector<int>{0, 1});           // by count: 2 buckets beat 2 (lower first)
  CHECK(match_processes(needs, holds, bytes) == std::vector<int>{1, 0});    // by bytes: the head's process
  CHECK(shared_bytes(needs[0], holds[1], bytes) == doctest::Approx(4.0 * (38.6e6 + 7.1e6)));
  CHECK(shared_bytes(needs[0], holds[0], bytes) == doctest::Approx(4.0 * 2 * 7.1e6));
  // A bucket without a size counts 1 byte.
  CHECK(shared_bytes(blocks({9}), blocks({9}), bytes) == 1);
}

TEST_CASE("more ranks than processes start new ones, more processes than ranks leave some unused") {
  const std::vector<std::set<std::string>> one = {blocks({0, 1}, true)};
  const std::vector<int> grown = match_processes({blocks({2, 3}), blocks({0, 1}, true)}, one);
  CHECK(grown == std::vector<int>{-1, 0});
  const std::vector<int> shrunk =
      match_processes({blocks({0, 1, 2, 3}, true)}, {blocks({0, 1}, true), blocks({2, 3}, true), blocks({0, 1, 2, 3})});
  CHECK(shrunk == std::vector<int>{2});  // blocks 0..3: the most shared
  // Nothing shared: matched anyway, in order.
  CHECK(match_processes({blocks({7}), blocks({8})}, {blocks({1}), blocks({2})}) == std::vector<int>{0, 1});
  CHECK(match_processes({}, one).empty());
  CHECK(match_processes({blocks({1})}, {}) == std::vector<int>{-1});
}
