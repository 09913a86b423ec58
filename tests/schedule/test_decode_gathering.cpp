// When a swarm server's queue of one-row steps runs (schedule/decode_gathering.hpp):
// it waits for the sessions of the last batches that have not queued their
// step yet, at most a fraction of the last batch's time and a cap, not at
// all once they are all queued, and not for sessions that ended or dropped
// out of the batches remembered.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "schedule/decode_gathering.hpp"

using namespace corolla::swarm;
using us = std::chrono::microseconds;
using strings = std::vector<std::string>;

TEST_CASE("decode gathering: nothing remembered, nothing to wait for") {
  decode_gathering g;
  CHECK(g.missing({"a"}).empty());
  CHECK(g.wait({"a"}, us(0)) == us(0));
}

TEST_CASE("decode gathering waits for the last batches' sessions, at most a fraction of the batch time") {
  decode_gathering g({.wait_fraction = 0.5, .max_wait = us(50'000), .remember_batches = 2});
  g.ran({"a", "b"}, 0.010);  // a phase of two sessions
  g.ran({"c", "d"}, 0.010);  // and the other one
  CHECK(g.missing({"c", "d"}) == strings{"a", "b"});
  CHECK(g.wait({"c", "d"}, us(0)) == us(5'000));     // half of the last batch's 10 ms
  CHECK(g.wait({"c", "d"}, us(3'000)) == us(2'000));  // what is left of it
  CHECK(g.wait({"c", "d"}, us(9'000)) == us(0));      // used up
  CHECK(g.wait({"a", "b", "c", "d"}, us(0)) == us(0));  // everyone is there
  CHECK(g.wait({"a", "b", "c", "d", "e"}, us(0)) == us(0));  // a new session is not waited for, nor waits
}

TEST_CASE("decode gathering: the cap bounds a slow batch's wait") {
  decode_gathering g({.wait_fraction = 0.5, .max_wait = us(20'000), .remember_batches = 2});
  g.ran({"a", "b"}, 1.0);
  CHECK(g.wait({"a"}, us(0)) == us(20'000));
}

TEST_CASE("decode gathering forgets ended sessions and those out of the batches remembered") {
  decode_gathering g({.wait_fraction = 1.0, .max_wait = us(50'000), .remember_batches = 2});
  g.ran({"a", "b", "c"}, 0.010);
  g.forget("b");
  CHECK(g.missing({"a"}) == strings{"c"});
  // c stops stepping: after two batches without it, nobody waits for it.
  g.ran({"a"}, 0.010);
  CHECK(g.missing({"a"}) == strings{"c"});
  g.ran({"a"}, 0.010);
  CHECK(g.missing({"a"}).empty());
  CHECK(g.wait({"a"}, us(0)) == us(0));
}

TEST_CASE("decode gathering with a zero fraction or cap never waits") {
  decode_gathering off({.wait_fraction = 0.0, .max_wait = us(50'000), .remember_batches = 2});
  off.ran({"a", "b"}, 0.010);
  CHECK(off.wait({"a"}, us(0)) == us(0));
  decode_gathering capped({.wait_fraction = 0.5, .max_wait = us(0), .remember_batches = 2});
  capped.ran({"a", "b"}, 0.010);
  CHECK(capped.wait({"a"}, us(0)) == us(0));
}

TEST_CASE("decode gathering waits for a session that just started as for one of the last batch") {
  decode_gathering g({.wait_fraction = 0.5, .max_wait = us(50'000), .remember_batches = 2});
  g.expect("new");  // before any batch: nothing to wait for
  CHECK(g.missing({"a"}).empty());
  g.ran({"a"}, 0.010);
  g.expect("new");
  g.expect("new");  // once
  CHECK(g.missing({"a"}) == strings{"new"});
  CHECK(g.wait({"a"}, us(0)) == us(5'000));
  CHECK(g.wait({"a", "new"}, us(0)) == us(0));
  g.forget("new");
  CHECK(g.missing({"a"}).empty());
  // Remembered as long as the batch it joined.
  g.expect("late");
  g.ran({"a"}, 0.010);
  CHECK(g.missing({"a"}) == strings{"late"});
  g.ran({"a"}, 0.010);
  CHECK(g.missing({"a"}).empty());
}
