#include "apps/swarm_flags.hpp"

#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/swarm_records.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "net/endpoint.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::app {

void add_swarm_flags(CLI::App* cmd, swarm_flags& f) {
  cmd->add_option("--swarm", f.swarm,
                  "Run the blocks on these corolla serve nodes (HOST:PORT,...); only the embeddings, "
                  "final norm and LM head are loaded here");
  cmd->add_option("--swarm-dht", f.swarm_dht,
                  "Find the servers in the swarm's DHT through these nodes (HOST:PORT,...: the 'dht' address "
                  "corolla serve prints)");
  cmd->add_option("--swarm-model", f.swarm_model,
                  "Model id the servers announce (default: the --model directory's name)");
  cmd->add_option("--curve-keys", f.curve_keys,
                  "With --swarm: this client's CurveZMQ key directory (node.key, node.pub; created when missing), "
                  "for servers that require CurveZMQ (their keys come from --swarm HOST:PORT#KEY or the DHT)");
  cmd->add_option("--swarm-timeout-ms", f.timeout_ms, "Longest wait for one server's answer")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  cmd->add_option("--swarm-weights", f.weights,
                  "Route only through servers whose decode reads these linear weights: f32, bf16, int8 or nf4 "
                  "(serve --weights; quantised weights change the output)");
  cmd->add_option("--spot-checks", f.spot_checks,
                  "Fraction of steps of each hop that another server holding the same blocks recomputes, to catch "
                  "servers that answer wrong (0 = only a new server's first steps)")
      ->check(finite_between(0, 1))
      ->capture_default_str();
  cmd->add_option("--spot-check-probation", f.spot_check_probation,
                  "Every step of a server is checked until it passed this many checks (0 with --spot-checks 0 = "
                  "no checks)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
}

void check_swarm_entries(const std::vector<std::string>& entries) {
  for (const std::string& entry : entries) {
    const known_server s = server_from_entry(entry);
    if (const std::string problem = net::tcp_endpoint_problem(s.endpoint); !problem.empty())
      throw std::invalid_argument("--swarm entry '" + entry + "': " + problem);
    if (entry.find('#') != std::string::npos && !net::is_curve_key(s.public_key))
      throw std::invalid_argument("--swarm entry '" + entry +
                                  "': the key after '#' must be the server's CurveZMQ public key (40 Z85 characters, "
                                  "as its readiness line prints it)");
  }
}

void refuse_swarm_only_flags(const CLI::App& cmd, const swarm_flags& f, const std::vector<std::string>& more) {
  if (f.given()) return;
  std::vector<std::string> flags{"--swarm-model", "--curve-keys",  "--swarm-timeout-ms",
                                 "--swarm-weights", "--spot-checks", "--spot-check-probation"};
  flags.insert(flags.end(), more.begin(), more.end());
  std::string given;
  for (const std::string& flag : flags)
    if (cmd.count(flag) > 0) given += (given.empty() ? "" : ", ") + flag;
  if (!given.empty())
    throw std::invalid_argument(given + " only shape" + (given.find(',') == std::string::npos ? "s" : "") +
                                " a swarm: give --swarm or --swarm-dht too, or leave " +
                                (given.find(',') == std::string::npos ? "it" : "them") + " out");
}

swarm_connection connect_swarm(const swarm_flags& f, const std::string& model_dir, int n_blocks) {
  if (!f.weights.empty()) try {
      parse_weights_flag(f.weights);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument("--swarm-weights must be f32, bf16, int8 or nf4, got '" + f.weights + "'");
    }
  // Before the node starts (and --curve-keys writes a key pair).
  check_swarm_entries(split_list(f.swarm));
  swarm_connection c;
  node_options no;
  no.listen = "";  // a client only dials out
  no.curve_dir = f.curve_keys;
  auto n = node::start(no);
  if (!n) throw std::runtime_error("cannot start the client node: " + error_message(n.error()));
  c.runtime = std::move(*n);
  c.options.servers = split_list(f.swarm);
  // With --swarm-dht the servers come from their DHT records (read again at
  // every refresh, so servers that joined since are found too).
  if (!f.swarm_dht.empty()) {
    c.members = std::make_unique<net::membership>();
    net::membership_options mo;
    mo.bootstrap = split_list(f.swarm_dht);
    if (auto ep = c.members->start(mo); !ep)
      throw std::runtime_error("cannot join the swarm's DHT: " + error_message(ep.error()));
    const std::string model_id = model_id_of_swarm(f, model_dir);
    c.options.discover = [members = c.members.get(), model_id, n_blocks] {
      std::vector<std::string> endpoints;
      for (const auto& r : members->get_span(model_id, 0, n_blocks))
        if (r.state == server_state::online) endpoints.push_back(server_entry(r));
      return endpoints;
    };
    c.options.reported = [members = c.members.get(), model_id] {
      std::vector<std::string> ids;
      for (const auto& r : members->wrong_output_reports(model_id)) ids.push_back(r.server);
      return ids;
    };
    c.options.on_wrong_server = [members = c.members.get(), model_id, reporter = c.runtime->id()](
                                    const wrong_server_report& w) {
      net::wrong_output_report r{model_id, w.server, reporter, {w.start, w.end}, w.difference};
      if (auto err = members->report_wrong_output(r))
        spdlog::warn("cannot report {} in the DHT: {}", w.server, error_message(err));
      else
        spdlog::warn("reported {} in the swarm's DHT: it answered blocks [{}, {}) wrong", w.server, w.start, w.end);
    };
  }
  if (c.options.servers.empty() && !c.options.discover)
    throw std::invalid_argument("--swarm needs at least one HOST:PORT (or give --swarm-dht)");
  c.options.request_timeout = std::chrono::milliseconds(f.timeout_ms);
  if (!f.weights.empty()) c.options.weights = weight_format_name(parse_weights_flag(f.weights));
  c.options.spot_checks.fraction = f.spot_checks;
  c.options.spot_checks.probation_steps = f.spot_check_probation;
  return c;
}

std::string model_id_of_swarm(const swarm_flags& f, const std::string& model_dir) {
  return f.swarm_model.empty() ? model_id_of(model_dir) : f.swarm_model;
}

}  // namespace corolla::app
