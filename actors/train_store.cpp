#include "actors/train_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"
#include "model/whole_file.hpp"
#include "schedule/snapshot_choice.hpp"

namespace corolla {

namespace fs = std::filesystem;

std::string bucket_name(int id) { return id == head_bucket ? "head" : "block." + std::to_string(id); }

std::string shard_file_name(int rank) { return "rank-" + std::to_string(rank) + ".safetensors"; }

fs::path checkpoint_step_dir(const fs::path& dir, int step) { return dir / ("step-" + std::to_string(step)); }

namespace {

/// 2: moment shards carry their ranges, any layout restores (1: the same layout only).
constexpr int checkpoint_format = 2;

/// fsync of a file or directory: its data (or its entries) reach the disk
/// before whatever is renamed next names them.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw train_error("cannot open " + p.string() + " to sync it: " + std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (r != 0) throw train_error("cannot sync " + p.string() + ": " + std::strerror(err));
}

/// The manifest and `latest`: written whole or not at all (write_whole_file).
void write_atomically(const fs::path& path, const std::string& text) {
  try {
    write_whole_file(path, text);
  } catch (const model_error& e) {
    throw train_error(e.what());
  }
}

int step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return 0;
  try {
    std::size_t used = 0;
    const int s = std::stoi(name.substr(5), &used);
    return used == name.size() - 5 && s > 0 ? s : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

void write_shard(const fs::path& dir, int step, int rank, const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::map<std::string, shard_range>& ranges, const std::map<std::string, std::string>& extra,
                 bool durable) {
  const fs::path step_dir = checkpoint_step_dir(dir, step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) throw train_error("cannot create " + step_dir.string() + ": " + ec.message());
  const fs::path final_path = step_dir / shard_file_name(rank);
  const fs::path tmp = final_path.string() + ".tmp";
  try {
    std::map<std::string, std::string> meta = extra;
    meta["step"] = std::to_string(step);
    meta["rank"] = std::to_string(rank);
    for (const auto& [bucket, r] : ranges)
      meta["range." + bucket] = std::to_string(r.lo) + " " + std::to_string(r.hi) + " " + std::to_string(r.n);
    write_safetensors(tmp, tensors, meta);
  } catch (const model_error& e) {
    throw train_error(std::string("cannot write checkpoint shard: ") + e.what());
  }
  if (durable) sync_path(tmp);
  fs::rename(tmp, final_path, ec);
  if (ec) throw train_error("cannot rename " + tmp.string() + ": " + ec.message());
  if (durable) sync_path(step_dir);
}

void commit_checkpoint(const fs::path& dir, int step, int world, const std::string& job, const std::string& layout,
                       const loss_scale_state* scale) {
  const fs::path step_dir = checkpoint_step_dir(dir, step);
  nlohmann::json manifest = {
      {"format", checkpoint_format}, {"step", step}, {"world", world}, {"job", job}, {"layout", layout}};
  if (scale)
    manifest["loss_scale"] = {{"scale", scale->scale}, {"good_steps", scale->good_steps}, {"skipped", scale->skipped}};
  write_atomically(step_dir / "manifest.json", manifest.dump(2) + "\n");
  const int previous = latest_checkpoint_step(dir);
  write_atomically(dir / "latest", "step-" + std::to_string(step) + "\n");
  // Keep the new checkpoint and the one before it; older ones (and shards
  // of steps that were never committed) go.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = step_of(e.path().filename().string());
    if (s > 0 && s != step && s != previous && s < step) fs::remove_all(e.path(), ec);
  }
}

int latest_checkpoint_step(const fs::path& dir) {
  std::error_code ec;
  std::ifstream in(dir / "latest");
  std::string name;
  if (in >> name)
    if (const int s = step_of(name); s > 0 && fs::exists(checkpoint_step_dir(dir, s) / "manifest.json", ec)) return s;
  // `latest` gone, garbage or naming a step that is not there (removed or
  // damaged by hand): the newest step with a manifest is complete, since
  // commit_checkpoint writes the manifest after every shard. Returning 0
  // here would let a fresh job write over those checkpoints.
  int newest = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = step_of(e.path().filename().string());
    if (s > newest && fs::exists(e.path() / "manifest.json", ec)) newest = s;
  }
  return newest;
}

