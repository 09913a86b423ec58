// Which kept cache goes first (schedule/cache_retention.hpp): the domain
// holding the most of what ran out (kept caches, or kept tokens) gives up
// its least recently finished cache, never the most recently finished
// while another is kept; one domain is least-recently-finished.
#include <doctest/doctest.h>

#include <list>
#include <map>
#include <string>
#include <vector>

#include "schedule/cache_retention.hpp"

using namespace corolla::schedule;

namespace {

/// `n` token ids.
std::vector<std::int32_t> ids(int n) { return std::vector<std::int32_t>(static_cast<std::size_t>(n), 7); }

/// Each session's domain, as the batcher and the prefix board look it up.
session_domain from(const std::map<std::string, std::string>& domains) { return domain_in(domains); }

constexpr auto by_count = retention_limit::count;
constexpr auto by_room = retention_limit::room;

}  // namespace

TEST_CASE("cache retention: one domain lets its least recently finished cache go") {
  const std::list<std::string> kept = {"new", "mid", "old"};  // most recent first
  const session_ids cached = {{"new", ids(5)}, {"mid", ids(50)}, {"old", ids(1)}};
  const std::map<std::string, std::string> domains = {{"new", "a"}, {"mid", "a"}, {"old", "a"}};
  CHECK(next_to_let_go(kept, cached, from(domains), by_count) == "old");
  CHECK(next_to_let_go(kept, cached, from(domains), by_room) == "old");
  // Without domains each session is alone: the one holding the most
  // tokens goes (by count every domain holds one: the tokens break the tie).
  CHECK(next_to_let_go(kept, cached, {}, by_room) == "mid");
  CHECK(next_to_let_go(kept, cached, {}, by_count) == "mid");
  CHECK(next_to_let_go({"only"}, cached, {}, by_count) == "only");
  CHECK_THROWS(next_to_let_go({}, cached, {}, by_count));
}

TEST_CASE("cache retention: the domain holding the most gives one up, whatever its caches' age") {
  // Mallory's burst came last, and Alice's one older cache is what an LRU
  // would let go: here Mallory's oldest goes, and Alice keeps hers, by
  // count (3 against 1) and by room (60 tokens against 40).
  const std::list<std::string> kept = {"m3", "m2", "m1", "a1"};
  const session_ids cached = {{"m3", ids(20)}, {"m2", ids(20)}, {"m1", ids(20)}, {"a1", ids(40)}};
  const std::map<std::string, std::string> domains = {
      {"m3", "mallory"}, {"m2", "mallory"}, {"m1", "mallory"}, {"a1", "alice"}};
  CHECK(next_to_let_go(kept, cached, from(domains), by_count) == "m1");
  CHECK(next_to_let_go(kept, cached, from(domains), by_room) == "m1");
  // Alice's one cache holding more than Mallory's three together: it goes
  // when room ran out, not when the count did.
  session_ids big = cached;
  big["a1"] = ids(61);
  CHECK(next_to_let_go(kept, big, from(domains), by_room) == "a1");
  CHECK(next_to_let_go(kept, big, from(domains), by_count) == "m1");
  // Tokens tie: the domain with more kept sessions; then the one whose
  // oldest finished first.
  big["a1"] = ids(60);
  CHECK(next_to_let_go(kept, big, from(domains), by_room) == "m1");
  const std::list<std::string> three = {"c1", "b1", "a1"};
  const session_ids even = {{"a1", ids(9)}, {"b1", ids(9)}, {"c1", ids(9)}};
  const std::map<std::string, std::string> abc = {{"a1", "alice"}, {"b1", "bob"}, {"c1", "carol"}};
  CHECK(next_to_let_go(three, even, from(abc), by_room) == "a1");
  CHECK(next_to_let_go({"c1", "a1", "b1"}, even, from(abc), by_count) == "b1");
}

TEST_CASE("cache retention: the most recently finished cache stays while another is kept, and counts in its domain") {
  // A tenant's long chat just finished; three short caches of the default
  // domain are older. By room the chat's domain holds the most, but the
  // chat's cache is its only one and the newest: an older one goes.
  const std::list<std::string> kept = {"chat", "u3", "u2", "u1"};
  const session_ids cached = {{"chat", ids(2000)}, {"u3", ids(100)}, {"u2", ids(100)}, {"u1", ids(100)}};
  const std::map<std::string, std::string> domains = {{"chat", "tenant"}, {"u3", ""}, {"u2", ""}, {"u1", ""}};
  CHECK(next_to_let_go(kept, cached, from(domains), by_room) == "u1");
  CHECK(next_to_let_go(kept, cached, from(domains), by_count) == "u1");
  // The newest still counts: Alice's older cache beside her newest makes
  // her domain the one holding the most (2 against 1).
  const std::list<std::string> two = {"a2", "b1", "a1"};
  const session_ids same = {{"a2", ids(5)}, {"b1", ids(5)}, {"a1", ids(5)}};
  const std::map<std::string, std::string> ab = {{"a1", "alice"}, {"a2", "alice"}, {"b1", "bob"}};
  CHECK(next_to_let_go(two, same, from(ab), by_count) == "a1");
  const std::list<std::string> b_first = {"a2", "a1", "b1"};
  CHECK(next_to_let_go(b_first, same, from(ab), by_count) == "a1");
}

TEST_CASE("cache retention: a session without a domain is a domain of its own, and one without ids holds none") {
  const std::list<std::string> kept = {"w", "x", "y", "z"};
  // "y" and "z" have no domain: each is alone, however a domain is named.
  const std::map<std::string, std::string> domains = {{"x", "sz"}, {"w", "sz"}};
  const session_ids cached = {{"w", ids(1)}, {"x", ids(10)}, {"y", ids(8)}, {"z", ids(8)}};
  CHECK(next_to_let_go(kept, cached, from(domains), by_room) == "x");
  const session_ids less = {{"w", ids(1)}, {"x", ids(3)}, {"y", ids(8)}, {"z", ids(8)}};
  CHECK(next_to_let_go(kept, less, from(domains), by_room) == "z");  // the tie of y and z: z finished first
  // Not in `cached`: counts as empty.
  const session_ids partial = {{"y", ids(1)}};
  CHECK(next_to_let_go(kept, partial, from(domains), by_room) == "y");
}
