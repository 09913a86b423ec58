// apps/scratch_dir.hpp — a private temporary directory (mkdtemp: a fresh
// name, mode 0700) that goes, with everything in it, when its owner does,
// and when the process is stopped by SIGINT, SIGTERM or SIGHUP
// (apps/self_process.hpp: the handler removes it, after killing the
// process's registered children).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

#include "apps/self_process.hpp"

namespace corolla::app {

class scratch_dir {
 public:
  /// Creates <temp>/<prefix>-XXXXXX. Throws std::runtime_error when it cannot.
  explicit scratch_dir(const std::string& prefix) {
    std::string name = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!::mkdtemp(name.data()))
      throw std::runtime_error("cannot create a directory in " + std::filesystem::temp_directory_path().string());
    path_ = name;
    remove_on_stop();
  }
  /// Takes directory `existing` (one a launcher before this one made) as
  /// this one's: removed with it.
  struct existing_t {};
  scratch_dir(existing_t, std::filesystem::path existing) : path_(std::move(existing)) { remove_on_stop(); }
  ~scratch_dir() {
    forget_tree_on_stop_signal(path_.string());
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  void remove_on_stop() {
    end_on_stop_signals();
    remove_tree_on_stop_signal(path_.string());
  }

  std::filesystem::path path_;
};

}  // namespace corolla::app
