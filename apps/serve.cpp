// corolla serve — a volunteer server: blocks [A, B) of a model behind the
// "span" actor (actors/span_server.hpp) until SIGINT or SIGTERM.
//
// Loads only its blocks' tensors from the checkpoint. Prints one readiness
// line on stdout once it listens, so scripts and tests can read the address
// back:
//   corolla serve n-1a2b3c4d blocks [0, 4) of tiny listening on tcp://127.0.0.1:41234
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "apps/commands.hpp"
#include "apps/node_flags.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"

namespace corolla::app {
namespace {

struct serve_args {
  node_flags node;
  std::string model;
  std::string blocks;  ///< "A:B"
  std::int64_t cache_tokens = 8192;
  int session_idle_s = 300;
  int threads = 0;
  std::string log_level = "info";
};

/// "A:B" -> [A, B) within [0, n_blocks).
std::pair<int, int> parse_blocks(const std::string& text, int n_blocks) {
  const auto colon = text.find(':');
  std::size_t used_a = 0, used_b = 0;
  int a = -1, b = -1;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("");
    a = std::stoi(text.substr(0, colon), &used_a);
    b = std::stoi(text.substr(colon + 1), &used_b);
  } catch (const std::exception&) {
    throw std::invalid_argument("--blocks must be A:B (blocks [A, B)), got '" + text + "'");
  }
  if (used_a != colon || used_b != text.size() - colon - 1)
    throw std::invalid_argument("--blocks must be A:B (blocks [A, B)), got '" + text + "'");
  if (a < 0 || b <= a || b > n_blocks)
    throw std::invalid_argument("--blocks " + text + " is not a non-empty part of the model's " +
                                std::to_string(n_blocks) + " blocks [0, " + std::to_string(n_blocks) + ")");
  return {a, b};
}

std::string model_id_of(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

int run_serve(const serve_args& a) {
  apply_common_options(a.threads, a.log_level);
  const sigset_t stop_signals = block_stop_signals();

  const model_config cfg = load_config(a.model);
  const auto [first, last] = parse_blocks(a.blocks, cfg.n_layers);
  if (a.cache_tokens < 1) throw std::invalid_argument("--cache-tokens must be at least 1");
  auto engine = std::make_shared<span_engine>(
      span_engine::load(checkpoint::open(a.model), cfg, first, last, cpu_backend(), a.cache_tokens));

  auto started = node::start(a.node.options());
  if (!started) throw std::runtime_error(error_message(started.error()));
  auto& n = **started;
  span_server_options so;
  so.model = model_id_of(a.model);
  so.session_idle_timeout = std::chrono::seconds(a.session_idle_s);
  auto server = start_span_server(n, engine, so);
  if (!server) throw std::runtime_error(error_message(server.error()));

  std::string line = "corolla serve " + n.id() + " blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                     ") of " + so.model + " listening on " + n.endpoint();
  if (!n.public_key().empty()) line += " curve-key " + n.public_key();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  spdlog::info("serve: blocks [{}, {}) of {} ({} layers), KV cache for {} tokens ({:.1f} MiB)", first, last, so.model,
               cfg.n_layers, engine->cache_tokens(),
               static_cast<double>(engine->cache_tokens() * engine->kv_bytes_per_token()) / (1 << 20));

  const char* sig = wait_for_stop_signal(stop_signals);
  spdlog::info("serve {}: {} received, stopping", n.id(), sig);
  caf::anon_send_exit(*server, caf::exit_reason::user_shutdown);
  n.stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<serve_args>();
  auto* cmd = app.add_subcommand("serve", "Serve a span of a model's blocks to swarm clients until SIGINT/SIGTERM");
  cmd->add_option("--model", a->model, "HuggingFace model directory (only the span's tensors are loaded)")->required();
  cmd->add_option("--blocks", a->blocks, "Blocks to serve, A:B for [A, B)")->required();
  cmd->add_option("--cache-tokens", a->cache_tokens, "Attention-cache budget in tokens over all sessions")
      ->capture_default_str();
  cmd->add_option("--session-idle-s", a->session_idle_s, "Close sessions unused this many seconds")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  a->node.add_to(cmd, "server");
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([&action, a] { action = [a] { return run_serve(*a); }; });
}

}  // namespace corolla::app
