// apps/cluster_file.cpp — see cluster_file.hpp.
#include "apps/cluster_file.hpp"

#include "model/whole_file.hpp"

namespace corolla::app {

schedule::cluster_description load_cluster_file(const std::filesystem::path& file) {
  return schedule::parse_cluster(read_whole_file(file, "cluster file"), file.string());
}

}  // namespace corolla::app
