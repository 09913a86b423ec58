#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <sstream>
#include <stdexcept>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "apps/commands.hpp"
#include "kernels/backend.hpp"
#include "kernels/memory_available.hpp"
#include "model/stage.hpp"

namespace corolla::app {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

std::string model_id_of(const std::string& dir) {
  auto p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

void apply_common_options(int threads, const std::string& log_level) {
  if (threads < 0 || threads > max_cpu_threads)
    throw std::invalid_argument("--threads must be in [0, " + std::to_string(max_cpu_threads) +
                                "] (0 = the default), got " + std::to_string(threads));
  // spdlog reads any word it does not know as "off": a typo would silence every line.
  const spdlog::level::level_enum level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off")
    throw std::invalid_argument("--log-level must be trace, debug, info, warn, error, critical or off, got '" +
                                log_level + "'");
  if (threads > 0) set_cpu_threads(threads);
  spdlog::set_level(level);
}

void check_output_dir(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw std::invalid_argument(flag + " " + dir + " is a file, not a directory");
  if (!fs::is_directory(dir, ec) && !fs::create_directories(dir, ec) && ec)
    throw std::invalid_argument(flag + " " + dir + " cannot be made: " + ec.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(flag + " " + dir + ": cannot write into it: " + std::strerror(errno));
}

void check_output_file(const std::string& file, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(file, ec)) throw std::invalid_argument(flag + " " + file + " is a directory: give a file name");
  const fs::path folder = fs::path(file).parent_path().empty() ? fs::path(".") : fs::path(file).parent_path();
  if (!fs::is_directory(folder, ec))
    throw std::invalid_argument(flag + " " + file + ": its folder " + folder.string() + " does not exist");
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument(flag + " " + file + ": cannot write into " + folder.string() + ": " +
                                std::strerror(errno));
}

weight_format parse_weights_flag(const std::string& text) {
  if (text != "i8")  // the flag says int8; i8 is the wire's name
    if (const auto f = weight_format_named(text)) return *f;
  throw std::invalid_argument("--weights must be f32, bf16, int8 or nf4, got '" + text + "'");
}

std::int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    return std::invalid_argument(flag + " must be a size such as 6GiB, 512MiB or 2.5GB, got '" + text + "'");
  };
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string unit = text.substr(used);
  static const std::pair<const char*, double> units[] = {
      {"", 1.0},      {"B", 1.0},       {"KB", 1e3},      {"MB", 1e6},      {"GB", 1e9},      {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1024.0},
      {"M", 1048576.0}, {"G", 1073741824.0}, {"T", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      const double bytes = value * scale;
      if (!(bytes >= 1) || bytes > 9e18) throw bad();
      return static_cast<std::int64_t>(bytes);
    }
  throw bad();
}

std::int64_t parse_memory_budget(const std::string& text, const std::string& flag, device where) {
  if (text != "auto") return parse_byte_size(text, flag);
  const memory_available m = available_memory(where);
  const std::uint64_t budget = auto_memory_budget(where, m);
  const auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  const std::string rule = where.kind == device_kind::cpu
                               ? "half of the host's available memory"
                               : "its free memory less 5 % of the device or 1 GiB, whichever is more";
  if (budget < 1)
    throw std::invalid_argument(fmt::format("{} auto: {} has {:.1f} MiB free of {:.1f} MiB, which leaves nothing ({}); "
                                            "free some, or give a size",
                                            flag, where.str(), mib(m.free_bytes), mib(m.total_bytes), rule));
  spdlog::info("{} auto: {:.1f} MiB on {} ({} MiB free of {:.1f} MiB: {})", flag, mib(budget), where.str(),
               static_cast<long long>(m.free_bytes >> 20), mib(m.total_bytes), rule);
  return static_cast<std::int64_t>(budget);
}

swarm::gathering_policy parse_batch_wait(double fraction, double max_ms) {
  if (!std::isfinite(fraction) || fraction < 0)
    throw std::invalid_argument(fmt::format("--batch-wait must be a fraction >= 0 of the last batch's time, got {}",
                                            fraction));
  if (!std::isfinite(max_ms) || max_ms < 0 || max_ms > 10000)
    throw std::invalid_argument(fmt::format("--batch-wait-max-ms must be between 0 and 10000, got {}", max_ms));
  swarm::gathering_policy p;
  p.wait_fraction = fraction;
  p.max_wait = std::chrono::microseconds(static_cast<std::int64_t>(max_ms * 1000));
  return p;
}

dtype parse_kv_dtype_flag(const std::string& text) {
  if (const auto t = float_dtype_named(text)) return *t;
  throw std::invalid_argument("--kv-dtype must be f32, bf16 or f16, got '" + text + "'");
}

dtype parse_compute_flag(const std::string& text, device where) {
  const dtype t = parse_compute_dtype(text);
  if (t != dtype::f32 && where.kind == device_kind::cpu)
    throw std::invalid_argument("--compute " + text + " needs a GPU (--device cuda): the cpu backend computes in f32");
  return t;
}

namespace {

/// "corolla frobnicate" or "corolla bench frobnicate": the unknown command
/// and the ones there are, which CLI11 would only call a missing one.
/// Empty when the command words (the leading ones that are not flags) name
/// known commands.
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path = "corolla";
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const auto commands = at->get_subcommands([](const CLI::App*) { return true; });
    if (commands.empty()) break;
    const std::string word = argv[i];
    const auto named = std::find_if(commands.begin(), commands.end(),
                                    [&](const CLI::App* c) { return c->get_name() == word; });
    if (named == commands.end()) {
      std::string known;
      for (const CLI::App* c : commands) known += (known.empty() ? "" : ", ") + c->get_name();
      return "unknown command '" + path + " " + word + "'; the commands are " + known + " (" + path + " --help)";
    }
    at = *named;
    path += " " + word;
  }
  return {};
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"corolla: train, fine-tune and serve LLMs across heterogeneous clusters and swarms"};
  app.set_version_flag("--version", std::string("corolla ") + COROLLA_VERSION);
  app.require_subcommand(1);
  // stdout carries each command's output (text, ids, JSON); logs go to stderr.
  if (!spdlog::get("corolla-stderr")) spdlog::set_default_logger(spdlog::stderr_color_mt("corolla-stderr"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::warn);
  // Every process of a command, the ranks a launcher starts included
  // (they inherit it); a command's own --log-level still wins.
  if (const char* level = std::getenv("COROLLA_LOG_LEVEL"); level && *level) {
    const spdlog::level::level_enum l = spdlog::level::from_str(level);
    if (l == spdlog::level::off && std::string(level) != "off") {
      std::fprintf(stderr, "corolla: error: COROLLA_LOG_LEVEL must be trace, debug, info, warn, error, critical or off, "
                   "got '%s'\n", level);
      return 1;
    }
    spdlog::set_level(l);
  }

  action_fn action;
  register_info(app, action);
  register_train(app, action);
  register_generate(app, action);
  register_finetune(app, action);
  register_bench(app, action);
  register_demo(app, action);
  register_node(app, action);
  register_ping(app, action);
  register_serve(app, action);
  register_api(app, action);
  register_dashboard(app, action);
  register_faultlab(app, action);
  register_plan(app, action);

  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "corolla: error: %s\n", unknown.c_str());
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action ? action() : 0;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "corolla: error: out of memory (is a size or count on the command line too large?)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "corolla: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace corolla::app
