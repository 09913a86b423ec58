// apps/train_job_file.hpp — the job file the local launcher writes for its
// rank processes (`--job-file`): every field of dist_train_options as JSON,
// so a rank runs exactly the job the launcher planned (also after an
// elastic re-plan changed its layout).
#pragma once

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

/// The name a worker (`corolla train --join`, apps/train_lobby.cpp) gives
/// the job file of a rank it runs, in the temporary directory: the rank
/// removes it once read, so a worker killed while its rank runs leaves no
/// copy of the job behind.
inline constexpr const char* worker_job_file_prefix = "corolla-joined-";
/// Whether `path` is such a file (by its name and directory).
bool is_worker_job_file(const std::string& path);

}  // namespace corolla::app
