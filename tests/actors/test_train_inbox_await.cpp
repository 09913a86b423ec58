// The inbox's non-blocking take (train_inbox::await), which the stage actor
// waits with: a message already filed comes back at once; a later one, or
// the inbox's failure, reaches the actor as a message; a cancelled await
// gets nothing and leaves the message filed; waits() counts open awaits.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/train_comm.hpp"
#include "schedule/wait_graph.hpp"

using namespace corolla;
using namespace std::chrono_literals;

namespace {

remote_message typed(const std::string& type) {
  remote_message m;
  m.type = type;
  return m;
}

/// What the scoped actor got within `wait` (its kind, token and text), or "nothing".
std::string next_answer(caf::scoped_actor& self, std::chrono::milliseconds wait) {
  std::string out = "nothing";
  self->receive([&](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
                  out = "delivery " + std::to_string(token) + " " + m.type;
                },
                [&](inbox_failure_atom, std::uint64_t token, std::string& reason) {
                  out = "failure " + std::to_string(token) + " " + reason;
                },
                caf::after(wait) >> [] {});
  return out;
}

}  // namespace

TEST_CASE("an actor's await gets a filed message at once, a later one and a failure as messages, and nothing once cancelled") {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  const caf::actor me = caf::actor_cast<caf::actor>(self);
  train_inbox inbox;

  // Filed before: returned at once, nothing is sent.
  inbox.put("act/1/1/0/0", typed("act"));
  auto now = inbox.await("act/1/1/0/0", "activations", 0, me, 1);
  REQUIRE(now);
  CHECK(now->type == "act");
  CHECK(inbox.taken() == 1);
  CHECK(inbox.waits().empty());

  // Not there yet: an open wait the stall check sees, then a message.
  CHECK_FALSE(inbox.await("grad/1/1/0/0", "gradient of micro-batch 0 from rank 1", 1, me, 2));
  REQUIRE(inbox.waits().size() == 1);
  CHECK(inbox.waits()[0].what == "gradient of micro-batch 0 from rank 1");
  CHECK(inbox.waits()[0].from == 1);
  CHECK(next_answer(self, 50ms) == "nothing");
  inbox.put("grad/1/1/0/1", typed("other key"));  // another key stays filed
  inbox.put("grad/1/1/0/0", typed("grad"));
  CHECK(next_answer(self, 10s) == "delivery 2 grad");
  CHECK(inbox.waits().empty());
  CHECK(inbox.taken() == 2);
  CHECK(inbox.take("grad/1/1/0/1", 10ms, "the other").type == "other key");

  // Two awaits of one key are answered oldest first.
  CHECK_FALSE(inbox.await("norm/1/1/0/0", "norm", schedule::from_coordinator, me, 3));
  CHECK_FALSE(inbox.await("norm/1/1/0/0", "norm", schedule::from_coordinator, me, 4));
  inbox.put("norm/1/1/0/0", typed("first"));
  inbox.put("norm/1/1/0/0", typed("second"));
  CHECK(next_answer(self, 10s) == "delivery 3 first");
  CHECK(next_answer(self, 10s) == "delivery 4 second");

  // Cancelled (its deadline passed): nothing comes, the message stays filed
  // for whoever asks next.
  CHECK_FALSE(inbox.await("drain/1/1/0/0", "verdict", schedule::from_coordinator, me, 5));
  CHECK_FALSE(inbox.cancel(me, 6));  // no such await
  CHECK(inbox.cancel(me, 5));
  CHECK_FALSE(inbox.cancel(me, 5));  // once only
  CHECK(inbox.waits().empty());
  inbox.put("drain/1/1/0/0", typed("drain"));
  CHECK(next_answer(self, 50ms) == "nothing");
  CHECK(inbox.take("drain/1/1/0/0", 10ms, "the verdict").type == "drain");

  // Answered already: too late to cancel (the message is on its way).
  CHECK_FALSE(inbox.await("act/1/2/0/0", "activations", 0, me, 7));
  inbox.put("act/1/2/0/0", typed("act"));
  CHECK_FALSE(inbox.cancel(me, 7));
  CHECK(next_answer(self, 10s) == "delivery 7 act");

  // faultlab's lose drops the message: the await stays open.
  inbox.lose("act", 1);
  CHECK_FALSE(inbox.await("act/1/3/0/0", "activations", 0, me, 8));
  inbox.put("act/1/3/0/0", typed("act"));
  CHECK(next_answer(self, 50ms) == "nothing");
  CHECK(inbox.waits().size() == 1);

  // A failure answers every open await with the reason; later awaits throw.
  inbox.fail("rank 1 (stage 1) is down: connection lost");
  CHECK(next_answer(self, 10s) == "failure 8 rank 1 (stage 1) is down: connection lost");
  CHECK(inbox.waits().empty());
  CHECK_THROWS_WITH_AS(inbox.await("act/1/4/0/0", "activations", 0, me, 9),
                       "rank 1 (stage 1) is down: connection lost", train_error);
}
