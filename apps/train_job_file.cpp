// The job file the local launcher hands its rank processes: the whole
// dist_train_options as JSON (apps/train_job_file.hpp).
#include "apps/train_job_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "model/stage.hpp"
#include "model/whole_file.hpp"

namespace corolla::app {

nlohmann::json job_to_json(const dist_train_options& o) {
  const auto& w = o.optimizer.adamw;
  nlohmann::json holders = nlohmann::json::object();  // JSON keys are text: owner ranks as strings
  for (const auto& [owner, node_id] : o.from_memory.holder_of) holders[std::to_string(owner)] = node_id;
  nlohmann::json lora = nullptr;
  if (o.lora)
    lora = {{"rank", o.lora->config.rank},       {"alpha", o.lora->config.alpha},
            {"rslora", o.lora->config.rslora},   {"targets", o.lora->config.targets},
            {"seed", std::to_string(o.lora->seed)}, {"from", o.lora->from.string()},
            {"from_digest", o.lora->from_digest}, {"base_model", o.lora->base_model},
            {"base_digest", o.lora->base_digest},
            {"base_weights", weight_format_name(o.lora->base_weights)}};
  return {{"lora", lora},
          {"pp", o.layout.pp}, {"dp", o.layout.dp}, {"chunks", o.layout.chunks}, {"boundaries", o.layout.boundaries},
          {"worker_names", o.layout.worker_names}, {"batch", o.batch}, {"seq", o.seq},
          {"micro_batch", o.micro_batch}, {"steps", o.steps},
          {"adamw", {{"lr", w.lr}, {"beta1", w.beta1}, {"beta2", w.beta2}, {"eps", w.eps}, {"weight_decay", w.weight_decay}}},
          {"max_grad_norm", o.optimizer.max_grad_norm}, {"compute", dtype_name(o.compute)},
          {"collectives", dp_collectives_name(o.collectives)},
          {"loss_scale",
           {{"dynamic", o.optimizer.loss_scale.dynamic}, {"init_scale", o.optimizer.loss_scale.init_scale},
            {"growth_interval", o.optimizer.loss_scale.growth_interval},
            {"min_scale", o.optimizer.loss_scale.min_scale}}},
          {"schedule",
           {{"warmup_steps", o.optimizer.schedule.warmup_steps}, {"cosine", o.optimizer.schedule.cosine},
            {"final_ratio", o.optimizer.schedule.final_ratio}}},
          {"checkpoint_dir", o.checkpoint_dir.string()},
          {"checkpoint_every", o.checkpoint_every}, {"probe_every", o.probe_every}, {"snapshot_every", o.snapshot_every}, {"snapshot_auto", o.snapshot_auto}, {"drain_every", o.drain_every}, {"resume", o.resume}, {"save_dir", o.save_dir.string()},
          {"timeout_ms", o.timeout.count()}, {"hang_s", o.hang_s}, {"rings_at_once", o.rings_at_once}, {"message_piece_bytes", o.message_piece_bytes}, {"link_profiles", o.link_profiles},
          {"synthetic_forward_s", o.synthetic.forward_s}, {"synthetic_backward_s", o.synthetic.backward_s},
          {"hold_snapshots", o.hold_snapshots},
          {"drain_to_memory", o.drain_to_memory},
          {"takeover_token", o.takeover_token},
          {"launcher_pid", o.launcher_pid},
          {"from_memory",
           {{"step", o.from_memory.step}, {"run", std::to_string(o.from_memory.run)},
            {"holder_of", holders}, {"endpoints", o.from_memory.endpoints},
            {"loss_scale", o.from_memory.loss_scale}}}};
}

dist_train_options job_from_json(const std::string& file) {
  return job_from_json_text(read_whole_file(file, "job file"), "job file " + file);
}

dist_train_options job_from_json_text(const std::string& text, const std::string& what) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    dist_train_options o;
    o.layout.pp = j.at("pp");
    o.layout.dp = j.at("dp");
    o.layout.chunks = j.at("chunks");
    o.layout.boundaries = j.at("boundaries").get<std::vector<int>>();
    o.layout.worker_names = j.at("worker_names").get<std::vector<std::string>>();
    o.batch = j.at("batch");
    o.seq = j.at("seq");
    o.micro_batch = j.at("micro_batch");
    o.steps = j.at("steps");
    const auto& w = j.at("adamw");
    o.optimizer.adamw = {w.at("lr"), w.at("beta1"), w.at("beta2"), w.at("eps"), w.at("weight_decay")};
    o.optimizer.max_grad_norm = j.at("max_grad_norm");
    o.compute = parse_compute_dtype(j.at("compute").get<std::string>());
    o.collectives = parse_dp_collectives(j.at("collectives").get<std::string>());
    const auto& ls = j.at("loss_scale");
    o.optimizer.loss_scale.dynamic = ls.at("dynamic");
    o.optimizer.loss_scale.init_scale = ls.at("init_scale");
    o.optimizer.loss_scale.growth_interval = ls.at("growth_interval");
    o.optimizer.loss_scale.min_scale = ls.at("min_scale");
    const auto& sch = j.at("schedule");
    o.optimizer.schedule = {sch.at("warmup_steps"), sch.at("cosine"), sch.at("final_ratio")};
    o.checkpoint_dir = j.at("checkpoint_dir").get<std::string>();
    o.checkpoint_every = j.at("checkpoint_every");
    o.probe_every = j.at("probe_every");
    o.snapshot_every = j.value("snapshot_every", 0);
    o.snapshot_auto = j.value("snapshot_auto", false);
    o.drain_every = j.value("drain_every", 0);
    o.resume = j.at("resume");
    o.save_dir = j.at("save_dir").get<std::string>();
    o.timeout = std::chrono::milliseconds(j.at("timeout_ms").get<std::int64_t>());
    o.hang_s = j.value("hang_s", o.hang_s);
    o.rings_at_once = j.value("rings_at_once", o.rings_at_once);
    o.message_piece_bytes = j.value("message_piece_bytes", o.message_piece_bytes);
    check_message_piece_bytes(o.message_piece_bytes);
    if (o.rings_at_once < 1 || o.rings_at_once > max_rings_at_once)
      throw std::invalid_argument("rings_at_once must be between 1 and " + std::to_string(max_rings_at_once));
    o.link_profiles = j.at("link_profiles").get<std::vector<std::string>>();
    o.synthetic.forward_s = j.at("synthetic_forward_s").get<std::vector<double>>();
    o.synthetic.backward_s = j.at("synthetic_backward_s").get<std::vector<double>>();
    o.hold_snapshots = j.value("hold_snapshots", false);
    o.drain_to_memory = j.value("drain_to_memory", false);
    o.takeover_token = j.value("takeover_token", std::string());
    o.launcher_pid = j.value("launcher_pid", 0);
    if (const auto l = j.find("lora"); l != j.end() && !l->is_null()) {
      dist_lora d;
      d.config.rank = l->at("rank");
      d.config.alpha = l->at("alpha");
      d.config.rslora = l->at("rslora");
      d.config.targets = l->at("targets").get<std::vector<std::string>>();
      d.seed = std::stoull(l->at("seed").get<std::string>());
      d.from = l->at("from").get<std::string>();
      d.from_digest = l->at("from_digest").get<std::string>();
      d.base_model = l->at("base_model").get<std::string>();
      d.base_digest = l->at("base_digest").get<std::string>();
      const std::string base_weights = l->value("base_weights", std::string("f32"));
      const std::optional<weight_format> f = weight_format_named(base_weights);
      if (!f) throw std::invalid_argument("lora.base_weights '" + base_weights + "' is not f32, bf16, i8 or nf4");
      d.base_weights = *f;
      o.lora = std::move(d);
    }
    if (j.contains("from_memory")) {
      const auto& m = j.at("from_memory");
      o.from_memory.step = m.at("step");
      o.from_memory.run = std::stoull(m.at("run").get<std::string>());
      for (const auto& [owner, node_id] : m.at("holder_of").items())
        o.from_memory.holder_of[std::stoi(owner)] = node_id.get<std::string>();
      o.from_memory.endpoints = m.at("endpoints").get<std::map<std::string, std::string>>();
      o.from_memory.loss_scale = m.at("loss_scale").get<std::string>();
    }
    return o;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("malformed " + what + ": " + e.what());
  } catch (const std::logic_error& e) {  // stoi, stoull
    throw std::invalid_argument("malformed " + what + ": " + e.what());
  }
}

