// apps/launcher_takeover.hpp: the launcher's state a rank process keeps
// (train.successor) round-trips, a malformed one or one without the job's
// token is refused; and apps/self_process.hpp's view of processes that are
// not this one's children (a launcher that took over adopts its
// predecessor's ranks).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "actors/corolla.hpp"
#include "tests/actors/node_test_util.hpp"
#include "apps/launcher_takeover.hpp"
#include "apps/self_process.hpp"
#include "apps/train_job_file.hpp"
#include "tests/support/eventually.hpp"

using namespace corolla;
using namespace corolla::app;

namespace {

takeover_state sample_state(const std::string& token) {
  dist_train_options o;
  o.layout = even_layout(4, 2, 2);
  o.batch = 4;
  o.seq = 8;
  o.steps = 10;
  o.hold_snapshots = true;
  o.takeover_token = token;
  takeover_state s;
  s.token = token;
  s.launcher = 4242;
  s.launcher_node = "n-launch";
  s.cwd = "/tmp";
  s.args = {"train", "--model", "m", "--elastic"};
  s.job = job_to_json(o).dump();
  s.job_file = "/tmp/corolla-job-abc";
  s.run = 0x1234567890abcdefULL;
  s.printed = 7;
  s.processes = {{0, 100, "n-0", "tcp://127.0.0.1:1", 12345}, {-1, 101, "n-1", "tcp://127.0.0.1:2", 0}};
  s.ledger = {{"steps_run", 7}, {"replans", nlohmann::json::array()}};
  return s;
}

}  // namespace

TEST_CASE("the launcher's state round-trips as train.successor, and a malformed one is bad_message") {
  const takeover_state s = sample_state("t0k3n");
  const remote_message m = takeover_message(s);
  CHECK(m.type == successor_type);
  auto back = decode_takeover(m);
  REQUIRE(back);
  CHECK(back->token == s.token);
  CHECK(back->launcher == s.launcher);
  CHECK(back->launcher_node == "n-launch");
  CHECK(back->cwd == s.cwd);
  CHECK(back->args == s.args);
  CHECK(back->job == s.job);
  CHECK(back->job_file == "/tmp/corolla-job-abc");
  CHECK(back->run == s.run);
  CHECK(back->printed == 7);
  REQUIRE(back->processes.size() == 2u);
  CHECK(back->processes[1].rank == -1);
  CHECK(back->processes[1].pid == 101);
  CHECK(back->processes[1].node_id == "n-1");
  CHECK(back->processes[0].endpoint == "tcp://127.0.0.1:1");
  CHECK(back->processes[0].started == 12345u);
  CHECK(back->ledger == s.ledger);

  remote_message bad = m;
  bad.body.resize(8);
  CHECK(error_code(decode_takeover(bad).error()) == "bad_message");
  takeover_state no_pid = s;
  no_pid.launcher = 0;
  CHECK(error_code(decode_takeover(takeover_message(no_pid)).error()) == "bad_message");
  takeover_state no_args = s;
  no_args.args.clear();
  CHECK(error_code(decode_takeover(takeover_message(no_args)).error()) == "bad_message");
  // Only an elastic `corolla train` is ever started from a state.
  takeover_state other_command = s;
  other_command.args = {"serve", "--elastic"};
  CHECK(error_code(decode_takeover(takeover_message(other_command)).error()) == "bad_message");
  takeover_state not_elastic = s;
  not_elastic.args = {"train", "--model", "m"};
  CHECK(error_code(decode_takeover(takeover_message(not_elastic)).error()) == "bad_message");
  takeover_state bad_process = s;
  bad_process.processes[0].pid = -5;
  CHECK(error_code(decode_takeover(takeover_message(bad_process)).error()) == "bad_message");
  // The ledger must be a JSON object.
  takeover_state s2 = s;
  s2.ledger = nlohmann::json::array();
  CHECK(error_code(decode_takeover(takeover_message(s2)).error()) == "bad_message");
  CHECK(new_takeover_token().size() == 32u);
  CHECK(new_takeover_token() != new_takeover_token());
}

