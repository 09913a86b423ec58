// actors/dp_group.hpp — the data-parallel side of one training rank: the
// DP-group actor, which owns the rank's gradient buckets (one per block,
// one for the head), their optimizer state and their collectives.
//
// The stage actor hands each bucket over in a message the moment the
// step's last backward is done with it (reduce), and the DP-group actor
// answers when it is reduced (reduced). From then on only the DP-group
// actor touches the bucket's gradients, moments and shard until the stage
// sends the next step's work: the stage zeroes the gradients and runs its
// forward only after every bucket of the step was answered. Everything the
// stage needs from the buckets is a request: the squared norm of the
// reduced shards (for clipping and loss scaling), the update with the
// coordinator's coefficient, a checkpoint shard, the final parameters.
// Failures come back as values (an error string, empty when fine); a failed
// reduction also fails the rank's inbox so the stage's next wait throws.
//
// Protocol (handled in order on one detached actor; the reductions and
// updates of buckets reduced by host rings run side by side, up to
// --rings-at-once):
//   stage -> dp   reduce_atom, slot, step, adam_step, grads_ready
//   dp -> stage   reduced_atom, slot, error, side_by_side (reductions
//                 running when it started, itself included)
//   stage -> dp   request norm_atom, step                 -> double
//   stage -> dp   request update_atom, step, adam_step, coef
//                                               -> error, side_by_side
//                 (one job per bucket; those over host rings side by side;
//                 side_by_side: the most that ran at once, as reduced_atom's)
//   stage -> dp   request save_atom, step                 -> error
//   stage -> dp   request publish_atom, steps, bucket id, ask, lo, hi
//                                               -> error
//                 (--save: values [lo, hi) of one bucket, as the
//                 coordinator asks for them)
//   stage -> dp   request snapshot_atom, step, loss_scale -> error
// Without clipping and loss scaling (no global norm), reduce also updates
// the bucket's shard and all-gathers it, so the update overlaps the rest of
// the backward.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>

#include "actors/train_watchdog.hpp"
#include "kernels/backend.hpp"
#include "kernels/device_group.hpp"
#include "model/params.hpp"
#include "net/collectives.hpp"

namespace corolla {

class node;
class train_comm;
class train_inbox;
class state_shards;
struct dist_train_options;

namespace dp_msg {
using reduce_atom = caf::atom_constant<caf::atom("dpreduce")>;
using reduced_atom = caf::atom_constant<caf::atom("dpreduced")>;
using norm_atom = caf::atom_constant<caf::atom("dpnorm")>;
using update_atom = caf::atom_constant<caf::atom("dpupdate")>;
using save_atom = caf::atom_constant<caf::atom("dpsave")>;
using publish_atom = caf::atom_constant<caf::atom("dppublish")>;
using snapshot_atom = caf::atom_constant<caf::atom("dpsnap")>;
}  // namespace dp_msg

/// A flat parameter buffer reduced and updated as one unit: a block, or the head.
struct grad_bucket {
  int id = 0;  ///< block index, or head_bucket
  param_set* params = nullptr;
  param_set* grads = nullptr;
  const ring* group = nullptr;
  std::int64_t lo = 0, hi = 0;  ///< the shard this rank owns
  /// With a device backend: the parameters, gradients and AdamW moments
  /// live on the device, and the update runs there.
  bool device = false;
  Tensor m, v;  ///< AdamW moments of the shard (on the device with `device`)
  /// With a device backend and a DP group of more than one: host copies of
  /// the flat parameters and gradients, which the group's collectives work
  /// on (they run over the actor runtime, in host memory). The gradients
  /// come down, are reduce-scattered, this rank's reduced shard goes up and
  /// is updated on the device, the updated shard comes back down, is
  /// all-gathered, and the other shards go up. Undefined otherwise.
  Tensor host_params, host_grads;
  /// With a device backend: the compute queue's point after the bucket's
  /// last backward of the step, recorded by the stage as it hands the
  /// bucket over (in the reduce message); the download (or the update)
  /// waits for it and nothing later.
  std::shared_ptr<queue_marker> grads_ready;
  /// With device collectives (--collectives device, a group of more than
  /// one): the group, and this rank's chunk of the reduce-scatter on the
  /// device, as long as the longest shard: first the reduced gradient shard
  /// (its first hi - lo values), then the updated parameter shard the
  /// all-gather sends. Null / undefined otherwise.
  device_group* coll = nullptr;
  Tensor shard;

