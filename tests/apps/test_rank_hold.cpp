// apps/rank_hold.hpp: a rank process holding its snapshots between grids
// takes the next grid's rank (train.next) only from whoever names a run
// whose keeper it holds, only a well-formed one, and then keeps only that
// run's keeper.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>

#include <caf/all.hpp>

#include "actors/corolla.hpp"
#include "tests/actors/node_test_util.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_snapshots.hpp"
#include "apps/rank_hold.hpp"
#include "apps/train_job_file.hpp"

using namespace corolla;
using namespace corolla::app;

namespace {

/// A keeper of run `job` on `n` (rank 1 of a 1x2 job).
caf::actor start_keeper(node& n, std::uint64_t job) {
  snapshot_keeper_setup setup;
  setup.holder = 1;
  setup.owners = snapshot_owners(even_layout(2, 1, 2), 1);
  setup.inbox = std::make_shared<train_inbox>();
  auto keeper = start_snapshot_keeper(n, setup, job);
  REQUIRE(keeper);
  return *keeper;
}

/// The next grid's job: 1x3, reading run `run`'s snapshots of step 5.
std::string next_job(std::uint64_t run) {
  dist_train_options o;
  o.layout = even_layout(4, 1, 3);
  o.batch = 3;
  o.seq = 8;
  o.steps = 10;
  o.resume = true;
  o.hold_snapshots = true;
  o.from_memory.step = 5;
  o.from_memory.run = run;
  return job_to_json(o).dump();
}

rank_assignment assignment(int rank, std::uint64_t run, const std::string& job) {
  return {{"train", "--rank", std::to_string(rank), "--coordinator", "tcp://127.0.0.1:7000", "--job-file", "x"},
          job, run};
}

}  // namespace

TEST_CASE("a holding rank process takes the next grid's rank only from whoever names a run it holds, only a "
          "well-formed one, and keeps only that run's keeper") {
  auto holder = node_test::start_node();
  auto launcher = node_test::start_node();
  start_keeper(*holder, 42);
  start_keeper(*holder, 43);  // an older grid's, which the next one does not read
  auto next = std::async(std::launch::async,
                         [&] { return hold_for_next_rank(*holder, nullptr, "rank 1", "training failed: test"); });
  // Should a check below fail before the holder took a rank, the future's
  // end would wait for it forever: hand it one on the way out.
  struct released {
    std::future<next_rank>& f;
    node& launcher;
    node& holder;
    ~released() {
      if (f.valid() && f.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready)
        (void)assign_next_rank(launcher, holder.id(), holder.endpoint(), assignment(0, 42, next_job(42)),
                               std::chrono::seconds(10));
    }
  } on_the_way_out{next, *launcher, *holder};
  // Until "train-next" is published, an assignment finds nobody.
  const auto timeout = std::chrono::seconds(10);
  caf::error err = make_error(errc::unknown_actor, "not asked");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    err = assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(0, 7, next_job(7)), timeout);
    if (err != make_error(errc::unknown_actor, "")) break;
  }
  // Another run's id: refused.
  CHECK(err == make_error(errc::auth_refused, ""));
  // Malformed: the job description, the rank, the coordinator, a job
  // reading another run.
  CHECK(assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(0, 42, "{"), timeout) ==
        make_error(errc::bad_message, ""));
  CHECK(assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(3, 42, next_job(42)), timeout) ==
        make_error(errc::bad_message, ""));
  rank_assignment no_coordinator = assignment(0, 42, next_job(42));
  no_coordinator.args.resize(3);
  CHECK(assign_next_rank(*launcher, holder->id(), holder->endpoint(), no_coordinator, timeout) ==
        make_error(errc::bad_message, ""));
  CHECK(assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(0, 42, next_job(43)), timeout) ==
        make_error(errc::bad_message, ""));
  CHECK(next.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);  // still holding
  // The right one.
  REQUIRE_FALSE(assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(2, 42, next_job(42)), timeout));
  REQUIRE(next.wait_for(timeout) == std::future_status::ready);
  const next_rank got = next.get();
  CHECK(got.rank == 2);
  CHECK(got.coordinator == "tcp://127.0.0.1:7000");
  CHECK(got.job.layout.world() == 3);
  CHECK(got.job.from_memory.run == 42u);
  // Only run 42's keeper is left; nobody takes a second assignment.
  CHECK(holder->local_actor(snapshot_keeper_name(42)));
  CHECK_FALSE(holder->local_actor(snapshot_keeper_name(43)));
  CHECK_FALSE(holder->local_actor("train-next"));
  CHECK(assign_next_rank(*launcher, holder->id(), holder->endpoint(), assignment(1, 42, next_job(42)), timeout) ==
        make_error(errc::unknown_actor, ""));
  caf::anon_send_exit(holder->local_actor(snapshot_keeper_name(42)), caf::exit_reason::user_shutdown);
  holder->unpublish(snapshot_keeper_name(42));
}
