// The example cluster files of docs/clusters/, as the schedule/ tests read
// them (schedule/ parses text; the apps read the file, apps/cluster_file.hpp).
#pragma once

#include <filesystem>
#include <string>

#include "model/whole_file.hpp"
#include "schedule/cluster.hpp"

namespace corolla::schedule::testing {

/// docs/clusters/<name> in the source tree.
inline std::filesystem::path example(const std::string& name) {
  return std::filesystem::path(COROLLA_SOURCE_DIR) / "docs" / "clusters" / name;
}

/// The cluster of docs/clusters/<name>, parsed as `corolla plan` parses it.
inline cluster_description example_cluster(const std::string& name) {
  const std::filesystem::path file = example(name);
  return parse_cluster(read_whole_file(file, "cluster file"), file.string());
}

}  // namespace corolla::schedule::testing
