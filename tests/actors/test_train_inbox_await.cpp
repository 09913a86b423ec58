// The inbox's non-blocking take (train_inbox::await), which the stage and
// DP-group actors wait with: a message already filed comes back at once; a
// later one, or the inbox's failure, reaches the actor as a message; a
// cancelled await gets nothing and leaves the message filed; waits()
// counts open awaits. And inbox_waiter, the deadline of an actor's waits.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <functional>
#include <thread>

#include <caf/all.hpp>

#include "actors/inbox_waiter.hpp"
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

using go_atom = caf::atom_constant<caf::atom("go")>;

/// An actor that waits for each (key, timeout) of `script` in turn through
/// an inbox_waiter, and tells `to` how each ended: "at once T", "message
/// T" (T: the message's type) or "error <what>".
caf::behavior script_actor(caf::event_based_actor* self, std::shared_ptr<train_inbox> inbox, caf::actor to,
                           std::vector<std::pair<std::string, std::chrono::milliseconds>> script) {
  struct state {
    inbox_waiter waiter;
    std::vector<std::pair<std::string, std::chrono::milliseconds>> script;
    std::size_t at = 0;
  };
  auto st = std::make_shared<state>(state{inbox_waiter(inbox, 10s), std::move(script)});
  st->waiter.bind(self);
  auto report = [self, to](std::string s) { self->send(to, std::move(s)); };
  auto start = std::make_shared<std::function<void()>>();
  auto guarded = [st, report, start](auto&& f) {
    try {
      f();
    } catch (const train_error& e) {
      report(std::string("error ") + e.what());
      ++st->at;
      (*start)();
    }
  };
  *start = [st, report, start, guarded] {
    if (st->at == st->script.size()) return;
    guarded([&] {
      const auto& [key, timeout] = st->script[st->at];
      auto m = st->waiter.await(
          key, key, 0,
          [st, report, start](remote_message m) {
            report("message " + m.type);
            ++st->at;
            (*start)();
          },
          timeout);
      if (!m) return;
      report("at once " + m->type);
      ++st->at;
      (*start)();
    });
  };
  return {
      [start](go_atom) { (*start)(); },
      [st, guarded](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
        guarded([&] { st->waiter.on_delivery(token, std::move(m)); });
      },
      [st, guarded](inbox_failure_atom, std::uint64_t token, std::string& reason) {
        guarded([&] { st->waiter.on_failure(token, reason); });
      },
      [st, guarded](inbox_deadline_atom, std::uint64_t timer) { guarded([&] { st->waiter.on_deadline(timer); }); },
  };
}

/// The next line `self` was told, or "nothing" within `wait`.
std::string next_line(caf::scoped_actor& self, std::chrono::milliseconds wait) {
  std::string out = "nothing";
  self->receive([&](std::string& s) { out = std::move(s); }, caf::after(wait) >> [] {});
  return out;
}

/// Waits until `inbox` shows a wait for `what`.
void until_waiting(const train_inbox& inbox, const std::string& what) {
  for (int i = 0; i < 2000; ++i) {
    for (const auto& w : inbox.waits())
      if (w.what == what) return;
    std::this_thread::sleep_for(5ms);
  }
  FAIL("no wait for " << what);
}

}  // namespace

