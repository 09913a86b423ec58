// actors/train_snapshot_files.cpp — in-memory snapshots on disk
// (actors/train_snapshots.hpp): where survivors that do not hold their
// snapshots in memory flush them (a grid with a rank on a joined worker's
// machine), and the launcher's assembly of the step to continue from out
// of those files into a committed checkpoint.
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/train_comm.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"
#include "schedule/snapshot_choice.hpp"

namespace corolla {

namespace fs = std::filesystem;

namespace {

/// The number after `prefix` in `name` ("h3", "step-7", "rank-2.safetensors"), or -1.
int number_after(const std::string& name, const std::string& prefix, const std::string& suffix = "") {
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0) return -1;
  if (!suffix.empty() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoi(digits);
}

}  // namespace

// ---- recovery --------------------------------------------------------------------------

fs::path memory_snapshot_dir(const fs::path& checkpoint_dir) { return checkpoint_dir / "memory"; }

bool snapshots_flushed(const fs::path& checkpoint_dir, int holder) {
  std::error_code ec;
  return fs::exists(memory_snapshot_dir(checkpoint_dir) / ("h" + std::to_string(holder)) / "flushed", ec);
}

memory_recovery commit_memory_snapshots(const fs::path& checkpoint_dir, int world, const std::vector<std::string>& buckets,
                                        const std::string& job, const std::string& layout, int newest) {
  memory_recovery out;
  const fs::path mem = memory_snapshot_dir(checkpoint_dir);
  struct remover {
    fs::path p;
    ~remover() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{mem};
  // What every holder flushed, read from the shards' headers: the decision
  // is schedule::choose_snapshot_step's.
  std::vector<schedule::held_snapshot> held;
  std::map<std::pair<int, std::int64_t>, std::map<int, fs::path>> files;  // (owner, step) -> holder -> file
  std::map<std::pair<int, std::int64_t>, loss_scale_state> scales;       // (owner, step) -> the scaler's state
  std::error_code ec;
  for (const auto& h : fs::directory_iterator(mem, ec)) {
    const int holder = number_after(h.path().filename().string(), "h");
    if (holder < 0) continue;
    ++out.holders;
    std::error_code ec2;
    for (const auto& sd : fs::directory_iterator(h.path(), ec2)) {
      const int step = number_after(sd.path().filename().string(), "step-");
      if (step < 1) continue;
      std::error_code ec3;
      for (const auto& f : fs::directory_iterator(sd.path(), ec3)) {
        const int owner = number_after(f.path().filename().string(), "rank-", ".safetensors");
        if (owner < 0 || owner >= world) continue;
        schedule::held_snapshot x;
        x.holder = holder;
        x.owner = owner;
        x.step = step;
        try {
          const auto shard = safetensors_file::open(f.path());
          for (const auto& [name, info] : shard->tensors())
            if (name.rfind("params.", 0) == 0) x.params.insert(name.substr(7));
          for (const auto& [key, value] : shard->metadata()) {
            std::istringstream in(value);
            if (key == "loss_scale") {
              try {
                if (const auto st = parse_loss_scale_text(value)) scales[{owner, step}] = *st;
              } catch (const std::invalid_argument& e) {
                throw model_error(e.what());  // the file is ignored, as a malformed one
              }
            }
            if (key.rfind("range.", 0) != 0) continue;
            schedule::value_range r;
            if (!(in >> r.lo >> r.hi >> r.n)) throw model_error("a malformed " + key + " '" + value + "'");
            x.moments[key.substr(6)] = r;
          }
        } catch (const model_error& e) {
          spdlog::warn("ignoring the flushed snapshot {}: {}", f.path().string(), e.what());
          continue;
        }
        held.push_back(std::move(x));
        files[{owner, step}][holder] = f.path();
      }
    }
  }
  const schedule::snapshot_choice choice =
      schedule::choose_snapshot_step(held, world, buckets, newest, latest_checkpoint_step(checkpoint_dir));
  if (!choice.found()) {
    out.why_not = held.empty() ? "no rank flushed a snapshot" : choice.why_not;
    return out;
  }
  const int step = static_cast<int>(choice.step);
  // Assemble one shard per rank from the chosen copies, then commit.
  const fs::path staging = mem / "assembled";
  fs::remove_all(checkpoint_step_dir(staging, step), ec);
  fs::create_directories(checkpoint_step_dir(staging, step), ec);
  if (ec) throw train_error("cannot create " + checkpoint_step_dir(staging, step).string() + ": " + ec.message());
  std::optional<loss_scale_state> scale;
  for (const auto& [owner, holder] : choice.source) {
    const fs::path& src = files.at({owner, choice.step}).at(holder);
    const fs::path dst = checkpoint_step_dir(staging, step) / shard_file_name(owner);
    fs::rename(src, dst, ec);
    if (ec) throw train_error("cannot move " + src.string() + ": " + ec.message());
    // Every rank's scaler is in the same state after a step.
    if (const auto it = scales.find({owner, choice.step}); it != scales.end() && !scale) scale = it->second;
  }
  const fs::path target = checkpoint_step_dir(checkpoint_dir, step);
  fs::remove_all(target, ec);  // shards of a checkpoint of this step that was never committed
  fs::rename(checkpoint_step_dir(staging, step), target, ec);
  if (ec) throw train_error("cannot move the assembled snapshots to " + target.string() + ": " + ec.message());
  commit_checkpoint(checkpoint_dir, step, world, job, layout, scale ? &*scale : nullptr);
  out.step = step;
  out.bytes = checkpoint_shard_bytes(checkpoint_dir, step);
  return out;
}

}  // namespace corolla