bool is_job_file(const std::string& path, const char* prefix) {
  const std::filesystem::path p(path);
  std::error_code ec;
  return p.filename().string().rfind(prefix, 0) == 0 &&
         std::filesystem::equivalent(p.parent_path(), std::filesystem::temp_directory_path(), ec);
}

held_job_file::~held_job_file() {
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<held_job_file> write_job_file(const char* prefix, const std::string& text) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  // Files of launchers and workers killed before they could remove theirs.
  if (const int swept = sweep_stale_job_files(dir); swept > 0)
    spdlog::info("removed {} job file(s) of launchers or workers that are gone", swept);
  std::string name = (dir / (std::string(prefix) + std::to_string(::getpid()) + "-XXXXXX")).string();
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot create a job file in " + dir.string() + ": " + std::strerror(errno));
  auto held = std::make_unique<held_job_file>(name, fd);
  // Locked before anything is written: a sweep never sees it unheld.
  const bool ok = ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
                  ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!ok) {
    std::error_code ec;
    std::filesystem::remove(name, ec);
    throw std::runtime_error("cannot write " + name);
  }
  return held;
}

namespace {

/// Whether `name` is a job file's as write_job_file names it: a prefix,
/// a writer's process id, '-' ("corolla-job-1234-aB3xYz"). Whether that
/// writer lives is the file's lock, not the id.
bool names_a_writer(const std::string& name) {
  for (const char* prefix : {launcher_job_file_prefix, worker_job_file_prefix}) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::size_t from = std::strlen(prefix), dash = name.find('-', from);
    return dash != std::string::npos && dash > from && dash - from <= 10 &&
           std::all_of(name.begin() + static_cast<std::ptrdiff_t>(from), name.begin() + static_cast<std::ptrdiff_t>(dash),
                       [](char c) { return c >= '0' && c <= '9'; });
  }
  return false;
}

}  // namespace

int sweep_stale_job_files(const std::filesystem::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!names_a_writer(it->path().filename().string())) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    // Held by its writer (or being written): its lock is taken.
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat opened {};
    const bool same = ::fstat(fd, &opened) == 0 && opened.st_ino == st.st_ino && opened.st_dev == st.st_dev;
    if (same && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm;
      if (std::filesystem::remove(it->path(), rm)) ++removed;
    }
    ::close(fd);
  }
  return removed;
}

}  // namespace corolla::app
