// apps/bench_model.hpp — the model directory a bench runs on: the user's
// --model, or the random ~100M-parameter bench model written to a
// temporary directory for the run (bench swarm, bench api: servers load
// their blocks from disk), removed when the bench ends, also on an error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "apps/scratch_dir.hpp"

namespace corolla::app {

class bench_model_dir {
 public:
  /// `given` when not empty; otherwise writes bench_llama_config() with
  /// `seed` to <temp>/corolla-bench-<tag>-<pid>, then calls `add_files`
  /// on it (e.g. a tokenizer), saying so on stderr as "bench <tag>: ...".
  bench_model_dir(const std::string& given, const std::string& tag, std::uint64_t seed,
                  const std::function<void(const std::filesystem::path&)>& add_files = {});
  bench_model_dir(const bench_model_dir&) = delete;
  bench_model_dir& operator=(const bench_model_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::optional<scratch_dir> scratch_;  ///< the written model's directory (none: the user's --model)
};

}  // namespace corolla::app
