// The scheduler actor of elastic training (actors/train_scheduler.hpp):
// what it decides on each event, from its own state, through its message
// protocol (no rank processes: the launcher's side of it is exercised by
// tests/apps/mp_train_elastic.cpp).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "actors/train_scheduler.hpp"
#include "model/config.hpp"
#include "schedule/membership.hpp"
#include "tests/schedule/two_sites.hpp"

using namespace corolla;
using namespace std::chrono_literals;

namespace {

bool has_note(const std::vector<std::string>& notes, const std::string& part) {
  for (const std::string& n : notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

model_config four_blocks() {
  model_config cfg;
  cfg.n_layers = 4;
  cfg.hidden_size = 32;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 4;
  cfg.head_dim = 8;
  cfg.intermediate_size = 64;
  cfg.vocab_size = 64;
  return cfg;
}

model_config llama_7b() {
  return load_config(std::filesystem::path(COROLLA_SOURCE_DIR) / "docs" / "clusters" / "models" / "llama2-7b.json");
}

scheduler_setup grid_setup(int pp, int dp) {
  scheduler_setup s;
  s.cfg = four_blocks();
  s.layout = even_layout(s.cfg.n_layers, pp, dp);
  s.steps = 40;
  s.batch = 12;
  s.joins = true;
  return s;
}

/// A --cluster job of Llama-2-7B on two_sites (a0/0 a0/1 a1/0 a1/1 | b/0
/// b/1): 100 steps of batch 32, no plan yet.
scheduler_setup cluster_setup() {
  scheduler_setup s;
  s.cfg = llama_7b();
  s.steps = 100;
  s.batch = 32;
  s.training.global_batch = 32;
  s.file = schedule::testing::two_sites();
  return s;
}

/// The grid as the launcher lays plan `p` on `c` out: one worker name per rank.
train_layout laid_out(const schedule::plan& p, const schedule::cluster_description& c) {
  train_layout l;
  l.pp = p.pp;
  l.dp = p.dp;
  for (const auto& st : p.stages)
    for (int w : st.workers) l.worker_names.push_back(c.workers[static_cast<std::size_t>(w)].name);
  return l;
}

dist_step_report report(int step, double seconds) {
  dist_step_report r;
  r.step = step;
  r.seconds = seconds;
  return r;
}

/// A 1x2 grid's scheduler whose verdicts ask `pool` (a lobby actor), its
/// grid started and one step reported.
std::unique_ptr<train_scheduler> stepped_with_pool(caf::actor pool) {
  scheduler_setup s = grid_setup(1, 2);
  s.pool = std::move(pool);
  auto sched = std::make_unique<train_scheduler>(std::move(s));
  sched->started(even_layout(4, 1, 2));
  sched->step(report(1, 0.5));
  return sched;
}

}  // namespace

TEST_CASE("the scheduler re-grids a --pp/--dp job on the ranks it has left, and stops below --min-ranks") {
  SUBCASE("2x2 less rank 3 is 1x3, then less rank 1 is 1x2") {
    train_scheduler sched(grid_setup(2, 2));
    sched.started(even_layout(4, 2, 2));
    const grid_decision d = sched.failed({3}, "rank 3 is down");
    REQUIRE_MESSAGE(d.stop.empty(), d.stop);
    CHECK(d.layout.pp == 1);
    CHECK(d.layout.dp == 3);
    CHECK(d.ranks_left == 3);
    CHECK(d.left_unit == "rank(s)");
    CHECK_FALSE(d.plan);
    CHECK_FALSE(d.where.any());  // every rank is the launcher's
    sched.started(d.layout);
    const grid_decision e = sched.failed({1}, "rank 1 is down");
    REQUIRE(e.stop.empty());
    CHECK(e.layout.world() == 2);
    CHECK(e.ranks_left == 2);
  }
  SUBCASE("--min-ranks 4: the error names the failure and the count") {
    scheduler_setup s = grid_setup(2, 2);
    s.min_ranks = 4;
    train_scheduler sched(s);
    const grid_decision d = sched.failed({2}, "rank 2 (stage 1, replica 0) is down");
    CHECK(d.stop == "rank 2 (stage 1, replica 0) is down; 3 rank(s) left, fewer than --min-ranks 4");
  }
  SUBCASE("a drain the scheduler did not ask for is an error, not a re-plan") {
    train_scheduler sched(grid_setup(2, 2));
    const grid_decision d = sched.drained(7);
    CHECK(d.stop == "the job stopped after step 7 of 40 without a re-plan");
  }
}

TEST_CASE("the scheduler grows a --pp/--dp grid onto pooled machines when the saving pays, and loses them again") {
  train_scheduler sched(grid_setup(1, 2));
  sched.started(even_layout(4, 1, 2));
  sched.step(report(1, 0.5));
  const std::vector<schedule::machine_offer> pool = {{"n-aaaa", "w-a"}, {"n-bbbb", "w-b"}};

  // Nobody pooled: no drain. The lobby not answering: no drain either.
  drain_query none;
  none.report = report(2, 0.5);
  none.pool_ok = true;
  CHECK_FALSE(sched.verdict(none).drain);
  drain_query silent = none;
  silent.pool = pool;
  silent.pool_ok = false;
  CHECK_FALSE(sched.verdict(silent).drain);

  // Two machines: 4 ranks save half of each of the 38 steps left.
  drain_query q = none;
  q.pool = pool;
  const drain_verdict v = sched.verdict(q);
  REQUIRE(v.drain);
  CHECK(has_note(v.notes, "worker(s) w-a, w-b joined: growing 1x2 [0,4) to "));
  const grid_decision d = sched.drained(2);
  REQUIRE_MESSAGE(d.stop.empty(), d.stop);
  REQUIRE(d.layout.world() == 4);
  CHECK(d.cause == "workers joined");
  CHECK(d.changes == std::vector<std::string>{"worker(s) w-a, w-b joined"});
  // Ranks 0 and 1 stay the launcher's; the joined machines run the highest.
  CHECK(d.where.of(d.layout, 1) == nullptr);
  REQUIRE(d.where.of(d.layout, 2) != nullptr);
  CHECK(d.where.of(d.layout, 2)->node_id == "n-aaaa");
  CHECK(d.where.of(d.layout, 3)->node_id == "n-bbbb");

  // The same machines again: already in, nothing to decide.
  sched.started(d.layout);
  sched.step(report(3, 0.25));
  drain_query again = q;
  again.report = report(4, 0.25);
  CHECK_FALSE(sched.verdict(again).drain);

  // The rank on n-aaaa dies: the grid of the three left keeps n-bbbb.
  const grid_decision e = sched.failed({2}, "rank 2 is down");
  REQUIRE(e.stop.empty());
  CHECK(e.layout.world() == 3);
  REQUIRE(e.where.of(e.layout, 2) != nullptr);
  CHECK(e.where.of(e.layout, 2)->node_id == "n-bbbb");
}

TEST_CASE("at a verdict the scheduler asks its lobby actor who is pooled, and a lobby that cannot answer is a note") {
  // The lobby in an actor system of its own, as the launcher's is.
  caf::actor_system_config cfg;
  caf::actor_system lobby_system{cfg};
  const std::vector<schedule::machine_offer> pooled = {{"n-aaaa", "w-a"}, {"n-bbbb", "w-b"}};
  auto lobby = lobby_system.spawn<caf::detached>([pooled](caf::event_based_actor*) -> caf::behavior {
    return {[pooled](sched_msg::pool_atom) { return flat_pool(pooled); }};
  });
  CHECK(pool_of_flat(flat_pool(pooled)).size() == 2);
  SUBCASE("answered: the pooled machines join") {
    auto sched = stepped_with_pool(lobby);
    drain_query q;  // no pool given: the scheduler asks the lobby
    q.report = report(2, 0.5);
    const drain_verdict v = sched->verdict(q);
    CHECK(v.drain);
    CHECK(has_note(v.notes, "worker(s) w-a, w-b joined: growing 1x2 [0,4) to "));
    const grid_decision d = sched->drained(2);
    REQUIRE_MESSAGE(d.stop.empty(), d.stop);
    REQUIRE(d.where.of(d.layout, 3) != nullptr);
    CHECK(d.where.of(d.layout, 3)->node_id == "n-bbbb");
  }
  SUBCASE("a lobby gone: nobody joins, and the note says why") {
    caf::anon_send_exit(lobby, caf::exit_reason::kill);
    {
      caf::scoped_actor self{lobby_system};
      self->wait_for(lobby);
    }
    auto sched = stepped_with_pool(lobby);
    drain_query q;
    q.report = report(2, 0.5);
    q.pool = pooled;  // what the caller says is ignored: the lobby is asked
    q.pool_ok = true;
    const drain_verdict v = sched->verdict(q);
    CHECK_FALSE(v.drain);
    REQUIRE_FALSE(v.notes.empty());
    CHECK(v.notes.front().rfind("the lobby did not answer: ", 0) == 0);
  }
  SUBCASE("an answer that comes after the grid failed decides nothing") {
    // A lobby that takes 300 ms to answer, and says when it has.
    std::atomic<bool> answered{false};
    auto slow = lobby_system.spawn<caf::detached>([pooled, &answered](caf::event_based_actor* lobby) -> caf::behavior {
      return {[pooled, &answered, lobby](sched_msg::pool_atom) {
        auto rp = lobby->make_response_promise<std::vector<std::string>>();
        std::this_thread::sleep_for(300ms);
        rp.deliver(flat_pool(pooled));
        answered = true;
        return rp;
      }};
    });
    auto sched = stepped_with_pool(slow);
    caf::scoped_actor self{lobby_system};
    drain_query q;
    q.report = report(2, 0.5);
    auto pending = self->request(sched->actor(), caf::infinite, sched_msg::verdict_atom::value, q);
    // While the scheduler waits for the lobby, a rank fails: another grid.
    const grid_decision d = sched->failed({1}, "rank 1 is down");
    REQUIRE_MESSAGE(d.stop.empty(), d.stop);
    CHECK(d.layout.world() == 1);
    bool drains = true;
    pending.receive([&](drain_verdict& v) { drains = v.drain; },
                    [&](caf::error& e) { FAIL("the verdict failed: " << lobby_system.render(e)); });
    CHECK_FALSE(drains);
    // Nothing was planned on the old grid's behalf once the lobby's answer
    // came (it is in the scheduler's mailbox before the next request).
    for (int i = 0; i < 2000 && !answered; ++i) std::this_thread::sleep_for(5ms);
    REQUIRE(answered);
    CHECK(sched->drained(2).stop == "the job stopped after step 2 of 40 without a re-plan");
    caf::anon_send_exit(slow, caf::exit_reason::user_shutdown);
  }
  SUBCASE("a verdict whose asker ended is answered at once: the pending answer holds the asker's system no longer") {
    // A lobby that never answers (the scheduler's ask times out after 10 s).
    std::atomic<int> asked{0};
    auto silent = lobby_system.spawn<caf::detached>([&asked](caf::event_based_actor* lobby) -> caf::behavior {
      return {[lobby, &asked](sched_msg::pool_atom) {
        auto never = lobby->make_response_promise<std::vector<std::string>>();
        ++asked;
        return never;
      }};
    });
    auto sched = stepped_with_pool(silent);
    const caf::actor scheduler = sched->actor();
    drain_query q;
    q.report = report(2, 0.5);
    // The coordinator's side: an actor of another system asks, as the
    // coordinator does (a bounded request); then it ends (here by an exit
    // message, the way nothing of its own could announce), and its system
    // shuts down.
    caf::actor_system_config asker_cfg;
    std::optional<caf::actor_system> asker_system{std::in_place, asker_cfg};
    auto asker = asker_system->spawn<caf::detached>([scheduler, q](caf::event_based_actor* a) -> caf::behavior {
      a->request(scheduler, 60s, sched_msg::verdict_atom::value, q).then([](drain_verdict&) {}, [](caf::error&) {});
      return {[](int) {}};
    });
    for (int i = 0; i < 2000 && asked == 0; ++i) std::this_thread::sleep_for(5ms);
    REQUIRE(asked == 1);
    caf::anon_send_exit(asker, caf::exit_reason::user_shutdown);
    asker = caf::actor{};
    const auto t0 = std::chrono::steady_clock::now();
    asker_system.reset();  // waits for the asker's thread, which lives while anyone holds the actor
    const auto shutdown = std::chrono::steady_clock::now() - t0;
    CHECK(shutdown < 5s);  // not the lobby's 10 s
    // The scheduler goes on answering.
    CHECK(sched->drained(2).stop == "the job stopped after step 2 of 40 without a re-plan");
    caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  }
  caf::anon_send_exit(lobby, caf::exit_reason::user_shutdown);
}

TEST_CASE("a verdict that cannot be made is an error answer, and the scheduler goes on answering") {
  scheduler_setup s = cluster_setup();
  s.probing = true;
  s.plan = schedule::make_plan(*s.file, s.cfg, s.training).best;
  REQUIRE(s.plan->feasible);
  const train_layout running = laid_out(*s.plan, *s.file);
  s.layout = running;
  train_scheduler sched(std::move(s));
  sched.started(running);
  // A probe naming a rank the grid does not have.
  drain_query q;
  q.report = report(6, 1.0);
  q.report.links.push_back({0, 99, 1e9});
  try {
    sched.verdict(q);
    FAIL("a verdict on a rank the grid lacks");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("the verdict of step 6 failed: ") != std::string::npos);
  }
  // Still up: the next question is answered.
  drain_query fine;
  fine.report = report(8, 1.0);
  CHECK_FALSE(sched.verdict(fine).drain);
}

TEST_CASE("a pooled machine waits when the steps left cannot pay for the switch") {
  train_scheduler sched(grid_setup(1, 2));
  sched.started(even_layout(4, 1, 2));
  drain_query q;
  q.report = report(39, 1e-4);  // one step left, and a fast one: 50 us to save
  q.pool_ok = true;
  q.pool = {{"n-aaaa", "w-a"}, {"n-bbbb", "w-b"}};
  // A switch costs what the grid's first step took to come: at least 5 ms.
  std::this_thread::sleep_for(5ms);
  sched.step(report(1, 1e-4));
  const drain_verdict v = sched.verdict(q);
  CHECK_FALSE(v.drain);
  CHECK(has_note(v.notes, "2 worker(s) wait: growing to "));
}

TEST_CASE("the scheduler re-plans a --cluster job on the workers left, and takes a machine back as an absent worker") {
  scheduler_setup s = cluster_setup();
  s.standby = {"b/1"};
  s.joins = true;
  int planned = 0;
  s.planner = [&planned, &s](const schedule::cluster_description& c) {
    ++planned;
    return schedule::make_plan(c, s.cfg, s.training).best;
  };
  const schedule::cluster_description present = schedule::present_workers(*s.file, s.standby);
  s.plan = schedule::make_plan(present, s.cfg, s.training).best;
  REQUIRE(s.plan->feasible);
  const train_layout running = laid_out(*s.plan, present);
  s.layout = running;
  scheduler_setup copy = s;
  train_scheduler sched(std::move(copy));
  sched.started(running);

  // A machine offering itself as a worker the file does not miss waits, and says why once.
  drain_query q;
  q.report = report(5, 1.0);
  q.pool_ok = true;
  q.pool = {{"n-1111", "a0/0"}};
  drain_verdict v = sched.verdict(q);
  CHECK_FALSE(v.drain);
  CHECK(has_note(v.notes, "worker a0/0 (node n-1111) waits: a --cluster job takes a machine as an absent worker of "
                          "two-sites, named with --join-name (absent: b/1)"));
  CHECK(sched.verdict(q).notes.empty());

  // Rank 0's worker is lost: the planner plans on the four left (b/1 is still absent).
  const std::string lost_worker = running.worker_names.at(0);
  const grid_decision d = sched.failed({0}, "rank 0 is down");
  REQUIRE_MESSAGE(d.stop.empty(), d.stop);
  CHECK(planned == 1);
  REQUIRE(d.plan);
  REQUIRE(d.machines);
  CHECK(d.machines->size() == 4);
  CHECK(d.left_unit == "worker(s)");
  CHECK(d.ranks_left == 4);
  for (const auto& w : d.machines->workers) {
    CHECK(w.name != lost_worker);
    CHECK(w.name != "b/1");
  }
  CHECK_FALSE(d.where.any());
}

TEST_CASE("a --cluster job's scheduler says no feasible plan, naming the failure, when the workers left cannot hold it") {
  scheduler_setup s;
  s.cfg = four_blocks();
  s.steps = 10;
  s.batch = 8;
  s.file = schedule::testing::two_sites();
  s.planner = [](const schedule::cluster_description&) {
    schedule::plan p;
    p.feasible = false;
    p.reason = "the model does not fit";
    return p;
  };
  s.layout.pp = 1;
  s.layout.dp = 1;
  s.layout.worker_names = {"a0/0"};
  train_scheduler sched(s);
  const grid_decision d = sched.failed({0}, "rank 0 is down");
  CHECK(d.stop == "rank 0 is down; no feasible plan on the workers left: the model does not fit");
  SUBCASE("a bad --standby is refused before the actor starts") {
    scheduler_setup bad = s;
    bad.standby = {"z/9"};
    CHECK_THROWS_WITH_AS(train_scheduler{bad}, doctest::Contains("has no worker 'z/9'"), std::invalid_argument);
  }
}