namespace {

nlohmann::json read_manifest(const fs::path& dir, int step) {
  const fs::path path = checkpoint_step_dir(dir, step) / "manifest.json";
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw train_error("cannot read " + path.string() + ": " + e.what());
  }
}

}  // namespace

void check_manifest(const fs::path& dir, int step, const std::string& job) {
  const nlohmann::json m = read_manifest(dir, step);
  const std::string saved = m.value("job", std::string());
  if (saved != job)
    throw train_error("checkpoint " + checkpoint_step_dir(dir, step).string() + " is of another job: it was written for '" +
                      saved + "', this run is '" + job + "' (resume with the same model, --batch and --seq)");
}

std::uintmax_t checkpoint_shard_bytes(const fs::path& dir, int step) {
  const int world = read_manifest(dir, step).value("world", 0);
  std::uintmax_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(checkpoint_step_dir(dir, step) / shard_file_name(r), ec);
    if (!ec) bytes += size;
  }
  return bytes;
}

std::string checkpoint_layout(const fs::path& dir, int step) {
  const nlohmann::json m = read_manifest(dir, step);
  const auto it = m.find("layout");
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

checkpoint_shards::checkpoint_shards(const fs::path& dir, int step) : step_dir_(checkpoint_step_dir(dir, step)) {
  const nlohmann::json m = read_manifest(dir, step);
  const int format = m.value("format", 1);
  if (format != checkpoint_format)
    throw train_error("checkpoint " + step_dir_.string() + " has format " + std::to_string(format) + ", this corolla reads " +
                      std::to_string(checkpoint_format) + " (format 1 predates layout-independent checkpoints: resume it "
                      "with the corolla that wrote it)");
  const int world = m.value("world", 0);
  if (world < 1) throw train_error("the manifest of " + step_dir_.string() + " names no ranks");
  for (int r = 0; r < world; ++r) {
    std::shared_ptr<safetensors_file> f;
    try {
      f = safetensors_file::open(step_dir_ / shard_file_name(r));
    } catch (const model_error& e) {
      throw train_error(std::string("checkpoint shard: ") + e.what());
    }
    const std::size_t index = files_.size();
    for (const auto& [name, info] : f->tensors())
      if (name.rfind("params.", 0) == 0) add_params(name.substr(7), index);
    for (const auto& [key, value] : f->metadata()) {
      if (key.rfind("range.", 0) != 0) continue;
      shard_range range;
      std::istringstream in(value);
      if (!(in >> range.lo >> range.hi >> range.n) || range.lo < 0 || range.hi < range.lo || range.n < range.hi)
        throw train_error("checkpoint shard " + f->path().string() + " has a malformed " + key + " '" + value + "'");
      add_piece(key.substr(6), index, range);
    }
    files_.push_back(std::move(f));
  }
  check_tiling();
}

Tensor checkpoint_shards::tensor(std::size_t shard, const std::string& name) const {
  const safetensors_file& f = *files_.at(shard);
  if (!f.find(name)) throw train_error("checkpoint shard " + f.path().string() + " has no tensor " + name);
  Tensor t = f.view(name);
  if (t.type() != dtype::f32)
    throw train_error("checkpoint tensor " + name + " in " + f.path().string() + " is " + dtype_name(t.type()) +
                      ", not f32");
  return t;
}

std::string checkpoint_shards::shard_label(std::size_t shard) const {
  return files_.at(shard)->path().filename().string();
}

void state_shards::check_tiling() {
  for (auto& [bucket, pieces] : moments_) {
    auto range_of = [](const piece& p) { return schedule::value_range{p.range.lo, p.range.hi, p.range.n}; };
    std::sort(pieces.begin(), pieces.end(),
              [&](const piece& x, const piece& y) { return schedule::starts_before(range_of(x), range_of(y)); });
    std::vector<schedule::value_range> sorted;
    for (const piece& p : pieces) sorted.push_back(range_of(p));
    const schedule::tiling t = schedule::check_tiling(sorted);
    if (t.bad < pieces.size()) {
      const piece& p = pieces[t.bad];
      throw train_error("the shards of " + what() + " do not tile the optimizer state of " + bucket + ": " +
                        shard_label(p.shard) + " holds [" + std::to_string(p.range.lo) + ", " +
                        std::to_string(p.range.hi) + ") of " + std::to_string(p.range.n) + " where [" +
                        std::to_string(t.next) + ", ...) of " + std::to_string(t.n) + " was due");
    }
    if (!t.tiles())
      throw train_error("the shards of " + what() + " hold values [0, " + std::to_string(t.next) + ") of the " +
                        std::to_string(t.n) + " of the optimizer state of " + bucket);
  }
}

void state_shards::copy_values(std::size_t shard, const std::string& name, std::int64_t from, Tensor dst) const {
  const Tensor src = tensor(shard, name);
  if (from + dst.numel() > src.numel())
    throw train_error("tensor " + name + " of " + shard_label(shard) + " (" + what() + ") has " +
                      std::to_string(src.numel()) + " values, expected at least " + std::to_string(from + dst.numel()));
  std::memcpy(dst.data<float>(), src.data<float>() + from, static_cast<std::size_t>(dst.numel()) * sizeof(float));
}

void state_shards::read_params(const std::string& bucket, Tensor& dst) const {
  const auto it = params_.find(bucket);
  if (it == params_.end()) throw train_error("no shard of " + what() + " holds the parameters of " + bucket);
  if (const std::int64_t held = tensor(it->second, "params." + bucket).numel(); held != dst.numel())
    throw train_error(what() + ": " + std::to_string(held) + " parameters of " + bucket + ", this model has " +
                      std::to_string(dst.numel()));
  copy_values(it->second, "params." + bucket, 0, dst);
}

void state_shards::read_moment(const std::string& which, const std::string& bucket, std::int64_t lo, std::int64_t n,
                               Tensor& dst) const {
  const std::int64_t hi = lo + dst.numel();
  const auto it = moments_.find(bucket);
  if (it == moments_.end()) throw train_error("no shard of " + what() + " holds optimizer state of " + bucket);
  std::int64_t covered = 0;
  for (const piece& p : it->second) {
    if (p.range.n != n)
      throw train_error(what() + ": " + std::to_string(p.range.n) + " values of " + bucket + ", this model has " +
                        std::to_string(n));
    const std::int64_t a = std::max(lo, p.range.lo), b = std::min(hi, p.range.hi);
    if (a >= b) continue;
    copy_values(p.shard, which + "." + bucket, a - p.range.lo, dst.slice(a - lo, b - lo));
    covered += b - a;
  }
  // The pieces tile [0, n) (check_tiling): each value is copied once.
  if (covered != hi - lo)
    throw train_error("the shards of " + what() + " cover " + std::to_string(covered) + " of values [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + ") of " + which + "." + bucket);
}

std::optional<loss_scale_state> checkpoint_loss_scale(const fs::path& dir, int step) {
  const nlohmann::json m = read_manifest(dir, step);
  if (!m.contains("loss_scale")) return std::nullopt;
  try {
    const nlohmann::json& j = m.at("loss_scale");
    loss_scale_state st;
    st.scale = j.at("scale").get<double>();
    st.good_steps = j.at("good_steps").get<int>();
    st.skipped = j.at("skipped").get<std::int64_t>();
    return st;
  } catch (const nlohmann::json::exception& e) {
    throw train_error("bad loss_scale in the manifest of " + checkpoint_step_dir(dir, step).string() + ": " + e.what());
  }
}

}  // namespace corolla
