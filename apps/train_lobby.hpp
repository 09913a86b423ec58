// apps/train_lobby.hpp — workers joining a running elastic job.
//
// `corolla train --pp P --dp D --elastic` listens for offers on a node of
// its own (the lobby, `--join-listen`, printed at start). A worker joins with
// `corolla train --join ENDPOINT`: it connects, publishes "train-joiner",
// sends "train.offer" to the lobby's "train-lobby" actor and waits. At every
// `--join-check-every` step the launcher asks the lobby for its pool; when a
// grid with the pooled workers fits (schedule::regrid) and is larger than
// the running one, the job drains at that step boundary (a checkpoint, or
// the in-memory snapshots' step) and continues on the larger grid, whose
// highest ranks are the workers: each gets "train.assign" with the command
// line of its rank and the job description, and runs it as a child process
// (so a rank that dies leaves the worker in the pool). When the job ends,
// every pooled worker gets "train.release" and exits. A worker whose
// connection drops leaves the pool; a rank of a worker that dies is lost
// like any other (the job re-plans without it).
//
// A worker runs the command line its launcher sends: join only a launcher
// you trust. The model and data paths are the launcher's: a worker on
// another machine must see them at the same paths. Its ranks listen on the
// host of its --listen, the launcher's coordinator and ranks on the host of
// --join-listen (launcher_listen). Joining a --cluster job as a machine the
// file lacks, a worker describes itself (--join-machine, TrainOffer.machine;
// schedule::cluster_members adds it to the file).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "schedule/membership.hpp"

namespace corolla {
class node;
}

namespace corolla::app {

struct train_args;

/// One pooled worker: its node and the name it offers to run as.
using lobby_worker = schedule::machine_offer;

/// The launcher's side: the lobby node and its actor.
class train_lobby {
 public:
  /// Starts a node listening on `endpoint` with the "train-lobby" actor.
  /// Throws std::runtime_error when it cannot.
  explicit train_lobby(const std::string& endpoint);
  ~train_lobby();
  train_lobby(const train_lobby&) = delete;
  train_lobby& operator=(const train_lobby&) = delete;

  /// Where workers join ("tcp://127.0.0.1:PORT").
  std::string endpoint() const;
  /// The lobby actor (answers sched_msg::pool_atom: the elastic
  /// scheduler asks it at each verdict).
  caf::actor actor() const { return actor_; }
  /// The workers that offered themselves and are still connected, in the
  /// order they came. Throws std::runtime_error when the lobby does not answer.
  std::vector<lobby_worker> pool();
  /// Tells worker `node_id` to run `corolla <args>` with `job_json` as its
  /// job file. Throws std::runtime_error when it cannot be reached.
  void assign(const std::string& node_id, const std::vector<std::string>& args, const std::string& job_json);
  /// Tells every pooled worker that the job is over (also done when the
  /// lobby goes).
  void release_all();

 private:
  std::unique_ptr<node> node_;
  caf::actor actor_;
};

/// Where an elastic launcher's coordinator and local ranks listen:
/// "tcp://HOST:0" on the host of --join-listen (the address the other
/// machines reach this one at), else on 127.0.0.1. Throws
/// std::invalid_argument for a wildcard host (0.0.0.0, *), which names no
/// address for others to connect to.
std::string launcher_listen(const train_args& a);

/// Whether `host` is this machine's loopback (127.0.0.0/8, localhost, ::1):
/// a job whose lobby listens there has all its ranks on this machine.
bool is_loopback_host(const std::string& host);

/// `corolla train --join ENDPOINT`: offers this process to the launcher
/// there and runs the ranks it is given until released. Returns the exit
/// status (1, with a message, when the launcher goes away first).
int run_train_join(const train_args& a);

}  // namespace corolla::app
