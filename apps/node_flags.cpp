#include "apps/node_flags.hpp"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/control_token_env.hpp"

namespace corolla::app {

void node_flags::add_to(CLI::App* cmd, const std::string& who) {
  cmd->add_option("--listen", listen, "Endpoint to listen on (port 0 = any free port)")->capture_default_str();
  cmd->add_option("--node-id", node_id, "Node id (default: generated n-<8 hex>): 1 to 64 letters, digits, '.', '_', '-'")
      ->check(CLI::Validator(
          [](std::string& id) -> std::string {
            // It is a word of readiness lines and logs, and relay entries
            // read ID@HOST:PORT#KEY: nothing that would split or confuse them.
            const bool plain = std::all_of(id.begin(), id.end(), [](char c) {
              return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
            });
            if (id.empty() || id.size() > 64 || !plain)
              return "must be 1 to 64 letters, digits, '.', '_' or '-', got '" + id + "'";
            return {};
          },
          "ID"));
  cmd->add_option("--link-profile", link_profile,
                  "Shaping of what this " + who +
                      " sends: none, ib, roce, ethernet, wan, consumer, or bw=100Mbit,lat=20ms,jitter=2ms,loss=0.1%")
      ->capture_default_str();
  cmd->add_option("--curve-keys", curve_keys,
                  "Require CurveZMQ: key directory (node.key, node.pub, allowed; a key pair is created when missing)");
  cmd->add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval in milliseconds")
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  cmd->add_option("--peer-timeout-ms", peer_timeout_ms, "A peer silent this long is reported down (milliseconds)")
      ->check(CLI::Range(2, 3600000))
      ->capture_default_str();
  cmd->add_option("--nic-class", nic_class,
                  "NIC class announced to peers: ib, roce, ethernet (default: this host's fastest active class)")
      ->check(CLI::IsMember({"ib", "roce", "ethernet"}));
  cmd->add_flag("--no-rdma", no_rdma,
                "Keep every link on ZeroMQ/TCP even where both ends have RDMA ports of one class");
}

node_options node_flags::options() const {
  node_options o;
  o.listen = listen;
  o.node_id = node_id;
  o.link_profile = link_profile;
  o.curve_dir = curve_keys;
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.peer_timeout = std::chrono::milliseconds(peer_timeout_ms);
  o.nic_class = nic_class;
  o.open_rdma = !no_rdma;
  // A local harness (faultlab) that starts this process may reshape its
  // links at runtime: it hands over a token only it and the process know.
  o.control_token = inherited_control_token();
  return o;
}

sigset_t block_stop_signals() {
  // A write to a closed stdout (the parent read the readiness line and went)
  // must not kill a long-lived node.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  return s;
}

const char* wait_for_stop_signal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>(timeout.count() % 1000) * 1000000L};
  const int sig = sigtimedwait(&signals, nullptr, &ts);
  if (sig < 0) return nullptr;  // timeout (EAGAIN) or interrupted
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

const char* wait_for_stop_signal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig == SIGINT ? "SIGINT" : "SIGTERM";
}

std::pair<std::string, int> parse_http_listen(const std::string& text, const std::string& flag) {
  const auto colon = text.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    try {
      std::size_t used = 0;
      port = std::stoi(text.substr(colon + 1), &used);
      if (used != text.size() - colon - 1) port = -1;
    } catch (const std::exception&) {
      port = -1;
    }
  }
  if (port < 0 || port > 65535)
    throw std::invalid_argument(flag + " must be HOST:PORT with a port in [0, 65535], got '" + text + "'");
  return {text.substr(0, colon), port};
}

}  // namespace corolla::app