TEST_CASE("an actor's await gets a filed message at once, a later one and a failure as messages, and nothing once "
          "cancelled") {
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

TEST_CASE("an actor's waits end at their own deadline, a short one after a long one too, and with the inbox's "
          "failure") {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  auto inbox = std::make_shared<train_inbox>();
  inbox->put("filed", typed("filed"));
  auto actor = system.spawn(script_actor, inbox, caf::actor_cast<caf::actor>(self),
                            std::vector<std::pair<std::string, std::chrono::milliseconds>>{
                                {"filed", 10s}, {"lost", 300ms}, {"later", 10s}, {"long", 8s}, {"short", 200ms},
                                {"failed", 10s}, {"after", 10s}});
  const auto t0 = std::chrono::steady_clock::now();
  caf::anon_send(actor, go_atom::value);
  CHECK(next_line(self, 10s) == "at once filed");
  CHECK(next_line(self, 10s) == "error no lost within 300 ms");
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  until_waiting(*inbox, "later");
  inbox->put("later", typed("later"));
  CHECK(next_line(self, 10s) == "message later");
  // The long wait's timer (8 s) stands when the short one opens: the short
  // one still ends at its own deadline, not the long one's.
  until_waiting(*inbox, "long");
  inbox->put("long", typed("long"));
  CHECK(next_line(self, 10s) == "message long");
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(next_line(self, 10s) == "error no short within 200 ms");
  const double short_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  CHECK(short_s >= 0.15);
  CHECK(short_s < 6.0);  // far below the long wait's 8 s, even on a busy machine
  until_waiting(*inbox, "failed");
  inbox->fail("rank 1 (stage 1) is down: connection lost");
  CHECK(next_line(self, 10s) == "error rank 1 (stage 1) is down: connection lost");
  CHECK(next_line(self, 10s) == "error rank 1 (stage 1) is down: connection lost");  // "after": at once
  CHECK(inbox->waits().empty());
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

namespace {

using cancel_atom = caf::atom_constant<caf::atom("cancel")>;

/// Five waiters of one actor, in lanes 0 to 4 (the DP-group actor's rings
/// side by side): each waits for its key ("a" to "e"; "b" for 300 ms only)
/// and tells `to` "lane N message T" or "lane N error <what>". cancel_atom
/// gives lane 2's wait up.
caf::behavior lanes_actor(caf::event_based_actor* self, std::shared_ptr<train_inbox> inbox, caf::actor to) {
  auto waiters = std::make_shared<std::vector<std::unique_ptr<inbox_waiter>>>();
  for (std::uint16_t lane = 0; lane < 5; ++lane) {
    waiters->push_back(std::make_unique<inbox_waiter>(inbox, 10s, lane));
    waiters->back()->bind(self);
  }
  auto report = [self, to](std::size_t lane, std::string s) {
    self->send(to, "lane " + std::to_string(lane) + " " + std::move(s));
  };
  auto guarded = [report](std::size_t lane, auto&& f) {
    try {
      f();
    } catch (const train_error& e) {
      report(lane, std::string("error ") + e.what());
    }
  };
  const char* keys[] = {"a", "b", "c", "d", "e"};
  for (std::size_t lane = 0; lane < 5; ++lane)
    guarded(lane, [&] {
      auto m = (*waiters)[lane]->await(
          keys[lane], keys[lane], 0, [report, lane](remote_message m) { report(lane, "message " + m.type); },
          lane == 1 ? std::optional<std::chrono::milliseconds>(300ms) : std::nullopt);
      if (m) report(lane, "at once " + m->type);
    });
  auto route = [waiters](std::uint64_t token) -> inbox_waiter* {
    const std::size_t lane = inbox_waiter::lane_of(token);
    return lane < waiters->size() ? (*waiters)[lane].get() : nullptr;
  };
  return {
      [waiters](cancel_atom) { (*waiters)[2]->cancel(); },
      [route, guarded](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
        if (auto* w = route(token)) guarded(inbox_waiter::lane_of(token), [&] { w->on_delivery(token, std::move(m)); });
      },
      [route, guarded](inbox_failure_atom, std::uint64_t token, std::string& reason) {
        if (auto* w = route(token)) guarded(inbox_waiter::lane_of(token), [&] { w->on_failure(token, reason); });
      },
      [route, guarded](inbox_deadline_atom, std::uint64_t timer) {
        if (auto* w = route(timer)) guarded(inbox_waiter::lane_of(timer), [&] { w->on_deadline(timer); });
      },
  };
}

}  // namespace

TEST_CASE("waiters in lanes of one actor each hold a wait of their own: their messages, deadlines and cancels reach "
          "only their lane") {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  auto inbox = std::make_shared<train_inbox>();
  auto actor = system.spawn(lanes_actor, inbox, caf::actor_cast<caf::actor>(self));
  for (const char* key : {"a", "c", "d", "e"}) until_waiting(*inbox, key);
  // Lane 1's short wait ends alone: the other lanes still wait.
  CHECK(next_line(self, 10s) == "lane 1 error no b within 300 ms");
  CHECK(inbox->waits().size() == 4);
  // Lane 2 gives its wait up: its message stays filed, nothing comes.
  caf::anon_send(actor, cancel_atom::value);
  for (int i = 0; i < 2000 && inbox->waits().size() != 3; ++i) std::this_thread::sleep_for(5ms);
  REQUIRE(inbox->waits().size() == 3);
  inbox->put("c", typed("c"));
  inbox->put("a", typed("a"));
  CHECK(next_line(self, 10s) == "lane 0 message a");
  CHECK(next_line(self, 300ms) == "nothing");
  CHECK(inbox->take("c", 10ms, "c").type == "c");
  // The inbox failing ends every lane's wait, each with the reason.
  inbox->fail("rank 1 (stage 0, replica 1) is down: connection lost");
  std::vector<std::string> ends{next_line(self, 10s), next_line(self, 10s)};
  std::sort(ends.begin(), ends.end());
  CHECK(ends == std::vector<std::string>{"lane 3 error rank 1 (stage 0, replica 1) is down: connection lost",
                                         "lane 4 error rank 1 (stage 0, replica 1) is down: connection lost"});
  CHECK(inbox->waits().empty());
  // Tokens and timers carry their lane.
  CHECK(inbox_waiter::lane_of(std::uint64_t{2} << 48 | 7) == 2);
  CHECK(inbox_waiter::lane_of(7) == 0);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}
