// apps/launcher_takeover.hpp — an elastic job that outlives its launcher.
//
// The local elastic launcher runs the coordinator and the scheduler; its
// rank processes hold the job's state (their in-memory snapshots). What
// the launcher alone knows is small: its command line, the running grid
// (job description, run id, which process runs which rank, which hold the
// grid before's snapshots), the last step printed and the re-plans so far.
// It keeps that replicated in every rank process ("train.successor",
// wire::TrainTakeover): at each grid's roster and before each step is
// printed, the first running process acknowledging (so a step it prints
// is one a successor knows was printed), the others told one-way.
//
//   launcher -> "train-successor" on each rank process   train.successor -> empty
//   new launcher -> "train-successor"                     train.successor? -> train.successor
//
// Each rank process runs the successor actor (start_successor). When the
// launcher's process has ended (this machine's /proc: the launcher and its
// ranks share one), the first of the state's processes still alive and
// not stopped (and not a reused pid) starts a new launcher, detached, with
// the old one's command line and `--take-over FILE` (the state), once per
// dead launcher on this machine (an exclusive lock file). The new launcher
// asks every survivor for the state it keeps and carries on from the
// newest (the one with the most steps printed), tells them all at once
// that it is their launcher now, lists what they hold, takes
// the lost launcher as a failure that lost no rank (and any rank that died
// with it as lost), and carries the job on in the same processes from the
// newest step held. Steps printed are not printed again; the new launcher
// writes to the same stdout and stderr (inherited through the process that
// started it). A process whose launcher is gone ends itself: at once when
// it never had a state (no launcher could find it), else when no new
// launcher tells it within a minute (while the one it started itself is
// alive, it waits).
//
// Only messages carrying the job's takeover token (dist_train_options,
// in the ranks' private job file) are taken. A launcher stopped on purpose
// (SIGINT, SIGTERM, SIGHUP) ends its ranks first (end_on_stop_signals):
// stopping a job still stops it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/messages.hpp"

namespace corolla {
class node;
}

namespace corolla::app {

inline constexpr const char* successor_type = "train.successor";
inline constexpr const char* successor_name = "train-successor";

/// A process of the job: a rank of the running grid (rank >= 0), or one
/// holding the grid before's snapshots (rank -1).
struct takeover_process {
  int rank = -1;
  pid_t pid = 0;
  std::string node_id;
  std::string endpoint;
  std::uint64_t started = 0;  ///< process_start_time (0: unknown)

  /// The process this names is alive (not a reused pid).
  bool alive() const;
  /// alive(), and not stopped.
  bool running() const;
};

/// What a new launcher needs to carry the job on.
struct takeover_state {
  std::string token;
  pid_t launcher = 0;
  std::string launcher_node;  ///< its node id (a link to it going down: look at once)
  std::string cwd;
  std::vector<std::string> args;  ///< the launcher's command line, without argv[0]
  std::string job;                ///< the running grid's job description, JSON
  std::string job_file;           ///< where the launcher wrote it for the ranks (removed by a new launcher)
  std::uint64_t run = 0;          ///< the running grid's run id
  int printed = 0;                ///< the last step printed
  std::vector<takeover_process> processes;
  /// {"replans": [...], "steps_run": N, "last_loss": x, "started": unix
  /// seconds, "deadlocks": N, with --cluster "present": [worker names]}
  nlohmann::json ledger = nlohmann::json::object();
};

remote_message takeover_message(const takeover_state& s);
/// bad_message for a malformed one (also a command line that is not an
/// elastic `train`).
caf::expected<takeover_state> decode_takeover(const remote_message& m);

/// A launcher taking over asks the process on node `node_id` (connected)
/// for the newest state it keeps.
caf::expected<takeover_state> fetch_takeover_state(node& n, const std::string& node_id, const std::string& token,
                                                   std::chrono::milliseconds timeout);

/// Of `t` (a successor's state) and the states its live processes keep
/// (asked over `n`), the one with the most steps printed for the same dead
/// launcher.
takeover_state newest_takeover_state(node& n, takeover_state t);

/// The lock file that lets one process per dead launcher `launcher` start
/// a new one (the new launcher removes it once its first grid has a step).
std::string takeover_lock_path(const std::string& token, pid_t launcher);

/// A new random token (128 bits, hex).
std::string new_takeover_token();

/// The launcher's side: keeps its state replicated in the job's processes.
class launcher_replicas {
 public:
  /// This process's id, working directory and command line (less any
  /// --take-over FILE) go into the state.
  explicit launcher_replicas(std::string token);

  /// The grid now running, on the launcher's node `n` (null: none; valid
  /// until the next call), and sends the state to `processes`. Not
  /// `armed` (a grid with a rank on another machine, which a launcher
  /// here could not take over): the state lists no process, so none takes
  /// over (each ends a minute after the launcher).
  void grid(node* n, std::vector<takeover_process> processes, std::string job, std::uint64_t run, bool armed = true,
            std::string job_file = {});
  /// Before step `printed` is printed: sends the state with it and `ledger`
  /// (see takeover_state); returns once the first running process took it
  /// (at most 1 s each). Not to a grid that is not armed.
  void publish(int printed, nlohmann::json ledger);

 private:
  void send_locked();
  std::mutex mutex_;
  takeover_state state_;
  std::vector<takeover_process> recipients_;
  node* node_ = nullptr;
  bool warned_ = false;
};

/// A rank process's side: the successor actor on `n`, published as
/// "train-successor", taking states with `token` and watching launcher
/// `launcher` until a state names another (once per process; later calls
/// do nothing).
void start_successor(node& n, const std::string& token, pid_t launcher);

/// The state a successor wrote for `corolla train ... --take-over FILE`
/// (the file is removed). Throws model_error for a missing or unreadable
/// file, std::invalid_argument for a malformed one.
takeover_state read_takeover_file(const std::string& path);

}  // namespace corolla::app
