// apps/swarm_flags.hpp — the flags that point a client command at a swarm
// (--swarm, --swarm-dht, --swarm-model, --curve-keys, --swarm-timeout-ms),
// shared by `corolla generate` and `corolla finetune`, and the client node
// and swarm_client options they lead to.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "net/membership.hpp"

namespace corolla::app {

/// The swarm a client command uses ("" = none given).
struct swarm_flags {
  std::string swarm;        ///< --swarm servers, comma-separated HOST:PORT[#KEY]
  std::string swarm_dht;    ///< --swarm-dht: DHT nodes to find the servers through
  std::string swarm_model;  ///< --swarm-model: the model id servers announce
  std::string curve_keys;   ///< --curve-keys: this client's CurveZMQ key directory
  int timeout_ms = 30000;   ///< --swarm-timeout-ms
  std::string weights;      ///< --swarm-weights: the weights' dtype servers must decode from ("" = any)
  double spot_checks = 0.05;     ///< --spot-checks: fraction of steps per hop checked by a second server
  int spot_check_probation = 4;  ///< --spot-check-probation: checks a new server must pass before sampling
  /// Whether any swarm was given (--swarm or --swarm-dht).
  bool given() const { return !swarm.empty() || !swarm_dht.empty(); }
};

/// Adds the flags above to `cmd`.
void add_swarm_flags(CLI::App* cmd, swarm_flags& f);

/// Checks each --swarm entry (HOST:PORT, NODE_ID@RELAY_HOST:PORT, either
/// with #KEY): a malformed endpoint or a key that is not 40 Z85 characters
/// throws std::invalid_argument naming the entry, before any server is
/// dialled (a bad key would otherwise show only as a failed handshake).
void check_swarm_entries(const std::vector<std::string>& entries);

/// Without a swarm (neither --swarm nor --swarm-dht), the flags above that
/// only shape one (--swarm-model, --curve-keys, --swarm-timeout-ms,
/// --swarm-weights, --spot-checks, --spot-check-probation) and the
/// command's own in `more` (generate's --compression) would do nothing:
/// throws std::invalid_argument naming those `cmd` was given.
void refuse_swarm_only_flags(const CLI::App& cmd, const swarm_flags& f, const std::vector<std::string>& more = {});

/// A client's node, its DHT membership (with --swarm-dht) and the
/// swarm_client options the flags describe. Keep it alive while the
/// swarm_client built from `options` is used (discover() reads `members`).
struct swarm_connection {
  std::unique_ptr<node> runtime;
  std::unique_ptr<net::membership> members;
  swarm_client_options options;
};

/// Starts the client node (dial-out only) and joins the DHT when asked;
/// with the DHT, servers that spot checks find wrong are reported there,
/// and servers others reported are checked on every step.
/// `model_dir` names the default model id, `n_blocks` the blocks whose
/// records are read. Throws std::invalid_argument for flags that name no
/// server, std::runtime_error when the node or the DHT cannot start.
swarm_connection connect_swarm(const swarm_flags& f, const std::string& model_dir, int n_blocks);

/// The model id the servers announce: --swarm-model, else the model
/// directory's name.
std::string model_id_of_swarm(const swarm_flags& f, const std::string& model_dir);

}  // namespace corolla::app
