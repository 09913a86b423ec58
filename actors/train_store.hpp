// actors/train_store.hpp — sharded training checkpoints on disk.
//
//   DIR/step-N/rank-R.safetensors   one shard per rank: the AdamW moments of
//                                   the parameter shards it owns ("m.<bucket>",
//                                   "v.<bucket>"), and on replica 0 of each
//                                   stage its blocks' parameters ("params.<bucket>";
//                                   rank 0 also the head)
//   DIR/step-N/manifest.json        written by the coordinator once every shard
//                                   of step N is on disk: {step, world, job},
//                                   and with dynamic loss scaling "loss_scale":
//                                   {scale, good_steps, skipped} after step N
//   DIR/latest                      "step-N": the newest complete checkpoint,
//                                   replaced atomically (write + rename)
// Every file is written to a temporary name, synced (fsync) and renamed,
// the directory synced after the rename, and `latest` moves
// only after the manifest exists, so a rank dying mid-save leaves the
// previous checkpoint as the latest one, untouched.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <optional>

#include "kernels/tensor.hpp"
#include "model/loss_scale.hpp"

namespace corolla {

/// The bucket id of the head (blocks use their block index).
inline constexpr int head_bucket = -1;

/// "head" or "block.<i>".
std::string bucket_name(int id);
/// "rank-<R>.safetensors".
std::string shard_file_name(int rank);
/// DIR/step-N.
std::filesystem::path checkpoint_step_dir(const std::filesystem::path& dir, int step);
/// Writes rank `rank`'s shard of step `step` (temporary file, then rename).
/// Throws train_error when the disk refuses.
void write_shard(const std::filesystem::path& dir, int step, int rank,
                 const std::vector<std::pair<std::string, Tensor>>& tensors);
/// Commits step `step`: its manifest (with the loss scaler's state after
/// the step, when given), then `latest`; removes checkpoints older than the
/// previous one. Throws train_error when the disk refuses.
void commit_checkpoint(const std::filesystem::path& dir, int step, int world, const std::string& job,
                       const loss_scale_state* scale = nullptr);
/// The step of `dir`'s latest complete checkpoint, or 0 when there is none.
int latest_checkpoint_step(const std::filesystem::path& dir);
/// Throws train_error unless step `step`'s manifest names job `job`.
void check_manifest(const std::filesystem::path& dir, int step, const std::string& job);
/// The loss scaler's state step `step`'s manifest holds, if any (a run
/// without loss scaling writes none). Throws train_error for a malformed one.
std::optional<loss_scale_state> checkpoint_loss_scale(const std::filesystem::path& dir, int step);

}  // namespace corolla
