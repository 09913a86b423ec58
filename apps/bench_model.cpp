#include "apps/bench_model.hpp"

#include <unistd.h>

#include <cstdio>

#include "apps/commands.hpp"
#include "apps/self_process.hpp"
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
  temporary_ = true;
  // Ctrl-C in the minutes a bench runs must not leave hundreds of MB here.
  end_on_stop_signals();
  remove_tree_on_stop_signal(path_.string());
  std::fprintf(stderr, "bench %s: writing the random bench model to %s ...\n", tag.c_str(), path_.c_str());
  try {
    transformer::init(bench_llama_config(), seed, cpu_backend()).save(path_);
    if (add_files) add_files(path_);
  } catch (...) {
    // No destructor runs for an object whose constructor threw.
    forget_tree_on_stop_signal(path_.string());
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    throw;
  }
}

bench_model_dir::~bench_model_dir() {
  if (!temporary_) return;
  forget_tree_on_stop_signal(path_.string());
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace corolla::app
