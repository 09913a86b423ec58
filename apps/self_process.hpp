// apps/self_process.hpp — child processes of this very binary (local rank
// processes of `corolla train`, local `corolla serve` servers of the demo
// and `corolla bench swarm`): started without a shell, killed by the
// kernel if this process dies first, and terminated and reaped together.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace corolla::app {

/// Forks and executes this program's binary with `args` (argv[0] is
/// "corolla"). The child gets SIGKILL when this process dies, unless
/// `die_with_parent` is false (the rank processes of an elastic job whose
/// launcher a survivor may replace: apps/launcher_takeover.hpp). `stdout_fd`
/// (when >= 0) becomes its stdout; `err_path` (when not empty) its stderr,
/// and stdin is then /dev/null. Throws std::runtime_error when it cannot.
pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd = -1, const std::string& err_path = {},
                 bool die_with_parent = true);

/// Starts this program's binary with `args` in `cwd`, detached: not this
/// process's child (a double fork; init or the nearest subreaper reaps it)
/// and not ended with it. stdout, stderr and stdin are this process's.
/// Returns the new process's id; throws std::runtime_error when it cannot.
pid_t spawn_self_detached(const std::vector<std::string>& args, const std::string& cwd);

/// What /proc says of process `pid` of this machine, in one read.
struct process_stat {
  char state = '\0';         ///< 'R', 'S', 'T' (stopped), 'Z' (ended) ...; '\0': no such process
  std::uint64_t started = 0;  ///< clock ticks after boot: with the pid, who a process is (pids are reused)

  /// It exists and has not ended (a zombie has).
  bool alive() const { return state != '\0' && state != 'Z' && state != 'X' && state != 'x'; }
  /// alive(), and not stopped (SIGSTOP, a debugger).
  bool running() const { return alive() && state != 'T' && state != 't'; }
};
process_stat read_process_stat(pid_t pid);

/// A process and its command line, as /proc shows them.
struct process_command {
  pid_t pid = -1;
  std::vector<std::string> args;  ///< argv, argv[0] first
};
/// The processes whose parent is `parent`, from /proc (a process that ends
/// while it is read may still be listed, or be left out).
std::vector<process_command> children_of(pid_t parent);

/// The rank processes of launcher `parent` (rank, pid), from /proc: those
/// of the current grid, and the survivors of an earlier one that still hold
/// their snapshots, with their old rank.
std::vector<std::pair<int, pid_t>> rank_processes_of(pid_t parent);

/// read_process_stat(pid).alive().
bool process_alive(pid_t pid);
/// When process `pid` started (read_process_stat), 0 when it does not exist.
std::uint64_t process_start_time(pid_t pid);

/// From now on SIGINT, SIGTERM and SIGHUP end the processes registered
/// below (SIGKILL) before they end this one as they would have: stopping a
/// launcher stops its job, also when its ranks do not die with it. A
/// signal this process ignores (nohup's SIGHUP) stays ignored.
void end_on_stop_signals();
/// Registers `pid` with end_on_stop_signals (at most 1024 at once).
void end_on_stop_signal(pid_t pid);
/// Unregisters `pid`.
void forget_on_stop_signal(pid_t pid);
/// A stop signal also removes the file at `path` ("" = none; one at a
/// time): a launcher's job file, which holds its job's takeover token.
void remove_on_stop_signal(const std::string& path);
/// A stop signal also removes the directory tree at `path` (at most 8 at
/// once; more are not removed): a scratch directory (apps/scratch_dir.hpp)
/// such as an elastic launcher's private checkpoints, which nobody could
/// resume from once the job is stopped. Ranks the signal kills first could
/// still be inside a write that lands after the removal.
void remove_tree_on_stop_signal(const std::string& path);
/// Unregisters `path` (its owner removes it, or keeps it).
void forget_tree_on_stop_signal(const std::string& path);

/// Reaps the children among `pids` (> 0) that exit within `timeout`,
/// setting each reaped one to -1 (a process that is not this one's child:
/// once it has ended); sends no signal. Returns whether all are gone.
bool reap_all(std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

/// SIGTERM to every pid > 0, SIGKILL to those still running after `grace`;
/// all are reaped and set to -1.
void terminate_all(std::vector<pid_t>& pids, std::chrono::milliseconds grace);

}  // namespace corolla::app
