// corolla node — a node that answers echo/ping until SIGINT or SIGTERM.
//
// Prints one readiness line on stdout once it listens (with the real port
// when the given one is 0), so scripts and tests can read the address back:
//   corolla node n-1a2b3c4d listening on tcp://127.0.0.1:41234
// With --curve-keys the line ends in "curve-key <Z85 public key>". With
// --relay-service it is a relay for servers behind NAT (actors/relay.hpp):
// a dedicated one, on a machine with an open port, that serves no blocks.
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>


#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/node_flags.hpp"

namespace corolla::app {
namespace {

struct node_args {
  node_flags node;
  bool relay_service = false;
  double relay_rate_mbit = 256;  ///< --relay-rate: what each peer may send through this relay
  std::string log_level = "info";
};

int run_node(const node_args& a) {
  apply_common_options(0, a.log_level);  // logs go to stderr (run_cli), stdout has the readiness line
  const sigset_t stop_signals = block_stop_signals();
  node_options o = a.node.options();
  o.relay_service = a.relay_service;
  o.relay_rate = a.relay_rate_mbit * 1e6 / 8;
  auto started = node::start(o);
  if (!started) throw std::runtime_error(error_message(started.error()));
  auto& n = **started;

  std::string line = "corolla node " + n.id() + " listening on " + n.endpoint();
  if (!n.public_key().empty()) line += " curve-key " + n.public_key();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  const char* sig = wait_for_stop_signal(stop_signals);
  spdlog::info("node {}: {} received, saying goodbye to {} peer(s)", n.id(), sig, n.peers().size());
  if (a.relay_service)
    spdlog::info("node {}: passed on {} relayed message(s), refused {} over --relay-rate", n.id(), n.relayed_messages(),
                 n.relay_refused());
  n.stop();
  return 0;
}

}  // namespace

void register_node(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<node_args>();
  auto* cmd = app.add_subcommand("node", "Run a node that answers echo/ping until SIGINT/SIGTERM");
  a->node.add_to(cmd, "node");
  auto* service = cmd->add_flag("--relay-service", a->relay_service,
                "Relay for servers behind NAT (serve --no-listen --relay THIS_ENDPOINT) and dial peers back to "
                "check they can be reached");
  cmd->add_option("--relay-rate", a->relay_rate_mbit,
                  "With --relay-service: Mbit/s each peer may send through this relay on average, in bursts of 8 s "
                  "of it; what goes over is refused (0 = no limit)")
      ->check(finite_at_least(0))
      ->needs(service)
      ->capture_default_str();
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
  cmd->callback([&action, a] { action = [a] { return run_node(*a); }; });
}

}  // namespace corolla::app
