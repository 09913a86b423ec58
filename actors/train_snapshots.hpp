// actors/train_snapshots.hpp — in-memory snapshots of an elastic training
// job: how a single rank's death loses no step.
//
// Every `snapshot_every` steps (dist_train_options), after the step's
// update, each rank's DP group copies to host memory what its checkpoint
// shard of that step would hold (the AdamW moments of the shards it owns,
// the parameters of its buckets, the loss scaler's state) and sends it:
//  - to its own rank's keeper (kept for when the rank survives), and
//  - to its buddy's keeper (snapshot_buddy: the next replica of its stage,
//    which holds the same parameters, so only the moments travel; with one
//    replica the first replica of the next stage, and the parameters travel
//    too).
// A snapshot larger than one message travels in parts (actors/
// train_snapshot_wire.hpp), and fetches of large tensors in ranges.
// The keeper is an actor published as "train-snap/<run>" on every rank's
// node (snapshot_keeper_name: a process that runs the grids of several
// runs, holding one's snapshots while it runs the next, has one per run). It
// keeps the two newest steps of each owner it is buddy to (the newest may
// not have reached every holder when the job fails) and takes snapshots
// only of this run, from ranks of the job, for owners it keeps.
//
// When the job fails, the surviving ranks keep their processes and keepers
// (dist_train_options::hold_snapshots): the launcher asks every keeper
// what it holds (train.snaps?, fetch_snapshot_index), chooses the newest
// step whose copies cover every rank of the failed grid
// (schedule::choose_snapshot_step), and each rank of the new grid fetches
// the pieces its buckets need from the holders' memory (train.snapget,
// fetch_snapshot) and reads them as that step's checkpoint
// (snapshot_shards). Without hold_snapshots (a grid with a rank on a
// joined worker's machine) every surviving rank asks its keeper to write
// what it holds (flush) under
// checkpoint_dir/memory/h<holder>/step-N/rank-R.safetensors, in the
// checkpoint shard format, and exits; the launcher
// (commit_memory_snapshots) chooses the step the same way from the files,
// assembles it into checkpoint_dir/step-N and commits it when it is newer
// than the latest checkpoint on disk. When a failure took both copies of
// some state (a rank and its buddy), no step is complete and the job falls
// back to the last committed checkpoint, or to the start.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "actors/train_store.hpp"

namespace corolla {

class node;
class train_inbox;
struct train_layout;

namespace train_msg {
inline constexpr const char* snap = "train.snap";  ///< rank -> a keeper: an in-memory snapshot
inline constexpr const char* snaps_query = "train.snaps?";  ///< -> a keeper, a request: what it holds of a run
inline constexpr const char* snaps = "train.snaps";         ///< the answer: a TrainSnapshotIndex
inline constexpr const char* snap_get = "train.snapget";    ///< -> a keeper, a request: tensors of one snapshot
inline constexpr const char* snap_drop = "train.snapdrop";  ///< -> a keeper, one-way: no grid reads it any more, end
}  // namespace train_msg

/// The name rank keepers of run `job` are published under on their nodes.
std::string snapshot_keeper_name(std::uint64_t job);
/// Whether `name` is a keeper's (of any run).
bool is_snapshot_keeper_name(const std::string& name);

namespace snap_msg {
/// keeper <- rank, a request: write every snapshot held; answers an error
/// string ("" = done).
using flush_atom = caf::atom_constant<caf::atom("snapflush")>;
}  // namespace snap_msg

/// The rank that keeps a copy of rank `rank`'s snapshots: the next replica
/// of its stage (dp > 1), else the first replica of the next stage (dp = 1,
/// pp > 1); -1 in a job of one rank.
int snapshot_buddy(const train_layout& l, int rank);
/// Whether the buddy's copy must carry the parameters (it sits on another
/// stage: dp = 1).
bool buddy_needs_params(const train_layout& l, int rank);
/// The owners whose snapshots rank `holder` keeps: itself and those it is
/// the buddy of.
std::set<int> snapshot_owners(const train_layout& l, int holder);

/// One rank's state after one step, in host memory.
struct rank_snapshot {
  int owner = 0;
  std::int64_t step = 0;
  std::uint64_t job = 0;
  std::vector<std::pair<std::string, Tensor>> tensors;  ///< checkpoint shard names: "params.block.3", "m.head", ...
  std::map<std::string, shard_range> ranges;             ///< bucket -> where its moment shard lies
  std::string loss_scale;  ///< "scale good_steps skipped" with dynamic loss scaling, else ""

  std::size_t bytes() const;
  /// The same snapshot without the parameters (a buddy on the same stage holds them).
  rank_snapshot without_params() const;
  /// The same snapshot without any tensor (whose, which step and run, ranges, loss scale).
  rank_snapshot header() const;
};

/// One step's state from in-memory snapshots, one per owner rank (what the
/// keepers of a job hold of that step), read by a rank of any layout as
/// the checkpoint of that step would be (state_shards).
class snapshot_shards : public state_shards {
 public:
  /// Throws train_error when the snapshots are of different steps or
  /// jobs, name one owner twice, or (with `whole`) their moment pieces do
  /// not tile every bucket. Without `whole` they may be the pieces one
  /// rank needs (read_moment still checks that they cover what it reads).
  explicit snapshot_shards(std::vector<rank_snapshot> snapshots, bool whole = true);
  std::int64_t step() const { return snaps_.empty() ? 0 : snaps_.front().step; }