  bool staged() const { return host_params.defined(); }
  /// What the collectives and the optimiser work on.
  Tensor& comm_params() { return staged() ? host_params : params->flat(); }
  Tensor& comm_grads() { return staged() ? host_grads : grads->flat(); }
  const Tensor& comm_params() const { return staged() ? host_params : params->flat(); }
};

/// What a DP-group handler has left to do: with `pass`, run that ring
/// collective to its end (its chunks keyed by `step` and `bucket`), then
/// `then`, which returns what is left after that; without, it is done.
/// Whatever throws ends the handler with that error.
struct dp_step {
  std::optional<ring_pass> pass;
  std::int64_t step = 0;
  int bucket = 0;
  std::function<dp_step()> then;
};

/// What the DP group works with; every pointer outlives the actor.
struct dp_group_setup {
  const dist_train_options* options = nullptr;
  int rank = 0;
  std::string label;          ///< the rank's label, for errors
  bool keeps_block_params = false;  ///< replica 0: writes its blocks' parameters (checkpoints, --save)
  bool keeps_head_params = false;   ///< rank 0: writes the head's
  /// Updates wait for the coordinator's global norm (clipping, or learning
  /// whether a loss-scaled backward overflowed anywhere).
  bool global_norm = false;
  Backend* compute = nullptr;  ///< the stage's backend (where parameters and gradients live)
  /// Where the DP group's arithmetic runs: the compute backend's companion
  /// on a device (its own queue), else the compute backend itself.
  Backend* math = nullptr;
  train_comm* comm = nullptr;
  std::shared_ptr<train_inbox> inbox;
  /// In-memory snapshots (actors/train_snapshots.hpp): this rank's keeper,
  /// the buddy rank that keeps a copy (-1: none), and whether that copy
  /// carries the parameters.
  caf::actor keeper;
  int buddy = -1;
  bool buddy_params = false;
};

/// The buckets of one rank and everything done to them. Built and restored
/// by the rank before the actor starts; then only the actor uses it.
class dp_group {
 public:
  explicit dp_group(dp_group_setup s);

  /// Adds the bucket of block `id` (or head_bucket): `p` and `g` are the
  /// stage's parameter and gradient sets, `group` the ring it is reduced
  /// over, `coll` its device group (null: host rings, or a group of one).
  void add_bucket(int id, param_set* p, param_set* g, const ring* group, device_group* coll);
  /// The rank's label, its sends and its inbox (the actor's waits).
  const std::string& label() const { return s_.label; }
  train_comm& comm() const { return *s_.comm; }
  const std::shared_ptr<train_inbox>& inbox() const { return s_.inbox; }
  /// Bucket id -> slot (the reduce message's index).
  const std::map<int, int>& slots() const { return slot_of_; }
  int size() const { return static_cast<int>(buckets_.size()); }
  /// Whether bucket `slot` is reduced by host rings (not by a device
  /// group, whose collectives every member must queue in the same order).
  /// (false for a slot it does not have: reduce reports that).
  bool rings_on_host(int slot) const {
    return slot >= 0 && static_cast<std::size_t>(slot) < buckets_.size() &&
           buckets_[static_cast<std::size_t>(slot)].coll == nullptr;
  }
  /// Whether bucket `slot`'s ring has other members (a group of one
  /// reduces nothing; false for a slot it does not have).
  bool has_ring(int slot) const {
    if (slot < 0 || static_cast<std::size_t>(slot) >= buckets_.size()) return false;
    const ring* r = buckets_[static_cast<std::size_t>(slot)].group;
    return r && r->size() > 1;
  }
  /// The job's options.
  const dist_train_options& options() const { return *s_.options; }

  /// Parameters and moment shards from a checkpoint (any layout wrote it).
  void restore(const state_shards& shards);
  /// What restore reads: each bucket's name, its size and this rank's
  /// moment shard [lo, hi) of it.
  struct wanted_shard {
    std::string bucket;
    std::int64_t n = 0, lo = 0, hi = 0;
  };
  std::vector<wanted_shard> wanted() const;

