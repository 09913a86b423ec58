// apps/self_process.hpp's stop-signal handler, in a forked child that the
// signal really ends: it kills the registered processes, removes the
// registered file and directory tree, and the process still ends by the
// signal (its parent sees -SIGTERM, as a shell would).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "apps/self_process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

/// Ends `pid` (a child of this process) and returns its wait status.
int reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

TEST_CASE("stop signals: SIGTERM kills the registered processes, removes the file and the whole tree, and still ends "
          "the process by the signal") {
  testing::temp_dir_guard tmp("stop-signals");
  const fs::path tree = tmp.path() / "corolla-elastic-test";
  const fs::path file = tmp.path() / "job.json";
  // A tree as a job leaves it: nested steps, shards, an empty folder, a
  // symlink out of it (removed, not followed).
  const fs::path outside = tmp.path() / "outside.txt";
  std::ofstream(outside) << "stays";
  for (int step = 1; step <= 40; ++step) {
    const fs::path d = tree / ("step-" + std::to_string(step)) / "shards";
    fs::create_directories(d);
    for (int r = 0; r < 4; ++r) std::ofstream(d / ("rank-" + std::to_string(r) + ".safetensors")) << std::string(100, 'x');
  }
  fs::create_directories(tree / "empty" / "deeper");
  fs::create_symlink(outside, tree / "link");
  std::ofstream(file) << "{}";

  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A process the signal must take down with it (a rank).
    const pid_t rank = ::fork();
    if (rank == 0) {
      ::pause();
      ::_exit(0);
    }
    app::end_on_stop_signals();
    app::end_on_stop_signal(rank);
    app::remove_on_stop_signal(file.string());
    app::remove_tree_on_stop_signal(tree.string());
    const ssize_t wrote = ::write(pipe_fds[1], &rank, sizeof rank);
    (void)wrote;
    for (;;) ::pause();
  }
  ::close(pipe_fds[1]);
  pid_t rank = -1;
  REQUIRE(::read(pipe_fds[0], &rank, sizeof rank) == static_cast<ssize_t>(sizeof rank));
  ::close(pipe_fds[0]);
  REQUIRE(::kill(child, SIGTERM) == 0);
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK_FALSE(fs::exists(tree));
  CHECK_FALSE(fs::exists(file));
  CHECK(fs::exists(outside));  // the symlink went, not what it pointed to
  // The rank was killed (it is the child's child: gone, or a zombie reaped by init).
  bool gone = false;
  for (int i = 0; i < 400 && !gone; ++i) {
    gone = !app::process_alive(rank);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(gone);
}

TEST_CASE("stop signals: unregistering the tree keeps it") {
  testing::temp_dir_guard tmp("stop-signals-keep");
  const fs::path tree = tmp.path() / "kept";
  fs::create_directories(tree / "a");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    app::end_on_stop_signals();
    app::remove_tree_on_stop_signal(tree.string());
    app::remove_tree_on_stop_signal({});
    ::raise(SIGTERM);
    ::_exit(0);
  }
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
  CHECK(fs::exists(tree / "a"));
}
