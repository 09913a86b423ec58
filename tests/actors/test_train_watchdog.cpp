// The stage watchdog of a training rank (actors/train_watchdog.hpp): the
// beacon's bookkeeping, the threshold, a hung call reported once, and the
// harness's stall, and its answer to the coordinator's train.waits?.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_watchdog.hpp"
#include "actors/train_wire.hpp"
#include "tests/support/eventually.hpp"

using namespace corolla;
using namespace std::chrono_literals;
using corolla::testing::eventually;

namespace {

/// What on_hang was called with, and how often.
struct hang_log {
  std::mutex mu;
  int calls = 0;
  double seconds = 0;
  std::string what;
  std::function<void(double, const std::string&)> callback() {
    return [this](double s, const std::string& w) {
      std::lock_guard lock(mu);
      ++calls;
      seconds = s;
      what = w;
    };
  }
  int count() {
    std::lock_guard lock(mu);
    return calls;
  }
};

}  // namespace

TEST_CASE("the stage beacon: busy inside a call, idle after it, and the longest call kept") {
  stage_beacon b;
  CHECK(b.busy_s() == 0);
  CHECK(b.longest_s() == 0);
  double total = 0;
  {
    compute_window w(b, "forward", total);
    std::this_thread::sleep_for(20ms);
    const char* what = "";
    CHECK(b.busy_s(&what) >= 0.015);
    CHECK(std::string(what) == "forward");
  }
  CHECK(b.busy_s() == 0);
  CHECK(total >= 0.015);
  CHECK(b.longest_s() >= 0.015);
  const double longest = b.longest_s();
  { compute_window w(b, "backward", total); }  // shorter: the longest stays
  CHECK(b.longest_s() == longest);
  // A call is hung past the floor, or ten times the longest when that is more.
  CHECK(hang_threshold_s(4.0, 0.01) == 4.0);
  CHECK(hang_threshold_s(4.0, 1.0) == 10.0);
  CHECK(hang_reason("rank 3 (stage 1, replica 1, blocks 2..3)", 4.25, "backward", 4, 0.012) ==
        "rank 3 (stage 1, replica 1, blocks 2..3) is hung: its stage has been inside one backward for 4.2 s (the "
        "longest before took 0.012 s; --hang-s 4)");
}

