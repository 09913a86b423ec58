// actors/train_store.hpp — sharded training checkpoints on disk.
//
//   DIR/step-N/rank-R.safetensors   one shard per rank: the AdamW moments of
//                                   the parameter shards it owns ("m.<bucket>",
//                                   "v.<bucket>"), and on replica 0 of each
//                                   stage its blocks' parameters ("params.<bucket>";
//                                   rank 0 also the head). The header's metadata
//                                   says where each moment shard lies in its
//                                   bucket: "range.<bucket>" = "LO HI N"
//                                   (values [LO, HI) of the bucket's N).
//   DIR/step-N/manifest.json        written by the coordinator once every shard
//                                   of step N is on disk: {format: 2, step,
//                                   world, job, layout}, and with dynamic loss
//                                   scaling "loss_scale": {scale, good_steps,
//                                   skipped} after step N
// Checkpoints do not depend on the layout that wrote them: a rank of any
// other pipeline x data-parallel layout finds its blocks' parameters and
// assembles its moment shards from whichever files hold the pieces
// (checkpoint_shards), so a 2x2 checkpoint resumes on 1x4 or 3x1.
//   DIR/latest                      "step-N": the newest complete checkpoint,
//                                   replaced atomically (write + rename)
// Every file is written to a temporary name, synced (fsync) and renamed,
// the directory synced after the rename, and `latest` moves
// only after the manifest exists, so a rank dying mid-save leaves the
// previous checkpoint as the latest one, untouched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <optional>

#include "kernels/tensor.hpp"
#include "model/loss_scale.hpp"

namespace corolla {

class safetensors_file;

/// The bucket id of the head (blocks use their block index).
inline constexpr int head_bucket = -1;

/// "head" or "block.<i>".
std::string bucket_name(int id);
/// "rank-<R>.safetensors".
std::string shard_file_name(int rank);
/// DIR/step-N.
std::filesystem::path checkpoint_step_dir(const std::filesystem::path& dir, int step);
/// Where a rank's moment shard of one bucket lies: values [lo, hi) of n.
struct shard_range {
  std::int64_t lo = 0, hi = 0, n = 0;
};

/// Writes rank `rank`'s shard of step `step` (temporary file, then rename):
/// `tensors`, and `ranges` (bucket name -> where its "m." and "v." tensors
/// lie) and `meta` in the header. Throws train_error when the disk refuses.
/// Without `durable` nothing is synced (files read back at once by the
/// same machine, such as flushed in-memory snapshots).
void write_shard(const std::filesystem::path& dir, int step, int rank,
                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::map<std::string, shard_range>& ranges = {},
                 const std::map<std::string, std::string>& meta = {}, bool durable = true);
/// Commits step `step`: its manifest (the layout that wrote it, for people
/// and messages; the loss scaler's state after the step, when given), then
/// `latest`; removes checkpoints older than the previous one. Throws
/// train_error when the disk refuses.
void commit_checkpoint(const std::filesystem::path& dir, int step, int world, const std::string& job,
                       const std::string& layout = "", const loss_scale_state* scale = nullptr);
/// The step of `dir`'s latest complete checkpoint, or 0 when there is none:
/// the one `latest` names, or, when `latest` is missing, unreadable or names
/// no complete step, the newest step directory with a manifest.
int latest_checkpoint_step(const std::filesystem::path& dir);
/// Throws train_error unless step `step`'s manifest names job `job`.
void check_manifest(const std::filesystem::path& dir, int step, const std::string& job);
/// The bytes of step `step`'s shards (those of the ranks its manifest
/// names: what a resume reads). Throws train_error without a manifest.
std::uintmax_t checkpoint_shard_bytes(const std::filesystem::path& dir, int step);
/// The layout that wrote step `step` ("2x2 [0,2) [2,4)"), "" when not recorded.
std::string checkpoint_layout(const std::filesystem::path& dir, int step);

/// One step's training state in shards written by some layout: a
/// checkpoint's files (checkpoint_shards) or in-memory snapshots
/// (snapshot_shards, actors/train_snapshots.hpp). A rank of any layout
/// reads its buckets from it: the parameters from the shard that holds
/// them, its moment shards assembled from the pieces of the writers'.
class state_shards {
 public:
  virtual ~state_shards() = default;
  /// The whole parameter vector of `bucket` (bucket_name) into `dst` (f32,
  /// host). Throws train_error when no shard holds it or its size differs.
  void read_params(const std::string& bucket, Tensor& dst) const;
  /// Whether some shard holds the parameters of `bucket`.
  bool has_params(const std::string& bucket) const { return params_.count(bucket) > 0; }
  /// Values [lo, lo + dst.numel()) of AdamW moment `which` ("m" or "v") of
  /// `bucket`, whose parameter vector has `n` values, assembled from the
  /// shards that hold pieces of it. Throws train_error when the pieces do
  /// not cover the range or disagree on `n`.
  void read_moment(const std::string& which, const std::string& bucket, std::int64_t lo, std::int64_t n,
                   Tensor& dst) const;

 protected:
  /// Shard `shard` holds "params.<bucket>".
  void add_params(const std::string& bucket, std::size_t shard) { params_.emplace(bucket, shard); }
  /// Shard `shard` holds the moment piece `range` of `bucket`.
  void add_piece(const std::string& bucket, std::size_t shard, shard_range range) {
    moments_[bucket].push_back({shard, range});
  }
  /// Checks that every bucket's pieces tile its values [0, n) exactly: no
  /// gap, no overlap (a shard of another checkpoint copied in would make
  /// one). Throws train_error naming the shard.
  void check_tiling();
  /// Tensor `name` of shard `shard` (f32, host); throws train_error when
  /// the shard lacks it or it is of another type.
  virtual Tensor tensor(std::size_t shard, const std::string& name) const = 0;
  /// What the shards are, for messages: "checkpoint DIR/step-N".
  virtual std::string what() const = 0;
  /// Shard `shard`, for messages: its file name, or the rank's snapshot.
  virtual std::string shard_label(std::size_t shard) const = 0;

 private:
  /// `dst` from values [from, from + dst.numel()) of tensor `name` of shard `shard`.
  void copy_values(std::size_t shard, const std::string& name, std::int64_t from, Tensor dst) const;

  struct piece {
    std::size_t shard = 0;
    shard_range range;
  };
  std::map<std::string, std::size_t> params_;          ///< bucket -> shard holding "params.<bucket>"
  std::map<std::string, std::vector<piece>> moments_;  ///< bucket -> its moment shards
};

/// Every shard of one committed checkpoint step.
class checkpoint_shards : public state_shards {
 public:
  /// Opening maps the files and reads their headers only. Throws
  /// train_error for a missing or malformed manifest or shard, or a
  /// checkpoint of an older format (no shard ranges).
  checkpoint_shards(const std::filesystem::path& dir, int step);

 protected:
  Tensor tensor(std::size_t shard, const std::string& name) const override;
  std::string what() const override { return "checkpoint " + step_dir_.string(); }
  std::string shard_label(std::size_t shard) const override;

 private:
  std::filesystem::path step_dir_;
  std::vector<std::shared_ptr<safetensors_file>> files_;
};

/// The loss scaler's state step `step`'s manifest holds, if any (a run
/// without loss scaling writes none). Throws train_error for a malformed one.
std::optional<loss_scale_state> checkpoint_loss_scale(const std::filesystem::path& dir, int step);

}  // namespace corolla