  // The handlers. reduce and update wait on other ranks (the host rings):
  // they return a dp_step, which the actor runs without blocking, and
  // throw what fails before their first wait. The others return their
  // error as a value ("" = done).
  /// Reduce-scatters bucket `slot`; without the global norm also updates
  /// and all-gathers it.
  dp_step reduce(int slot, std::int64_t step, std::int64_t adam_step, std::shared_ptr<queue_marker> grads_ready);
  /// The squared norm of this rank's reduced gradient shards (every bucket),
  /// or the error that stopped it (a device fault), naming this rank and
  /// the step.
  caf::expected<double> reduced_sum_squares(std::int64_t step);
  /// AdamW on bucket `slot`'s shard with the gradients times `coef`, then
  /// its all-gather (the actor runs one per bucket: those over host rings
  /// side by side, as reductions).
  dp_step update(int slot, std::int64_t step, std::int64_t adam_step, double coef);
  /// Writes this rank's checkpoint shard of step `step` and tells the coordinator.
  std::string save_checkpoint(int step);
  /// How many parameter values this rank keeps (and sends for --save):
  /// the sizes of its kept buckets.
  std::int64_t kept_param_values() const;
  /// Sends values [lo, hi) of bucket `id`'s parameters to the coordinator
  /// as the answer to its ask number `ask` (--save: the coordinator asks
  /// for one piece at a time, each bucket's in order). A bucket this rank
  /// does not keep, or a range other than the next unsent one, is an error.
  std::string publish_params(int steps, int id, int ask, std::int64_t lo, std::int64_t hi);
  /// Copies this rank's state after step `step` (what its checkpoint shard
  /// would hold, with every bucket's parameters, and `loss_scale`) to host
  /// memory and sends it to this rank's keeper and its buddy's. A buddy
  /// that cannot be reached only costs this step's copy there (logged).
  std::string snapshot(int step, const std::string& loss_scale);

 private:
  bool keeps_params(const grad_bucket& b) const;
  Tensor reduced_shard(grad_bucket& b);
  void update_shard(grad_bucket& b, std::int64_t step, std::int64_t adam_step, float grad_scale);
  /// The rest of reduce once bucket `b` is reduce-scattered.
  dp_step after_reduce(grad_bucket& b, std::int64_t step, std::int64_t adam_step);
  /// All-gathers bucket `b`'s parameters, then `then`.
  dp_step gather_params(grad_bucket& b, std::int64_t step, std::function<dp_step()> then);
  void upload_params(grad_bucket& b, const queue_marker* after, std::int64_t lo = 0, std::int64_t hi = -1);
  Tensor to_host(const Tensor& t);

  dp_group_setup s_;
  std::vector<grad_bucket> buckets_;
  /// Per bucket, how many of its values went to the coordinator (--save).
  std::map<int, std::int64_t> published_;
  std::map<int, int> slot_of_;
  /// The padded layout of the device collectives (--collectives device):
  /// size * pad of the largest bucket, on the device.
  Tensor coll_scratch_;
  caf::actor buddy_keeper_;  ///< the buddy's keeper, once looked up
};

/// Spawns the DP-group actor (actors/dp_actor.cpp; detached: its handlers
/// compute) over `group`, which only the actor uses from now on (the
/// caller may hold a reference to choose when it is released, never to use
/// it). The actor never blocks on another rank: the host rings' chunks
/// reach it as actor messages (actors/inbox_waiter.hpp), each within
/// --timeout-s. It takes requests in order: up to
/// dist_train_options::rings_at_once jobs over host rings (a bucket's
/// reduction, or its update and all-gather: an update request is one job
/// per bucket) run side by side, each in a lane of its own; any other
/// request, or a job beyond that, waits queued until those before it are
/// done. Its compute (the AdamW updates, norms, saves, snapshots) is marked on `busy`, so
/// that a coordinator asking what the rank does sees work, not a rank
/// stuck (actors/train_watchdog.hpp); the ring reductions show as waits
/// and messages taken instead.
caf::actor spawn_dp_group(node& n, std::shared_ptr<dp_group> group, std::shared_ptr<stage_beacon> busy);

}  // namespace corolla

// A compute queue's marker travels only between a rank's stage and DP-group
// actors, in one process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<corolla::queue_marker>)