 protected:
  Tensor tensor(std::size_t shard, const std::string& name) const override;
  std::string what() const override;
  std::string shard_label(std::size_t shard) const override;

 private:
  std::vector<rank_snapshot> snaps_;
};

/// What a keeper holds of one snapshot: its tensors' names and sizes, not
/// their values (an entry of its answer to train.snaps?).
struct snapshot_listing {
  int owner = 0;
  std::int64_t step = 0;
  std::uint64_t job = 0;
  std::vector<std::pair<std::string, std::int64_t>> tensors;  ///< name, values (f32)
  std::map<std::string, shard_range> ranges;
  std::string loss_scale;

  std::size_t bytes() const;
};

/// Everything one keeper holds of a run.
struct snapshot_index {
  int holder = 0;
  std::vector<snapshot_listing> snapshots;
};

/// Asks the keeper ("train-snap") on node `peer` what it holds of run
/// `job` (a run's id is what lets one in: another run's, or a stranger's,
/// question is refused with auth_refused).
caf::expected<snapshot_index> fetch_snapshot_index(node& n, const std::string& peer, std::uint64_t job,
                                                   std::chrono::milliseconds timeout);
/// Tensors `names` (none = all) of rank `owner`'s snapshot of `step` of run
/// `job` from the keeper on node `peer`: memory to memory, the way a rank
/// of a new layout gets the state it takes over. It asks the keeper what
/// it holds first (the tensors' sizes), then for the tensors in requests
/// whose answers carry at most `max_bytes` of values each (a larger tensor
/// in ranges), one after another; `timeout` is each request's.
caf::expected<rank_snapshot> fetch_snapshot(node& n, const std::string& peer, std::uint64_t job, int owner,
                                            std::int64_t step, const std::vector<std::string>& names,
                                            std::chrono::milliseconds timeout,
                                            std::int64_t max_bytes = std::int64_t{256} << 20);

/// What a keeper needs.
struct snapshot_keeper_setup {
  int holder = 0;                        ///< this rank
  std::set<int> owners;                  ///< snapshot_owners(layout, holder)
  std::shared_ptr<train_inbox> inbox;    ///< who is part of the job (its named peers)
  std::filesystem::path dir;             ///< where a flush writes: <checkpoint_dir>/memory
  /// The coordinator's node: told (train.kept) of every buddy's snapshot
  /// this keeper stores, so that it prints a step only once every rank's
  /// state of it is in two processes ("" = nobody is told).
  std::string coordinator;
};

/// "scale good_steps skipped" with dynamic loss scaling, else "" (what a
/// snapshot carries, and a flushed shard's "loss_scale" metadata).
std::string loss_scale_text(const loss_scaler& s);
/// loss_scale_text back: nullopt for "", std::invalid_argument for a
/// malformed text.
std::optional<loss_scale_state> parse_loss_scale_text(const std::string& text);
/// Asks `keeper` (of the rank labelled `label`) to write what it holds;
/// logs what fails. Waits up to a minute.
void flush_snapshot_keeper(node& n, const caf::actor& keeper, const std::string& label);

/// Spawns the keeper of run `job` (snapshots of other runs are dropped)
/// and publishes it on `n` as snapshot_keeper_name(job). It ends (and
/// unpublishes itself) on a train.snapdrop naming `job`.
caf::expected<caf::actor> start_snapshot_keeper(node& n, snapshot_keeper_setup s, std::uint64_t job);

/// checkpoint_dir/memory: where keepers flush.
std::filesystem::path memory_snapshot_dir(const std::filesystem::path& checkpoint_dir);
/// Whether rank `holder`'s keeper finished its flush (its marker, written
/// after its snapshots, is there; even when some failed to write).
bool snapshots_flushed(const std::filesystem::path& checkpoint_dir, int holder);

/// What commit_memory_snapshots found.
struct memory_recovery {
  int step = 0;                  ///< the step assembled and committed (0: none)
  std::uintmax_t bytes = 0;      ///< the bytes of its shards
  int holders = 0;               ///< ranks whose keepers flushed
  std::string why_not;           ///< when step = 0: why no step could be used
};

/// After a failed grid of `world` ranks whose job has `buckets`
/// (job_buckets): the newest step whose flushed snapshots
/// (memory_snapshot_dir) hold every rank's shard and every bucket's
/// parameters, assembled into
/// checkpoint_dir/step-N and committed (manifest with `job`, `layout`, the
/// snapshots' loss scale; then `latest`) when it is newer than the latest
/// checkpoint there. With `newest` >= 0 only steps up to it count: the
/// last step the job printed, since a later step's loss was never shown
/// and the next grid starts after the step committed. The flushed files
/// are removed either way. Throws train_error only when the disk refuses.
memory_recovery commit_memory_snapshots(const std::filesystem::path& checkpoint_dir, int world,
                                        const std::vector<std::string>& buckets,
                                        const std::string& job, const std::string& layout, int newest = -1);

}  // namespace corolla
