// apps/self_process.hpp's stop-signal handler, in a forked child that the
// signal really ends: it kills the registered processes, removes the
// registered file and directory tree, and the process still ends by the
// signal (its parent sees -SIGTERM, as a shell would).
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "apps/scratch_dir.hpp"
#include "apps/self_process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

/// The wait status of child `pid` once it ends, at most 30 s from now;
/// past that it is killed (and the check on its status fails, not hangs).
int reap(pid_t pid) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL_CHECK("the child did not end within 30 s");
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

/// Reads a pid from `fd`, waiting at most 30 s (-1 past that or at EOF).
pid_t read_pid(int fd) {
  pollfd p{fd, POLLIN, 0};
  pid_t pid = -1;
  if (::poll(&p, 1, 30000) != 1 || ::read(fd, &pid, sizeof pid) != static_cast<ssize_t>(sizeof pid)) return -1;
  return pid;
}

}  // namespace

TEST_CASE("stop signals: SIGTERM kills the registered processes, removes the file and the whole tree, and still ends "
          "the process by the signal") {
  testing::temp_dir_guard tmp("stop-signals");
  const fs::path tree = tmp.path() / "corolla-elastic-test";
  const fs::path file = tmp.path() / "job.json";
  // A tree as a job leaves it: nested steps, shards, an empty folder, a
  // symlink out of it to a folder with a file (removed, not followed).
  const fs::path outside = tmp.path() / "outside";
  fs::create_directories(outside);
  std::ofstream(outside / "file.txt") << "stays";
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
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      ::pause();
      ::_exit(0);
    }
    ::close(pipe_fds[0]);
    app::end_on_stop_signals();
    app::end_on_stop_signal(rank);
    app::remove_on_stop_signal(file.string());
    app::remove_tree_on_stop_signal(tree.string());
    const ssize_t wrote = ::write(pipe_fds[1], &rank, sizeof rank);
    (void)wrote;
    for (;;) ::pause();
  }
  ::close(pipe_fds[1]);
  const pid_t rank = read_pid(pipe_fds[0]);
  ::close(pipe_fds[0]);
  if (rank <= 0) ::kill(child, SIGKILL);
  REQUIRE(rank > 0);
  REQUIRE(::kill(child, SIGTERM) == 0);
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  CHECK_FALSE(fs::exists(tree));
  CHECK_FALSE(fs::exists(file));
  CHECK(fs::exists(outside / "file.txt"));  // the symlink went, not what it pointed to
  // The rank was killed (it is the child's child: gone, or a zombie reaped by init).
  bool gone = false;
  for (int i = 0; i < 400 && !gone; ++i) {
    gone = !app::process_alive(rank);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(gone);
}

TEST_CASE("stop signals: a tree unregistered is kept, another registered still goes") {
  testing::temp_dir_guard tmp("stop-signals-keep");
  const fs::path tree = tmp.path() / "kept";
  fs::create_directories(tree / "a");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    app::end_on_stop_signals();
    const fs::path other = tree.parent_path() / "gone";
    fs::create_directories(other);
    app::remove_tree_on_stop_signal(tree.string());
    app::remove_tree_on_stop_signal(other.string());
    app::forget_tree_on_stop_signal(tree.string());
    ::raise(SIGTERM);
    ::_exit(0);
  }
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
  CHECK(fs::exists(tree / "a"));
  CHECK_FALSE(fs::exists(tmp.path() / "gone"));
}

TEST_CASE("stop signals: a scratch directory (a bench's model, a launcher's checkpoints) goes on SIGINT too") {
  testing::temp_dir_guard tmp("stop-signals-scratch");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::setenv("TMPDIR", tmp.path().c_str(), 1);
    const app::scratch_dir scratch("corolla-bench-test");
    fs::create_directories(scratch.path() / "model");
    std::ofstream(scratch.path() / "model" / "model.safetensors") << std::string(4096, 'w');
    ::raise(SIGINT);
    ::_exit(0);  // not reached
  }
  const int status = reap(child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  CHECK(fs::is_empty(tmp.path()));
}
