// actors/train_comm.hpp — how the ranks of a training job talk: a mailbox
// actor that files incoming messages by key until the runtime takes them, a
// rank's sends to other ranks' mailboxes, and the ring collectives
// (reduce-scatter, all-gather) over those links.
//
// Every training message is a one-way send to the mailbox actor published
// as "train" on the receiving rank's node (the coordinator's is
// "train-coord"). The mailbox files it under (type, step, index, hop)
// (train_key); the stage and DP-group actors block on inbox::take for the
// exact message they need next, so arrival order never matters. A peer
// reported down, or an abort from the coordinator, fails the inbox: every
// waiting and later take throws train_error naming the rank that died.
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
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/train_wire.hpp"
#include "kernels/device_group.hpp"
#include "kernels/tensor.hpp"

namespace corolla {

class node;

/// A training job failed: a rank died, the coordinator aborted, a message
/// did not come in time, or one was malformed.
class train_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

/// Messages received and not yet taken, by key. Thread-safe.
class train_inbox {
 public:
  /// Files `m` under `key` (several messages may share a key: FIFO).
  void put(const std::string& key, remote_message m);
  /// The oldest message filed under `key`, waiting up to `timeout`.
  /// Throws train_error when the inbox has failed (the reason) or at the
  /// timeout (naming `what` is being waited for).
  remote_message take(const std::string& key, std::chrono::milliseconds timeout, const std::string& what);
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
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<remote_message>> filed_;
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

/// One rank's view of the job's links: where every other rank's mailbox is.
/// Thread-safe (the stage and the DP-group actor send concurrently).
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
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Sends `t` (may be undefined: no tensor) to rank `to` as message `type`.
  void send(int to, const char* type, const train_packet& p, const Tensor& t);
  /// Sends a body to the coordinator's mailbox.
  void send_coordinator(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {});
  /// The tensor of message `type` for (step, index, hop), checked to hold
  /// `numel` f32 values. Throws train_error (what = for the message).
  Tensor receive(const char* type, std::int64_t step, int index, int hop, std::int64_t numel, const std::string& what);

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

/// The members of one ring and this rank's position in it.
struct ring {
  std::vector<int> ranks;  ///< in ring order
  int position = 0;        ///< index of this rank in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
  int next() const { return ranks[static_cast<std::size_t>((position + 1) % size())]; }
  int prev() const { return ranks[static_cast<std::size_t>((position + size() - 1) % size())]; }
};

/// Elements [begin, end) of chunk `c` when `n` elements are split into `g`
/// balanced chunks.
std::pair<std::int64_t, std::int64_t> chunk_range(std::int64_t n, int g, int c);
/// The chunk a ring member owns after ring_reduce_scatter: (position + 1) mod g.
int owned_chunk(const ring& r);

/// Ring reduce-scatter of `flat` (f32 [n], host) summed over the ring: g-1
/// hops, each sending one chunk to the next member and adding the one
/// received from the previous. Afterwards chunk owned_chunk(r) of `flat`
/// holds the sum over all members; the other chunks hold partial sums.
/// `bucket` and `step` key the messages (one reduction per bucket and step).
void ring_reduce_scatter(train_comm& comm, const ring& r, Tensor& flat, std::int64_t step, int bucket);
/// Ring all-gather: afterwards every chunk of `flat` holds the value its
/// owner (owned_chunk) had.
void ring_all_gather(train_comm& comm, const ring& r, Tensor& flat, std::int64_t step, int bucket);

// Device collectives over a bucket (kernels/device_group.hpp), with the
// ring's shards: member p of `r` ends up owning chunk owned_chunk(r) as in
// ring_reduce_scatter, so checkpoints are the same under both. NCCL's
// reduce-scatter takes equal chunks, so the bucket goes through a padded
// layout in `scratch` (on the device, at least size * pad values): the
// group's member p has slot p, `pad` values, holding the chunk p owns.
// Both are queued on `on` (a backend of the member's device) and return at
// once; the caller orders them after the gradients' producer and waits
// (device_group::synchronize) before reading the results on another queue.

/// Values per member in the padded layout of `n` values over `g` members:
/// the longest chunk.
std::int64_t device_chunk_pad(std::int64_t n, int g);
/// `flat` (this member's gradients, n values, device) summed over the group;
/// the sum of the member's owned chunk lands in shard[0, its length).
/// `shard`: pad values on the device.
void device_reduce_scatter(device_group& group, Backend& on, const ring& r, const Tensor& flat, Tensor& scratch,
                           Tensor& shard);
/// Every member's owned chunk, read from `flat` (n values, device) where
/// its owner updated it, into every member's `flat`. `shard` is overwritten.
void device_all_gather(device_group& group, Backend& on, const ring& r, Tensor& flat, Tensor& scratch, Tensor& shard);

}  // namespace corolla
