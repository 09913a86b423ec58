#include "apps/bench_model.hpp"

#include <unistd.h>

#include <cstdio>

#include "apps/commands.hpp"
#include "kernels/backend.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

bench_model_dir::bench_model_dir(const std::string& given, const std::string& tag, std::uint64_t seed,
                                 const std::function<void(const std::filesystem::path&)>& add_files) {
  if (!given.empty()) {
    path_ = given;
    return;
  }
  path_ = std::filesystem::temp_directory_path() / ("corolla-bench-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(path_);
  // From here it goes with this object, also when the constructor throws
  // below (a constructed member is destroyed), and with a stop signal
  // (Ctrl-C in the minutes a bench runs must not leave hundreds of MB).
  scratch_.emplace(scratch_dir::existing_t{}, path_);
  std::fprintf(stderr, "bench %s: writing the random bench model to %s ...\n", tag.c_str(), path_.c_str());
  transformer::init(bench_llama_config(), seed, cpu_backend()).save(path_);
  if (add_files) add_files(path_);
}

}  // namespace corolla::app
