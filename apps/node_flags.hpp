// apps/node_flags.hpp — what every command that runs a long-lived node
// (`corolla node`, `corolla serve`) takes on its command line, and how such
// a command waits for SIGINT/SIGTERM.
#pragma once

#include <chrono>
#include <csignal>
#include <string>
#include <utility>

#include "actors/node.hpp"

namespace CLI {
class App;
}

namespace corolla::app {

/// The node flags: --listen, --node-id, --link-profile, --curve-keys,
/// --heartbeat-ms, --peer-timeout-ms, --nic-class, --no-rdma.
struct node_flags {
  std::string listen = "tcp://127.0.0.1:0";
  std::string node_id;
  std::string link_profile = "none";
  std::string curve_keys;
  int heartbeat_ms = 200;
  int peer_timeout_ms = 1200;
  std::string nic_class;  ///< empty: discovered from sysfs
  bool no_rdma = false;   ///< do not open the host's RDMA port

  /// Registers the flags on `cmd`; `who` names the process in help texts
  /// ("node", "server").
  void add_to(CLI::App* cmd, const std::string& who);
  /// The node options these flags describe.
  node_options options() const;
};

/// Blocks SIGINT and SIGTERM in the calling thread. Call it before any
/// thread exists (the actor system and transports inherit the mask), then
/// wait_for_stop_signal() on the same thread.
sigset_t block_stop_signals();
/// Waits for SIGINT or SIGTERM; returns "SIGINT" or "SIGTERM".
const char* wait_for_stop_signal(const sigset_t& signals);
/// The same, waiting at most `timeout`: nullptr when none arrived.
const char* wait_for_stop_signal(const sigset_t& signals, std::chrono::milliseconds timeout);

/// "HOST:PORT" of an HTTP listen flag (port 0 = any free port). Throws
/// std::invalid_argument naming `flag` and the text when it is not that.
std::pair<std::string, int> parse_http_listen(const std::string& text, const std::string& flag = "--listen");

}  // namespace corolla::app
