// actors/train_comm.hpp — how the ranks of a training job talk: a mailbox
// actor that files incoming messages by key until the runtime takes them, a
// rank's sends to other ranks' mailboxes, and the channel the ring
// collectives (net/collectives.hpp) run over between those mailboxes.
//
// Every training message is a one-way send to the mailbox actor published
// as "train" on the receiving rank's node (the coordinator's is
// "train-coord"). The mailbox files it under (type, step, index, hop)
// (train_key); the actors ask the inbox for the exact message they need
// next, so arrival order never matters. A rank's stage and DP-group actors
// and the coordinator never block: they ask with await() and the message
// reaches them as an actor message once filed (actors/inbox_waiter.hpp).
// A rank's join still blocks on take(). A peer reported down, or an abort
// from the coordinator, fails the inbox: every waiting and later take throws train_error naming
// the rank that died, and every await is answered with the reason.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/train_wire.hpp"
#include "kernels/tensor.hpp"
#include "net/collectives.hpp"
#include "schedule/wait_graph.hpp"

namespace corolla {

class node;

/// A training job failed: a rank died, the coordinator aborted, a message
/// did not come in time, or one was malformed.
class train_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A job that stopped making progress while its processes are up: the
/// coordinator's stall check (schedule/wait_graph.hpp). `blamed`: the
/// ranks at fault (silent or frozen ones); empty for a deadlock, a cycle
/// of waits that a lost message leaves and no rank caused.
class train_stall : public train_error {
 public:
  train_stall(const std::string& reason, std::vector<int> blamed) : train_error(reason), blamed_(std::move(blamed)) {}
  const std::vector<int>& blamed() const { return blamed_; }

 private:
  std::vector<int> blamed_;
};

/// "train.act/<job>/3/1/0": the key a message is filed under. `job` is the
/// run's id from the roster (0 for join and roster), so a message of
/// another run (a rank of an earlier job reconnecting to a reused port) is
/// filed where nothing ever looks.
std::string train_key(const std::string& type, std::uint64_t job, std::int64_t step, int index, int hop = 0);

/// Whether a failure reason only says that a peer left (its goodbye, or a
/// launcher's "exited (exit status N)"): usually the echo of another
/// failure whose own, more specific reason may come a moment later.
bool is_vague_failure(const std::string& reason);

/// An await()'s answers: (inbox_delivery_atom, token, remote_message) once
/// the message is filed, or (inbox_failure_atom, token, reason) when the
/// inbox fails first.
using inbox_delivery_atom = caf::atom_constant<caf::atom("tindeliv")>;
using inbox_failure_atom = caf::atom_constant<caf::atom("tinfail")>;

/// Messages received and not yet taken, by key. Thread-safe. It also
/// knows what its takers wait for right now (waits()), for the
/// coordinator's question when a job stops making progress
/// (schedule/wait_graph.hpp).
class train_inbox {
 public:
  /// Files `m` under `key` (several messages may share a key: FIFO),
  /// unless a lose() order drops it.
  void put(const std::string& key, remote_message m);
  /// The oldest message filed under `key`, waiting up to `timeout`.
  /// Throws train_error when the inbox has failed (the reason) or at the
  /// timeout (naming `what` is being waited for). `from`: the rank it
  /// comes from (schedule::from_coordinator, from_unknown).
  remote_message take(const std::string& key, std::chrono::milliseconds timeout, const std::string& what,
                      int from = schedule::from_unknown);
  /// As take, but nothing (instead of an error) at the timeout.
  std::optional<remote_message> try_take(const std::string& key, std::chrono::milliseconds timeout,
                                         const std::string& what, int from = schedule::from_unknown);
  /// The non-blocking take, for an actor: the oldest message filed under
  /// `key` at once if there is one; otherwise nothing, and the message is
  /// sent to `who` as (inbox_delivery_atom, `token`, message) when it is
  /// filed (or the failure as (inbox_failure_atom, `token`, reason)). The
  /// wait counts in waits() until then. Throws train_error when the inbox
  /// has failed already. `token` is the caller's, unique among its awaits.
  std::optional<remote_message> await(const std::string& key, const std::string& what, int from, caf::actor who,
                                      std::uint64_t token);
  /// Gives up `who`'s await `token` (its deadline passed): true when it was
  /// still waiting; false when its answer was sent already (it is on its
  /// way to the actor) or there was no such await.
  bool cancel(const caf::actor& who, std::uint64_t token);
  /// What takers wait for now, with how long they have waited.
  std::vector<schedule::party_wait> waits() const;
  /// Messages taken so far.
  std::uint64_t taken() const;
  /// Rank `rank`'s answer to the coordinator's train.waits? for run `job`
  /// (its waits, messages taken as progress), or errc::auth_refused for
  /// another run's (or before the roster).
  caf::expected<schedule::rank_activity> activity(int rank, std::uint64_t job) const;
  /// faultlab's lose: the next `count` messages of `type` that reach this
  /// inbox are dropped, as if lost on the way.
  void lose(const std::string& type, int count);
  /// Fails the inbox with `reason`. The first reason is kept, except that a
  /// peer's goodbye or a plain "exited (exit status N)" gives way to a later,
  /// more specific reason. Ignored once closing() was called.
  void fail(const std::string& reason);
  /// The failure reason, if any.
  std::optional<std::string> failure() const;
  /// From now on peer failures are expected (the job is over).
  void close();
  /// This rank's work is done: other ranks may leave now, only `keep`
  /// (the coordinator, which has yet to say the job is over) still matters.
  void drain(const std::string& keep);
  /// A peer went down: fails the inbox, naming it, unless the peer is not
  /// part of the job, the job is over, or it may leave (drain).
  void peer_down(const std::string& node_id, const std::string& reason);
  bool closing() const;
  /// How peer `node_id` is named in failure messages ("rank 3 (stage 1, replica 1)").
  void name_peer(const std::string& node_id, std::string label);
  /// The run's id once known (the coordinator's own, a rank's from its
  /// roster): aborts of another run are ignored. 0 = not known yet.
  void set_job(std::uint64_t job);
  std::uint64_t job() const;
  /// Node ids of every named peer.
  std::vector<std::string> named_peers() const;
  /// Whether `node_id` was named (name_peer): it is part of the job.
  bool named(const std::string& node_id) const;
  /// The label of `node_id`, or "node <id>" when it has none.
  std::string label_of(const std::string& node_id) const;