TEST_CASE("a rank process keeps the launcher's state only from whoever has the job's token, and only a well-formed one") {
  auto rank = node_test::start_node();
  auto peer = node_test::start_node();
  start_successor(*rank, "right-token", ::getpid());
  start_successor(*rank, "other-token", ::getpid());  // once per process: the first one stays
  REQUIRE(peer->connect(rank->endpoint()));
  auto ask = [&](remote_message m) { return peer->request(rank->id(), successor_name, std::move(m), std::chrono::seconds(10)); };

  // Asked for what it keeps: nothing yet; never for another token.
  auto kept = fetch_takeover_state(*peer, rank->id(), "right-token", std::chrono::seconds(10));
  REQUIRE_FALSE(kept);
  CHECK(error_code(kept.error()) == "unknown_actor");

  auto r = ask(takeover_message(sample_state("wrong-token")));
  REQUIRE_FALSE(r);
  CHECK(error_code(r.error()) == "auth_refused");
  r = ask(takeover_message(sample_state("other-token")));
  REQUIRE_FALSE(r);
  CHECK(error_code(r.error()) == "auth_refused");

  remote_message garbage;
  garbage.type = successor_type;
  garbage.body = std::vector<std::uint8_t>(16, 0xff);
  r = ask(garbage);
  REQUIRE_FALSE(r);
  CHECK(error_code(r.error()) == "bad_message");

  remote_message other = takeover_message(sample_state("right-token"));
  other.type = "train.next";
  r = ask(other);
  REQUIRE_FALSE(r);
  CHECK(error_code(r.error()) == "invalid_argument");

  takeover_state unparsable = sample_state("right-token");
  unparsable.job = "{not json";
  r = ask(takeover_message(unparsable));
  REQUIRE_FALSE(r);
  CHECK(error_code(r.error()) == "bad_message");

  // The right token: kept. (Its launcher, pid 4242 in the sample, may not
  // exist; the state lists no live process, so nobody here starts one.)
  takeover_state right = sample_state("right-token");
  right.launcher = ::getpid();
  CHECK(ask(takeover_message(right)));
  kept = fetch_takeover_state(*peer, rank->id(), "right-token", std::chrono::seconds(10));
  REQUIRE(kept);
  CHECK(kept->printed == 7);
  CHECK(kept->launcher == ::getpid());
  kept = fetch_takeover_state(*peer, rank->id(), "wrong-token", std::chrono::seconds(10));
  REQUIRE_FALSE(kept);
  CHECK(error_code(kept.error()) == "auth_refused");
  rank->stop();
  peer->stop();
}

TEST_CASE("processes that are not this one's children: alive until they end, reaped_all waits for them, a zombie is "
          "not alive") {
  CHECK(process_alive(::getpid()));
  CHECK(process_start_time(::getpid()) > 0u);
  CHECK(process_start_time(::getpid()) == process_start_time(::getpid()));
  const takeover_process me{0, ::getpid(), "n", "e", process_start_time(::getpid())};
  CHECK(me.alive());
  CHECK(me.running());
  const takeover_process reused{0, ::getpid(), "n", "e", process_start_time(::getpid()) + 1};
  CHECK_FALSE(reused.alive());  // the same pid, another process
  CHECK_FALSE(process_alive(0));
  CHECK_FALSE(process_alive(-1));

  // A child that ended and is not yet reaped (a zombie) is not alive.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  CHECK(testing::eventually([&] { return !process_alive(child); }, std::chrono::seconds(20), std::chrono::milliseconds(2)));
  std::vector<pid_t> mine{child};
  CHECK(reap_all(mine, std::chrono::seconds(5)));
  CHECK(mine[0] == -1);

  // A grandchild, orphaned: not this process's child.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t middle = ::fork();
  REQUIRE(middle >= 0);
  if (middle == 0) {
    const pid_t g = ::fork();
    if (g == 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      ::signal(SIGTERM, SIG_DFL);  // not the test framework's crash report
      ::pause();
      ::_exit(0);
    }
    (void)!::write(fds[1], &g, sizeof g);
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t orphan = -1;
  REQUIRE(::read(fds[0], &orphan, sizeof orphan) == static_cast<ssize_t>(sizeof orphan));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(middle, &st, 0);
  REQUIRE(orphan > 0);
  CHECK(process_alive(orphan));
  std::vector<pid_t> theirs{orphan};
  CHECK_FALSE(reap_all(theirs, std::chrono::milliseconds(100)));  // alive: not reaped, not forgotten
  CHECK(theirs[0] == orphan);
  terminate_all(theirs, std::chrono::milliseconds(200));  // SIGTERM ends it; nobody here can reap it
  CHECK(theirs[0] == -1);
  CHECK(testing::eventually([&] { return !process_alive(orphan); }, std::chrono::seconds(20), std::chrono::milliseconds(2)));
}
