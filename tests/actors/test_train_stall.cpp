// The coordinator's stall check (actors/train_stall.hpp) against ranks on
// real nodes: ranks whose watchdogs do not answer are silent, and asking
// them costs one answer window for all of them, not one per rank.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/inbox_waiter.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_stall.hpp"
#include "actors/train_wire.hpp"

using namespace corolla;
using namespace std::chrono_literals;

namespace {

/// A "train-watch" that takes each question and never answers it (a rank
/// whose process is stopped): the promises are kept, so no error comes back.
struct deaf_state {
  std::vector<caf::response_promise> unanswered;
};

caf::behavior deaf_watch(caf::stateful_actor<deaf_state>* self) {
  return {[self](remote_message&) { self->state.unanswered.push_back(self->make_response_promise()); }};
}

}  // namespace

TEST_CASE("the stall check asks every rank at once: three ranks that do not answer cost one answer window, and the "
          "one the coordinator waits for is blamed as silent") {
  auto coord = node::start({});
  REQUIRE(coord);
  std::vector<std::unique_ptr<node>> ranks;
  std::map<int, std::string> ids;
  train_layout layout;
  layout.pp = 1;
  layout.dp = 3;
  layout.boundaries = {0, 4};
  for (int r = 0; r < 3; ++r) {
    node_options o;
    o.listen = "tcp://127.0.0.1:0";
    auto n = node::start(o);
    REQUIRE(n);
    caf::actor deaf = (*n)->system().spawn(deaf_watch);
    REQUIRE_FALSE((*n)->publish("train-watch", deaf));
    auto peer = (*coord)->connect((*n)->endpoint());
    REQUIRE(peer);
    ids[r] = *peer;
    ranks.push_back(std::move(*n));
  }
  auto inbox = std::make_shared<train_inbox>();
  inbox->set_job(7);
  // A coordinator-like actor that waits for rank 0's report of step 1 and
  // routes the watch's messages to it.
  auto verdict = std::make_shared<std::promise<void>>();
  auto judged = verdict->get_future();
  // What the actor uses lives as long as it does (the node: until the
  // test has waited for the actor to end, below).
  auto shared_layout = std::make_shared<const train_layout>(layout);
  node* at = coord->get();
  const auto t0 = std::chrono::steady_clock::now();
  caf::actor waiting = at->system().spawn([at, ids, shared_layout, inbox, verdict](caf::event_based_actor* self)
                                              -> caf::behavior {
    auto watch = std::make_shared<stall_watch>(*at, *shared_layout, 0.2, inbox, 60s);  // --hang-s 0.2
    watch->bind(self);
    watch->set_run(7, ids);
    auto guard = [self, verdict](auto&& f) {
      try {
        f();
      } catch (...) {
        verdict->set_exception(std::current_exception());
        self->quit();
      }
    };
    guard([&] {
      auto m = watch->await(train_msg::report, 1, 0, 0, "report of step 1",
                            [verdict](remote_message) { verdict->set_value(); });
      if (m) verdict->set_value();
    });
    return {
        // shared_layout: the watch holds a reference to it.
        [watch, guard, shared_layout](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
          guard([&] { watch->waiter().on_delivery(token, std::move(m)); });
        },
        [watch, guard](inbox_failure_atom, std::uint64_t token, std::string& reason) {
          guard([&] { watch->waiter().on_failure(token, reason); });
        },
        [watch, guard](inbox_deadline_atom, std::uint64_t timer) { guard([&] { watch->waiter().on_deadline(timer); }); },
        [watch, guard](stall_check_atom, std::uint64_t wait, int phase) { guard([&] { watch->on_check(wait, phase); }); },
    };
  });
  struct ender {
    caf::actor a;
    node* at;
    void now() {
      if (!a) return;
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      caf::scoped_actor s{at->system()};
      s->wait_for(a);
      a = nullptr;
    }
    ~ender() { now(); }
  } end_it{waiting, at};
  bool stalled = false;
  REQUIRE(judged.wait_for(60s) == std::future_status::ready);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  try {
    judged.get();
  } catch (const train_stall& e) {
    stalled = true;
    INFO(e.what());
    CHECK(e.blamed() == std::vector<int>{0});
    CHECK(std::string(e.what()).find("rank 0 (stage 0, replica 0, blocks 0..3) does not answer while its node is up") !=
          std::string::npos);
  }
  MESSAGE("judged silent after " << took << " s");
  CHECK(stalled);
  // 0.2 s quiet, two samples of one 3 s window each (the second at once:
  // the first took longer than the gap), 0.5 s for a late report. One rank
  // after another would take 3 x 3 s per sample (18 s or more). (Two
  // waves, about 12 s, would pass: a busy machine needs the room.)
  CHECK(took >= 6.0);
  CHECK(took < 17.0);
  end_it.now();
  for (auto& n : ranks) n->stop();
  (*coord)->stop();
}