 private:
  struct pending_take {
    std::string what;
    int from;
    std::chrono::steady_clock::time_point since;
  };

  /// The oldest message filed under `key`, taken (mu_ held).
  std::optional<remote_message> take_filed(const std::string& key);

  /// An await() not answered yet.
  struct parked_take {
    std::string key;
    caf::actor who;
    std::uint64_t token = 0;
    std::uint64_t id = 0;  ///< its entry in waiting_
  };

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<parked_take> parked_;  ///< oldest first
  std::map<std::string, std::deque<remote_message>> filed_;
  std::map<std::uint64_t, pending_take> waiting_;  ///< by take number
  std::uint64_t takes_ = 0, taken_ = 0;
  std::map<std::string, int> to_lose_;  ///< by message type
  std::map<std::string, std::string> labels_;
  std::optional<std::string> failure_;
  bool closing_ = false;
  std::optional<std::string> draining_keep_;
  std::uint64_t job_ = 0;
};

/// Spawns the mailbox actor over `inbox`, publishes it on `n` as `name`, and
/// subscribes it to every peer's failures: a named peer (name_peer) going
/// down fails the inbox; others are ignored. Malformed or unknown messages
/// are logged and dropped; train.abort fails the inbox with its reason.
/// With `joins_only_from_strangers` (the coordinator's mailbox), a message
/// other than train.join from a node not named yet is dropped: a rank of an
/// earlier job that reconnects to a reused port cannot slip its reports
/// into this one. (Ranks cannot be that strict: a neighbour's first
/// activations may arrive before the roster that names it.)
caf::expected<caf::actor> start_train_mailbox(node& n, std::shared_ptr<train_inbox> inbox, const std::string& name,
                                              bool joins_only_from_strangers = false);

/// One rank's view of the job's links: where every other rank's mailbox is,
/// and how its data-parallel rings' chunks (net/collectives.hpp, ring_pass)
/// are sent and filed. Thread-safe (the stage and the DP-group actor send
/// concurrently).
class train_comm {
 public:
  /// `peers[r]` = node id of rank r. `timeout` bounds every wait.
  train_comm(node& n, std::shared_ptr<train_inbox> inbox, int rank, std::vector<std::string> peers,
             std::string coordinator_node, std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  /// The run's id (from the roster): stamped on every packet sent, and part
  /// of every key received.
  std::uint64_t job() const { return job_; }
  void set_job(std::uint64_t job) { job_ = job; }
  train_inbox& inbox() { return *inbox_; }
  /// Node id of rank `r` (from the roster).
  const std::string& peer_id(int r) const { return peers_.at(static_cast<std::size_t>(r)); }
  /// The coordinator's node id.
  const std::string& coordinator() const { return coordinator_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Sends `t` (may be undefined: no tensor) to rank `to` as message `type`.
  void send(int to, const char* type, const train_packet& p, const Tensor& t);
  /// The actor published as `name` on rank `to`'s node (looked up each
  /// call: callers keep it). Throws train_error when it cannot be reached.
  caf::actor actor_of(int to, const std::string& name);
  /// Sends a body to the coordinator's mailbox.
  void send_coordinator(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {});
  /// The key message `type` for (step, index, hop) of this run is filed under.
  std::string key(const char* type, std::int64_t step, int index, int hop = 0) const {
    return train_key(type, job_, step, index, hop);
  }
  /// The one tensor of `m`, checked to hold `numel` f32 values. Throws
  /// train_error (what = for the message).
  static Tensor tensor_of(const remote_message& m, std::int64_t numel, const std::string& what);

  /// A ring chunk as train.rs / train.ag to rank `to`'s mailbox.
  void send_chunk(int to, ring_phase phase, std::int64_t step, int bucket, int hop, Tensor chunk);
  /// The key the ring chunk of (phase, step, bucket, hop) is filed under.
  std::string chunk_key(ring_phase phase, std::int64_t step, int bucket, int hop) const;
  /// "gradient chunk of bucket 3 (hop 1) from rank 2": the chunk in
  /// errors and waits().
  static std::string chunk_what(ring_phase phase, int bucket, int hop, int from);

 private:
  caf::actor mailbox_of(int rank);

  node* node_;
  std::shared_ptr<train_inbox> inbox_;
  int rank_;
  std::vector<std::string> peers_;
  std::string coordinator_;
  std::mutex mu_;  ///< guards the proxies, filled on first use from either actor's thread
  std::vector<caf::actor> proxies_;
  caf::actor coordinator_proxy_;
  std::chrono::milliseconds timeout_;
  std::uint64_t job_ = 0;
};

}  // namespace corolla
