// corolla dashboard — the swarm dashboard of `corolla api` for volunteers
// who run no API: joins the swarm's DHT, reads the servers' records once a
// second and serves the page (GET /) and its data (GET /swarm.json).
//
// Prints one line on stdout once it listens:
//   corolla dashboard tiny listening on http://127.0.0.1:8080
// and serves until SIGINT or SIGTERM.
#include <cstdio>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "api/dashboard.hpp"
#include "api/swarm_view.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/http_serving.hpp"
#include "apps/node_flags.hpp"
#include "apps/swarm_flags.hpp"
#include "model/config.hpp"
#include "net/membership.hpp"

namespace corolla::app {
namespace {

struct dashboard_args {
  std::string swarm_dht;
  std::string model;        ///< a model directory: its name and block count
  std::string swarm_model;  ///< or the model id ...
  int blocks = 0;           ///< ... and its block count
  std::string listen = "127.0.0.1:8080";
  std::string log_level = "warn";
  int shutdown_grace_s = 30;
};

int run_dashboard(const dashboard_args& a) {
  apply_common_options(1, a.log_level);
  if (a.model.empty() == (a.swarm_model.empty() || a.blocks <= 0))
    throw std::invalid_argument("give --model DIR, or --swarm-model ID with --blocks N (not both)");
  const auto [host, port] = parse_http_listen(a.listen);
  const sigset_t stop_signals = block_stop_signals();
  int n_blocks = a.blocks;
  std::string model_id = a.swarm_model;
  if (!a.model.empty()) {
    n_blocks = load_config(a.model).n_layers;
    if (model_id.empty()) model_id = model_id_of(a.model);
  }
  net::membership members;
  net::membership_options mo;
  mo.bootstrap = split_list(a.swarm_dht);
  if (auto ep = members.start(mo); !ep) throw std::runtime_error("cannot join the swarm's DHT: " + error_message(ep.error()));
  api::swarm_watch watch(model_id, n_blocks, [&members, model_id, n_blocks] { return members.get_span(model_id, 0, n_blocks); });
  api::dashboard_server server(watch, model_id, n_blocks);
  const int bound = server.bind(host, port);
  std::printf("corolla dashboard %s listening on http://%s:%d\n", model_id.c_str(), host.c_str(), bound);
  std::fflush(stdout);
  serve_until_stop_signal("dashboard", stop_signals, std::chrono::seconds(a.shutdown_grace_s),
                          [&] { server.run(); }, [&] { server.stop(); });
  return 0;
}

}  // namespace

void register_dashboard(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<dashboard_args>();
  auto* cmd = app.add_subcommand("dashboard", "A web page of a swarm's servers, spans and coverage, from its DHT");
  cmd->add_option("--swarm-dht", a->swarm_dht, "DHT nodes of the swarm, HOST:PORT[,HOST:PORT...]")->required();
  cmd->add_option("--model", a->model, "HuggingFace model directory (its name is the model id; config.json gives the blocks)");
  cmd->add_option("--swarm-model", a->swarm_model, "The model id the servers announce (instead of --model)");
  cmd->add_option("--blocks", a->blocks, "The model's blocks (with --swarm-model)")
      ->check(integer_between(1, 1000000));
  cmd->add_option("--listen", a->listen, "HOST:PORT to serve HTTP on (port 0 = any)")->capture_default_str();
  cmd->add_option("--shutdown-grace-s", a->shutdown_grace_s,
                  "After SIGINT/SIGTERM, how long open connections may take before the process exits without "
                  "them, 0 to 86400")
      ->check(integer_between(0, 86400))
      ->capture_default_str();
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([a, &action] { action = [a] { return run_dashboard(*a); }; });
}

}  // namespace corolla::app