TEST_CASE("the watchdog reports a compute call that does not return, once, and never an idle or a short one") {
  auto n = node::start({});
  REQUIRE(n);
  auto beacon = std::make_shared<stage_beacon>();
  hang_log log;
  auto inbox = std::make_shared<train_inbox>();
  // A threshold of 3 s: the 20 ms calls below stay far from it even on a
  // busy machine that deschedules one of them for a while.
  caf::actor dog = spawn_train_watchdog((*n)->system(), beacon, 3.0, log.callback(),
                                        [inbox](std::uint64_t job) { return inbox->activity(0, job); });
  // Idle for longer than the threshold: nothing.
  std::this_thread::sleep_for(3200ms);
  CHECK(log.count() == 0);
  // Short calls: nothing.
  double total = 0;
  for (int i = 0; i < 5; ++i) {
    compute_window w(*beacon, "forward", total);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(log.count() == 0);
  // The harness's stall: the next call does not return until it is lifted.
  caf::anon_send(dog, stall_atom::value, true);
  REQUIRE(eventually([&] { return beacon->stalled(); }, 5s));
  std::atomic<bool> returned{false};
  std::thread stage([&] {
    compute_window w(*beacon, "backward", total);
    returned = true;
  });
  REQUIRE_MESSAGE(eventually([&] { return log.count() == 1; }, 30s), "no hang reported within 30 s");
  CHECK_FALSE(returned.load());
  {
    std::lock_guard lock(log.mu);
    CHECK(log.what == "backward");
    CHECK(log.seconds > 3.0);
  }
  caf::anon_send(dog, stall_atom::value, false);
  stage.join();
  CHECK(returned.load());
  std::this_thread::sleep_for(300ms);
  CHECK(log.count() == 1);  // reported once
  caf::anon_send_exit(dog, caf::exit_reason::user_shutdown);
  (*n)->stop();
}

TEST_CASE("the watchdog tells the coordinator what its rank does (waits, compute call, progress), for its own run only") {
  auto n = node::start({});
  REQUIRE(n);
  auto beacon = std::make_shared<stage_beacon>();
  auto inbox = std::make_shared<train_inbox>();
  inbox->set_job(42);
  caf::actor dog = spawn_train_watchdog((*n)->system(), beacon, 0, [](double, const std::string&) {},
                                        [inbox](std::uint64_t job) { return inbox->activity(3, job); });
  caf::scoped_actor self{(*n)->system()};
  auto ask = [&](std::uint64_t job, const char* type = train_msg::waits_query) {
    remote_message q;
    q.type = type;
    q.body = encode_body(train_step_note{7, 0, 0, job});
    caf::expected<schedule::rank_activity> out{caf::error{}};
    self->request(dog, 5s, std::move(q))
        .receive(
            [&](remote_message& m) {
              CHECK(m.type == train_msg::waits);
              out = decode_rank_activity(m.body);
            },
            [&](caf::error& e) { out = std::move(e); });
    return out;
  };
  const std::string key = train_key(train_msg::act, 42, 7, 1);
  std::thread stage([&] { inbox->take(key, 10s, "activations of micro-batch 0 from rank 2", 2); });
  REQUIRE(eventually([&] { return inbox->waits().size() == 1; }, 5s));
  std::this_thread::sleep_for(20ms);
  auto a = ask(42);
  REQUIRE(a);
  CHECK(a->rank == 3);
  CHECK(a->answered);
  CHECK(a->computing.empty());
  CHECK(a->progress == 0);
  REQUIRE(a->waits.size() == 1u);
  CHECK(a->waits[0].what == "activations of micro-batch 0 from rank 2");
  CHECK(a->waits[0].from == 2);
  CHECK(a->waits[0].seconds >= 0.015);
  // Another run's coordinator, or a stranger, learns nothing.
  CHECK_FALSE(ask(41));
  CHECK_FALSE(ask(0));
  CHECK_FALSE(ask(42, train_msg::report));
  // The message comes: no wait, one message taken; then a compute call.
  inbox->put(key, remote_message{});
  stage.join();
  double total = 0;
  {
    compute_window w(*beacon, "backward", total);
    a = ask(42);
  }
  REQUIRE(a);
  CHECK(a->waits.empty());
  CHECK(a->computing == "backward");
  CHECK(a->progress == 1);
  a = ask(42);
  REQUIRE(a);
  CHECK(a->computing.empty());
  CHECK(a->progress == 2);  // the call ended
  caf::anon_send_exit(dog, caf::exit_reason::user_shutdown);
  (*n)->stop();
}

TEST_CASE("an inbox told to lose messages of a type drops that many and files the rest") {
  train_inbox inbox;
  inbox.lose(train_msg::act, 1);
  remote_message act;
  act.type = train_msg::act;
  inbox.put(train_key(train_msg::act, 1, 1, 0), act);  // lost
  remote_message grad;
  grad.type = train_msg::grad;
  inbox.put(train_key(train_msg::grad, 1, 1, 0), grad);
  inbox.put(train_key(train_msg::act, 1, 1, 1), act);
  CHECK_FALSE(inbox.try_take(train_key(train_msg::act, 1, 1, 0), 10ms, "the lost one"));
  CHECK(inbox.waits().empty());
  CHECK(inbox.taken() == 0);
  CHECK(inbox.try_take(train_key(train_msg::grad, 1, 1, 0), 10ms, "the gradient"));
  CHECK(inbox.try_take(train_key(train_msg::act, 1, 1, 1), 10ms, "the next one"));
  CHECK(inbox.taken() == 2);
}
