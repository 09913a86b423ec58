// corolla node — a node that answers echo/ping until SIGINT or SIGTERM.
//
// Prints one readiness line on stdout once it listens (with the real port
// when the given one is 0), so scripts and tests can read the address back:
//   corolla node n-1a2b3c4d listening on tcp://127.0.0.1:41234
// With --curve-keys the line ends in "curve-key <Z85 public key>".
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include <pthread.h>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "apps/commands.hpp"

namespace corolla::app {
namespace {

struct node_args {
  std::string listen = "tcp://127.0.0.1:0";
  std::string node_id;
  std::string link_profile = "none";
  std::string curve_keys;
  int heartbeat_ms = 200;
  int peer_timeout_ms = 1200;
  std::string nic_class;  // empty: discovered from sysfs
  std::string log_level = "info";
};

int run_node(const node_args& a) {
  // stdout carries only this command's output (readiness line, results);
  // logs go to stderr.
  auto to_stderr = spdlog::get("corolla-stderr");
  spdlog::set_default_logger(to_stderr ? to_stderr : spdlog::stderr_color_mt("corolla-stderr"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  apply_common_options(0, a.log_level);
  // Block the stop signals before any thread exists (the actor system and
  // the transport inherit the mask), then wait for them on this thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  node_options o;
  o.listen = a.listen;
  o.node_id = a.node_id;
  o.link_profile = a.link_profile;
  o.curve_dir = a.curve_keys;
  o.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  o.peer_timeout = std::chrono::milliseconds(a.peer_timeout_ms);
  o.nic_class = a.nic_class;
  auto started = node::start(o);
  if (!started) throw std::runtime_error(error_message(started.error()));
  auto& n = **started;

  std::string line = "corolla node " + n.id() + " listening on " + n.endpoint();
  if (!n.public_key().empty()) line += " curve-key " + n.public_key();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("node {}: {} received, saying goodbye to {} peer(s)", n.id(),
               sig == SIGINT ? "SIGINT" : "SIGTERM", n.peers().size());
  n.stop();
  return 0;
}

}  // namespace

void register_node(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<node_args>();
  auto* cmd = app.add_subcommand("node", "Run a node that answers echo/ping until SIGINT/SIGTERM");
  cmd->add_option("--listen", a->listen, "Endpoint to listen on (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--node-id", a->node_id, "Node id (default: generated n-<8 hex>)");
  cmd->add_option("--link-profile", a->link_profile,
                  "Shaping of what this node sends: none, ib, roce, ethernet, wan, consumer, or "
                  "bw=100Mbit,lat=20ms,jitter=2ms,loss=0.1%")
      ->capture_default_str();
  cmd->add_option("--curve-keys", a->curve_keys,
                  "Require CurveZMQ: key directory (node.key, node.pub, allowed; a key pair is "
                  "created when missing)");
  cmd->add_option("--heartbeat-ms", a->heartbeat_ms, "Heartbeat interval in milliseconds")
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  cmd->add_option("--peer-timeout-ms", a->peer_timeout_ms,
                  "A peer silent this long is reported down (milliseconds)")
      ->check(CLI::Range(2, 3600000))
      ->capture_default_str();
  cmd->add_option("--nic-class", a->nic_class,
                  "NIC class announced to peers: ib, roce, ethernet (default: this host's fastest active class)");
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
  cmd->callback([&action, a] { action = [a] { return run_node(*a); }; });
}

}  // namespace corolla::app
