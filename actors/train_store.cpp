#include "actors/train_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"

namespace corolla {

namespace fs = std::filesystem;

std::string bucket_name(int id) { return id == head_bucket ? "head" : "block." + std::to_string(id); }

std::string shard_file_name(int rank) { return "rank-" + std::to_string(rank) + ".safetensors"; }

fs::path checkpoint_step_dir(const fs::path& dir, int step) { return dir / ("step-" + std::to_string(step)); }

namespace {

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

void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw train_error("cannot write " + tmp.string());
  }
  sync_path(tmp);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw train_error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  sync_path(path.parent_path());
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

void write_shard(const fs::path& dir, int step, int rank, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  const fs::path step_dir = checkpoint_step_dir(dir, step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) throw train_error("cannot create " + step_dir.string() + ": " + ec.message());
  const fs::path final_path = step_dir / shard_file_name(rank);
  const fs::path tmp = final_path.string() + ".tmp";
  try {
    write_safetensors(tmp, tensors, {{"step", std::to_string(step)}, {"rank", std::to_string(rank)}});
  } catch (const model_error& e) {
    throw train_error(std::string("cannot write checkpoint shard: ") + e.what());
  }
  sync_path(tmp);
  fs::rename(tmp, final_path, ec);
  if (ec) throw train_error("cannot rename " + tmp.string() + ": " + ec.message());
  sync_path(step_dir);
}

void commit_checkpoint(const fs::path& dir, int step, int world, const std::string& job,
                       const loss_scale_state* scale) {
  const fs::path step_dir = checkpoint_step_dir(dir, step);
  nlohmann::json manifest = {{"step", step}, {"world", world}, {"job", job}};
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
  std::ifstream in(dir / "latest");
  std::string name;
  if (!(in >> name)) return 0;
  const int s = step_of(name);
  if (s == 0 || !fs::exists(checkpoint_step_dir(dir, s) / "manifest.json")) return 0;
  return s;
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
                      saved + "', this run is '" + job +
                      "' (resume with the same model, layout, --batch, --seq and --micro-batch)");
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
