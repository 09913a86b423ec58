// apps/train_job_file.hpp — the job file the local launcher writes for its
// rank processes (`--job-file`): every field of dist_train_options as JSON,
// so a rank runs exactly the job the launcher planned (also after an
// elastic re-plan changed its layout).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/train_job.hpp"

namespace corolla::app {

/// `o` as the job file's JSON.
nlohmann::json job_to_json(const dist_train_options& o);
/// Reads a job file; throws model_error naming the file for a missing or
/// unreadable one, std::invalid_argument for a malformed one.
dist_train_options job_from_json(const std::string& file);
/// The same from the text itself; `what` names it in errors ("job file X").
dist_train_options job_from_json_text(const std::string& text, const std::string& what);

/// The name the local launcher gives its job file (it holds the job's
/// takeover token), in the temporary directory; removed when the launcher
/// ends, on its stop signals, or by a launcher taking over from it.
inline constexpr const char* launcher_job_file_prefix = "corolla-job-";
/// The name a worker (`corolla train --join`, apps/train_lobby.cpp) gives
/// the job file of a rank it runs, in the temporary directory: the rank
/// removes it once read, so a worker killed while its rank runs leaves no
/// copy of the job behind.
inline constexpr const char* worker_job_file_prefix = "corolla-joined-";
/// Whether `path` is a job file named `prefix`... in the temporary
/// directory (by its name and directory).
bool is_job_file(const std::string& path, const char* prefix);
/// Whether `path` is a worker's job file.
inline bool is_worker_job_file(const std::string& path) { return is_job_file(path, worker_job_file_prefix); }

/// A job file this process wrote and holds: it keeps the file open with an
/// exclusive flock(2) for as long as it lives (the lock goes when the
/// process does, however it ends; exec'd children do not inherit it). The
/// file itself is the caller's to remove.
class held_job_file {
 public:
  held_job_file(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~held_job_file();
  held_job_file(const held_job_file&) = delete;
  held_job_file& operator=(const held_job_file&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_;
};

/// A fresh job file in the temporary directory, named `prefix`, this
/// process's id, '-' and six random characters (mkostemp: mode 0600, never
/// an existing path or link), holding `text`, and held (locked) by this
/// process. First the directory's stale job files go
/// (sweep_stale_job_files). Throws std::runtime_error when it cannot be made or written
/// (nothing is left behind then).
std::unique_ptr<held_job_file> write_job_file(const char* prefix, const std::string& text);

/// Removes the job files in `dir` (both prefixes, with a writer's id in the
/// name) that this user owns and that no process holds: what a launcher or
/// a worker killed by SIGKILL leaves (nothing of it runs its stop handler).
/// Whether the writer lives is its lock, not its id, so a reused id or
/// another pid namespace sharing the directory changes nothing. Names
/// without an id (an older build's) are left. Returns how many it removed.
int sweep_stale_job_files(const std::filesystem::path& dir);

}  // namespace corolla::app
