// apps/cluster_file.hpp — the cluster TOML file a user names (`plan`,
// `train --cluster`, `bench train-cluster`, the demo) read from disk.
// schedule/ only parses text (schedule::parse_cluster): it does no I/O.
#pragma once

#include <filesystem>

#include "schedule/cluster.hpp"

namespace corolla::app {

/// The cluster described in `file` (docs/planner.md). Throws model_error
/// naming the file when it is missing or unreadable ("cluster file PATH
/// does not exist"), or naming the key and line where it is invalid.
schedule::cluster_description load_cluster_file(const std::filesystem::path& file);

}  // namespace corolla::app
