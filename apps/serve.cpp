// corolla serve — a volunteer server: blocks [A, B) of a model behind the
// "span" actor (actors/span_server.hpp) until SIGINT or SIGTERM.
//
// Loads only its blocks' tensors from the checkpoint. Prints one readiness
// line on stdout once it listens, so scripts and tests can read the address
// back:
//   corolla serve n-1a2b3c4d blocks [0, 4) of tiny listening on tcp://127.0.0.1:41234
// or, for a server that cannot be dialled (--no-listen, a failed dial-back;
// apps/serve_relay.hpp), the relay clients reach it through:
//   corolla serve n-1a2b3c4d blocks [0, 4) of tiny reached through relay n-5e6f7a8b at tcp://10.0.0.5:7000
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "actors/swarm_records.hpp"
#include "actors/swarm_wire.hpp"
#include "api/server_metrics.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/node_flags.hpp"
#include "apps/serve_memory.hpp"
#include "apps/serve_peers.hpp"
#include "apps/serve_adapters.hpp"
#include "apps/serve_drain.hpp"
#include "apps/serve_relay.hpp"
#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/progress_bar.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "net/codec.hpp"
#include "net/endpoint.hpp"
#include "net/membership.hpp"
#include "net/nic.hpp"
#include "net/server_record.hpp"
#include "net/shaping.hpp"
#include "schedule/block_selection.hpp"

namespace corolla::app {
namespace {

struct serve_args {
  node_flags node;
  std::string model;
  std::string blocks;  ///< "A:B"
  int num_blocks = 0;  ///< --num-blocks: choose the span from the DHT
  std::string max_memory;  ///< --max-memory: as many blocks as fit (chosen from the DHT)
  bool no_dht = false;
  std::string dht_listen = "127.0.0.1:0";  ///< UDP address of the membership DHT node
  std::string initial_peers;               ///< DHT nodes to join through, comma-separated
  int dht_ttl_s = 15;
  std::string metrics_listen;  ///< --metrics-listen HOST:PORT: GET /metrics (Prometheus)
  double rebalance_period_s = 90;  ///< mean seconds between rebalancing checks; 0 = never
  /// --network-speed: auto (the link profile, else the NIC, else measured
  /// against a swarm peer), measure (always measured), or a bandwidth ("20Mbit").
  std::string network_speed = "auto";
  std::int64_t cache_tokens = 8192;
  std::string weights = "f32";  ///< --weights: dtype of the linear weights inference sessions read
  bool keep_f32 = false;         ///< --keep-f32-weights: keep the f32 parameters beside --weights' copies
  std::string kv_dtype = "f32";  ///< --kv-dtype: element type of the KV cache
  std::string device = "auto";   ///< --device: where the blocks and the KV cache live
  int session_idle_s = 300;
  double batch_wait = 0.5;          ///< --batch-wait: of the last batch's time
  double batch_wait_max_ms = 50;    ///< --batch-wait-max-ms
  int drain_timeout_s = 30;
  int threads = 0;
  std::string log_level = "info";
  bool no_listen = false;          ///< --no-listen: behind NAT, reached through a relay
  std::string relays;              ///< --relay HOST:PORT[#KEY],...: relays to try first
  bool no_relay_service = false;   ///< --no-relay-service: do not relay for servers behind NAT
  double relay_rate_mbit = 256;    ///< --relay-rate: what each peer may send through this server as a relay
  std::string announce_endpoint;   ///< --announce-endpoint: what the record says instead of the bound one
  std::vector<std::string> adapters;  ///< --adapter NAME=DIR: LoRA adapters sessions may ask for
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

/// An --announce-endpoint peers can dial: tcp://HOST:PORT with a real host
/// and port (not the wildcard or port 0 that a bind may take).
void check_announced_endpoint(const std::string& endpoint) {
  if (const std::string problem = net::tcp_endpoint_problem(endpoint); !problem.empty())
    throw std::invalid_argument("--announce-endpoint: " + problem);
  const std::string host = net::tcp_endpoint_host(endpoint), port = endpoint.substr(endpoint.rfind(':') + 1);
  if (host == "*" || host == "0.0.0.0" || host == "::" || port == "*" || std::stoi(port) == 0)
    throw std::invalid_argument("--announce-endpoint " + endpoint +
                                " is not an address peers can dial: give the host and port they reach this server at");
}

/// Seconds one decode step (one row) takes through the whole span, measured
/// on a scratch session: what the server announces (throughput = 1 / it).
double measure_step_s(span_engine& e) {
  const std::string id = "corolla-calibration";
  if (!e.open_session(id, 4)) return 0;
  const Tensor x = Tensor::zeros({1, static_cast<std::int64_t>(e.config().hidden_size)});
  double best = 0;
  for (int pos = 0; pos < 3; ++pos) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!e.inference_step(id, x, pos)) break;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pos > 0) best = best == 0 ? s : std::min(best, s);  // the first step warms up
  }
  e.close_session(id);
  return best;
}


/// Bits per second this server's link carries, for the network side of its
/// announced throughput: --network-speed's figure; with auto the emulated
/// profile's bandwidth when one is set, else the fastest active NIC's rate
/// (sysfs); 0 = to be measured (measure, or auto where neither is known).
double link_bps(const serve_args& a) {
  if (a.network_speed == "measure") return 0;
  if (a.network_speed != "auto") return net::parse_link_profile("bw=" + a.network_speed).bandwidth_bps;
  if (a.node.link_profile != "none")
    if (const auto p = net::parse_link_profile(a.node.link_profile); p.bandwidth_bps > 0) return p.bandwidth_bps;
  double best = 0;
  for (const auto& c : net::nic_classes(net::discover_nics())) best = std::max(best, c.bandwidth_bps);
  return best;
}

/// What the DHT record says this server can do with `blocks` blocks whose
/// one-row step takes `step_s`: the step time per block (routing) and the
/// throughput, min(compute, network) tokens/s (block selection,
/// rebalancing, fine-tuning routes).
void set_speed(net::server_record& record, double step_s, int blocks, double bps, int hidden_size) {
  record.step_s_per_block = step_s / blocks;
  const double network_tokens_per_s = bps / (static_cast<double>(hidden_size) * 4 * 8);  // f32 rows
  record.throughput = step_s > 0 ? swarm::announced_throughput(blocks / step_s, blocks, network_tokens_per_s) : 0.0;
}

/// Joins the swarm's DHT as the flags say.
std::unique_ptr<net::membership> join_dht(const serve_args& a, std::string& endpoint) {
  net::membership_options mo;
  const auto colon = a.dht_listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : a.dht_listen.substr(colon + 1);
  if (colon == 0 || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535)
    throw std::invalid_argument("--dht-listen must be ADDRESS:PORT with a port in [0, 65535], got '" + a.dht_listen + "'");
  mo.bind_address = a.dht_listen.substr(0, colon);
  mo.port = static_cast<std::uint16_t>(std::stoul(port));
  mo.bootstrap = split_list(a.initial_peers);
  mo.ttl = std::chrono::seconds(a.dht_ttl_s);
  auto members = std::make_unique<net::membership>();
  auto ep = members->start(mo);
  if (!ep) throw std::runtime_error("cannot join the swarm's DHT: " + error_message(ep.error()));
  endpoint = *ep;
  return members;
}

/// --num-blocks: the weakest window of the swarm as the DHT shows it
/// (schedule/block_selection: gaps first, then the lowest throughputs).
std::pair<int, int> choose_span(net::membership& members, const std::string& model, const std::string& self,
                                int n_blocks, int num_blocks) {
  const auto records = members.get_span(model, 0, n_blocks);
  auto c = swarm::choose_blocks(to_swarm_state(n_blocks, records), num_blocks, 0.0, self);
  if (!c) throw std::runtime_error("cannot choose blocks: " + c.error().message);
  spdlog::info("serve: {} record(s) of {} in the DHT; the weakest window of {} block(s) is {} (swarm throughput {} -> "
               "more once this server is online)",
               records.size(), model, num_blocks, to_string(c.value().span), c.value().throughput_before);
  return {c.value().span.start, c.value().span.end};
}

/// The CPU threads a server computes with: --threads, else every core but
/// one, so that a volunteer's own machine stays usable while it serves.
int serve_threads(int flag) {
  if (flag > 0) return flag;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
}

int run_serve(serve_args a) {
  const int threads = serve_threads(a.threads);
  apply_common_options(threads, a.log_level);
  const sigset_t stop_signals = block_stop_signals();

  const model_config cfg = load_config(a.model);
  const int span_flags = !a.blocks.empty() + (a.num_blocks != 0) + !a.max_memory.empty();
  if (span_flags > 1)
    throw std::invalid_argument("give only one of --blocks A:B, --num-blocks N or --max-memory SIZE|auto");
  if (span_flags == 0) {
    if (a.no_dht)
      throw std::invalid_argument("without the DHT a server cannot choose its blocks: give --blocks A:B");
    // As a volunteer expects: as many blocks as the device holds, placed
    // where the swarm needs them.
    a.max_memory = "auto";
    spdlog::info("serve: no --blocks, --num-blocks or --max-memory: serving what --max-memory auto holds");
  }
  if (!a.metrics_listen.empty()) parse_http_listen(a.metrics_listen, "--metrics-listen");  // a bad address fails before the model loads
  const swarm::gathering_policy gathering = parse_batch_wait(a.batch_wait, a.batch_wait_max_ms);
  if ((a.num_blocks != 0 || !a.max_memory.empty()) && a.no_dht)
    throw std::invalid_argument(std::string(a.num_blocks != 0 ? "--num-blocks" : "--max-memory") +
                                " chooses blocks from the swarm's DHT: it needs the DHT (drop --no-dht)");
  if (a.cache_tokens < 1) throw std::invalid_argument("--cache-tokens must be at least 1");
  const weight_format weights = parse_weights_flag(a.weights);
  const std::vector<served_adapter> adapters = load_served_adapters(a.adapters, cfg);
  span_engine_options engine_options;
  engine_options.kv_dtype = parse_kv_dtype_flag(a.kv_dtype);
  engine_options.weights = weights;
  engine_options.keep_parameters = a.keep_f32;
  const serve_memory_flags memory_flags{a.max_memory, a.device, a.keep_f32, a.cache_tokens};
  std::optional<memory_plan> memory;
  if (!a.max_memory.empty()) memory = plan_memory(memory_flags, cfg, weights, engine_options.kv_dtype);
  const int num_blocks = memory ? memory->blocks : a.num_blocks;
  if (a.num_blocks > cfg.n_layers)
    throw std::invalid_argument("--num-blocks " + std::to_string(a.num_blocks) + " is more than the model's " +
                                std::to_string(cfg.n_layers) + " blocks");
  Backend& be = backend_for(parse_device(a.device));

  if (!memory) {
    const int span_blocks = num_blocks > 0 ? num_blocks : [&] {
      const auto [a_first, a_last] = parse_blocks(a.blocks, cfg.n_layers);
      return a_last - a_first;
    }();
    check_cache_tokens(memory_flags, cfg, span_blocks, engine_options.kv_dtype);
  }
  for (const std::string& relay : split_list(a.relays)) given_relay(relay);  // not after 30 s of dialling it
  if (a.no_listen && a.no_dht && a.relays.empty())
    throw std::invalid_argument("--no-listen needs a relay: give --relay HOST:PORT, or drop --no-dht to find one "
                                "in the swarm's DHT");
  node_options node_opts = a.node.options();
  if (a.no_listen && !a.announce_endpoint.empty())
    throw std::invalid_argument("--announce-endpoint is for servers that listen (drop --no-listen)");
  if (!a.announce_endpoint.empty()) check_announced_endpoint(a.announce_endpoint);
  if (a.no_listen) node_opts.listen = "";  // behind NAT: nobody can dial in
  node_opts.relay_service = !a.no_listen && !a.no_relay_service;
  node_opts.relay_rate = a.relay_rate_mbit * 1e6 / 8;
  node_opts.accept_relayed = true;  // a server that turns out unreachable is reached through a relay
  auto started = node::start(node_opts);
  if (!started) throw std::runtime_error(error_message(started.error()));
  auto& n = **started;
  span_server_options so;
  so.model = model_id_of(a.model);
  so.session_idle_timeout = std::chrono::seconds(a.session_idle_s);
  so.gathering = gathering;

  // Membership (docs/swarm_serving.md): join, choose blocks when asked,
  // announce JOINING while loading, ONLINE once serving; refreshed until the
  // server leaves.
  std::string dht_endpoint;
  std::unique_ptr<net::membership> members = a.no_dht ? nullptr : join_dht(a, dht_endpoint);
  const auto [first, last] = num_blocks > 0 ? choose_span(*members, so.model, n.id(), cfg.n_layers, num_blocks)
                                              : parse_blocks(a.blocks, cfg.n_layers);
  net::server_record record;  ///< what this server announces
  record.model = so.model;
  record.node_id = n.id();
  record.endpoint = a.announce_endpoint.empty() ? n.endpoint() : a.announce_endpoint;
  record.span = {first, last};
  record.state = server_state::joining;
  record.protocol_version = net::protocol_version;
  record.public_key = n.public_key();
  record.weights = weight_format_name(weights);
  record.adapters = announced_adapters(adapters);
  // Behind NAT (--no-listen, or nobody could dial us back): a relay first,
  // so that the record says how to reach us.
  const bool relayed =
      a.no_listen || (members && !reachable_from_swarm(n, *members, so.model, cfg.n_layers, record.endpoint));
  record.relay_service = node_opts.relay_service && !relayed;
  std::unique_ptr<relay_keeper> keeper;
  const auto relay_grace = 2 * node_opts.peer_timeout;
  if (relayed) {
    keeper = std::make_unique<relay_keeper>(n, split_list(a.relays), members.get(), so.model, cfg.n_layers);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!keeper->keep(record, relay_grace) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (!keeper->has_relay())
      throw std::runtime_error(
          "this server cannot be dialled and no relay answered within 30 s (give --relay HOST:PORT of a server that "
          "listens, or start one in the swarm first: listening servers relay unless started with --no-relay-service)");
  }
  if (members)
    if (auto err = members->announce(record)) throw std::runtime_error("cannot announce in the DHT: " + error_message(err));

  // Loading takes a while for real models: a bar on a terminal, a line in logs.
  const auto load_start = std::chrono::steady_clock::now();
  progress_bar bar(true);
  const std::string label = "serve: loading blocks [" + std::to_string(first) + ", " + std::to_string(last) + ")";
  engine_options.on_block_loaded = [&](int done, int total) {
    bar.draw(label, done, total);
    spdlog::debug("serve: loaded block {} ({} of {})", first + done - 1, done, total);
  };
  auto engine = std::make_shared<span_engine>(
      span_engine::load(checkpoint::open(a.model), cfg, first, last, be,
                        cache_tokens_for(memory_flags, memory, last - first, engine_options.page_tokens), engine_options));
  engine_options.on_block_loaded = nullptr;  // later loads (moves) run while serving
  hold_adapters(*engine, adapters);
  bar.finish();
  spdlog::info("serve: loaded blocks [{}, {}) in {:.1f} s on {} thread(s)", first, last,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count(), threads);
  const double step_s = measure_step_s(*engine);
  auto server = start_span_server(n, engine, so);
  if (!server) throw std::runtime_error(error_message(server.error()));
  record.state = server_state::online;
  double bps = link_bps(a);
  if (bps <= 0 && members) bps = measure_network_bps(n, *members, record, cfg.n_layers);
  set_speed(record, step_s, last - first, bps, static_cast<int>(cfg.hidden_size));
  if (bps > 0)
    spdlog::info("serve: one-row step {:.2f} ms over {} block(s), link {:.0f} Mbit/s: announcing {:.1f} tokens/s",
                 step_s * 1e3, last - first, bps / 1e6, record.throughput);
  else
    spdlog::info("serve: one-row step {:.2f} ms over {} block(s), link speed not known yet (no other server to "
                 "measure against): announcing the compute figure, {:.1f} tokens/s",
                 step_s * 1e3, last - first, record.throughput);
  record.cache_tokens_left = engine->cache_tokens_left();
  if (members)
    if (auto err = members->update(record)) throw std::runtime_error("cannot announce in the DHT: " + error_message(err));

  std::string line = "corolla serve " + n.id() + " blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                     ") of " + so.model +
                     (keeper ? " reached through relay " + keeper->relay_id() + " at " + keeper->relay_endpoint()
                             : " listening on " + n.endpoint());
  if (!n.public_key().empty()) line += " curve-key " + n.public_key();
  if (!dht_endpoint.empty()) line += " dht " + dht_endpoint;
  // GET /metrics: the span server's counters and the node's links, asked
  // for at every scrape (api/server_metrics.hpp).
  std::unique_ptr<api::metrics_server> metrics;
  if (!a.metrics_listen.empty()) {
    const auto [mhost, mport] = parse_http_listen(a.metrics_listen, "--metrics-listen");
    metrics = std::make_unique<api::metrics_server>(
        [&n, actor = *server, history = api::link_history()]() mutable {
          auto stats = span_server_stats_of(n.system(), actor);
          if (!stats) throw std::runtime_error("the span server did not answer: " + error_message(stats.error()));
          const node_traffic traffic = history.totals(n.traffic());
          return api::render_server_metrics(n.id(), *stats, traffic, history.by_peer(n.links()));
        });
    line += " metrics http://" + mhost + ":" + std::to_string(metrics->start(mhost, mport));
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  spdlog::info("serve: blocks [{}, {}) of {} ({} layers), {} weights, {} KV cache for {} tokens ({:.1f} MiB)", first,
               last, so.model, cfg.n_layers, weight_format_name(weights), dtype_name(engine_options.kv_dtype),
               engine->cache_tokens(),
               static_cast<double>(engine->cache_tokens() * engine->kv_bytes_per_token()) / (1 << 20));

  // While serving, the DHT record follows the cache left (every third of
  // the record's TTL, as often as it is refreshed), and every rebalancing
  // period (randomised, so servers do not all check at once) the server asks
  // block_selection whether moving would make the swarm stronger, and moves.
  const char* sig = nullptr;
  const auto update_every = std::chrono::milliseconds(a.dht_ttl_s * 1000 / 3);
  std::mt19937_64 rng(std::random_device{}());
  auto next_period = [&] {
    std::uniform_real_distribution<double> d(a.rebalance_period_s * 2.0 / 3, a.rebalance_period_s * 4.0 / 3);
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<long>(d(rng) * 1000));
  };
  auto next_check = next_period();
  auto next_update = std::chrono::steady_clock::now() + update_every;
  while (!(sig = members || keeper ? wait_for_stop_signal(stop_signals, std::chrono::milliseconds(250))
                                    : wait_for_stop_signal(stop_signals))) {
    if (keeper && keeper->keep(record, relay_grace)) {
      std::printf("corolla serve %s reached through relay %s at %s\n", n.id().c_str(), keeper->relay_id().c_str(),
                  keeper->relay_endpoint().c_str());
      std::fflush(stdout);
      if (members)
        if (auto err = members->update(record)) spdlog::warn("serve: announcing the new relay: {}", error_message(err));
    }
    if (!members) continue;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_update) {
      next_update = now + update_every;
      bool changed = false;
      // Not measured yet (no other server was there): try again.
      if (bps <= 0)
        if (bps = measure_network_bps(n, *members, record, cfg.n_layers); bps > 0) {
          set_speed(record, record.step_s_per_block * record.span.length(), record.span.length(), bps,
                    static_cast<int>(cfg.hidden_size));
          spdlog::info("serve: link {:.0f} Mbit/s: announcing {:.1f} tokens/s", bps / 1e6, record.throughput);
          changed = true;
        }
      // Routing follows the step time the span actor measures while
      // serving (a moving average over its batches), once it has one, and
      // the cache it can give a new session (parked sessions' pages count
      // as free: they are taken back when needed); the engine's own figure
      // if the actor does not answer.
      remote_message ask;
      ask.type = span_request::info;
      std::optional<span_info> info;
      if (auto r = n.request(n.id(), "span", std::move(ask), std::chrono::seconds(2)))
        if (auto i = decode_span_info(r->body)) info = std::move(*i);
      if (info && info->step_s_per_block > 0 && info->step_s_per_block != record.step_s_per_block) {
        record.step_s_per_block = info->step_s_per_block;
        changed = true;
      }
      if (const auto left = info ? info->cache_tokens_left : engine->cache_tokens_left();
          left != record.cache_tokens_left) {
        record.cache_tokens_left = left;
        changed = true;
      }
      if (auto rtts = next_server_rtts(n, *members, record, cfg.n_layers); rtts != record.rtt_ms) {
        record.rtt_ms = std::move(rtts);
        set_next_rtts(*server, record.rtt_ms);  // span.info announces them too
        changed = true;
      }
      if (changed)
        if (auto err = members->update(record)) spdlog::warn("serve: updating the DHT record: {}", error_message(err));
    }
    if (a.rebalance_period_s <= 0 || now < next_check) continue;
    next_check = next_period();
    const auto records = members->get_span(so.model, 0, cfg.n_layers);
    const auto d = swarm::should_move(to_swarm_state(cfg.n_layers, records), n.id());
    spdlog::debug("serve: rebalancing check: {} ({})", swarm::to_string(d.reason), d.explanation);
    if (!d.move) continue;
    spdlog::info("serve: moving from {} to {}: {}", to_string(d.current), to_string(d.target),
                 d.explanation);
    // Load the new blocks while the old ones still serve, switch, then tell
    // the swarm: the old blocks have other servers (should_move never opens
    // a gap); sessions already open here finish on the old blocks.
    // Under --max-memory the old blocks and their cache still hold the
    // budget while the new ones load: the new cache takes its pages as
    // sessions need them instead of the whole remainder up front (which
    // would need the budget twice). A load that fails leaves the server
    // where it is.
    span_engine_options move_options = engine_options;
    if (memory) move_options.cache_allocation = kv_allocation::lazy;
    std::shared_ptr<span_engine> next;
    try {
      next = std::make_shared<span_engine>(span_engine::load(
          checkpoint::open(a.model), cfg, d.target.start, d.target.end, be,
          cache_tokens_for(memory_flags, memory, d.target.length(), engine_options.page_tokens), move_options));
      hold_adapters(*next, adapters);
    } catch (const std::exception& e) {
      spdlog::error("serve: loading {} to move there failed, staying on {}: {}", to_string(d.target),
                    to_string(d.current), e.what());
      continue;
    }
    const double next_step_s = measure_step_s(*next);
    if (auto err = swap_span_engine(n.system(), *server, next)) {
      spdlog::error("serve: switching to {} failed: {}", to_string(d.target), error_message(err));
      continue;
    }
    engine = next;
    members->withdraw_offline(record.model, record.node_id, record.span);
    record.span = {d.target.start, d.target.end};
    set_speed(record, next_step_s, d.target.length(), bps, static_cast<int>(cfg.hidden_size));
    record.cache_tokens_left = engine->cache_tokens_left();
    if (auto err = members->announce(record)) spdlog::error("serve: announcing {} failed: {}", to_string(d.target), error_message(err));
    std::printf("corolla serve %s moved to blocks [%d, %d)\n", n.id().c_str(), d.target.start, d.target.end);
    std::fflush(stdout);
  }
  spdlog::info("serve {}: {} received, stopping", n.id(), sig);
  if (members) members->withdraw_offline();  // clients stop routing here at once
  drain(n, *server, stop_signals, std::chrono::seconds(a.drain_timeout_s));
  caf::anon_send_exit(*server, caf::exit_reason::user_shutdown);
  n.stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<serve_args>();
  auto* cmd = app.add_subcommand("serve", "Serve a span of a model's blocks to swarm clients until SIGINT/SIGTERM");
  cmd->add_option("--model", a->model, "HuggingFace model directory (only the span's tensors are loaded)")->required();
  cmd->add_option("--blocks", a->blocks,
                  "Blocks to serve, A:B for [A, B) (without --blocks, --num-blocks or --max-memory: --max-memory "
                  "auto, which needs the DHT)");
  cmd->add_option("--num-blocks", a->num_blocks,
                  "Serve this many consecutive blocks where the swarm is weakest (read from its DHT) instead of --blocks")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-memory", a->max_memory,
                  "Serve as many consecutive blocks as fit in this much memory (e.g. 6GiB, 512MiB: weights and the "
                  "KV cache for --cache-tokens), placed where the swarm is weakest (read from its DHT); the KV "
                  "cache then gets all the memory the blocks' weights leave. auto: the GPU's free memory less "
                  "5 % (at least 1 GiB), or half the host's available memory on the cpu");
  cmd->add_option("--cache-tokens", a->cache_tokens,
                  "Attention-cache budget in tokens over all sessions (with --max-memory: the least a block needs "
                  "room for)")
      ->capture_default_str();
  cmd->add_option("--device", a->device, "Where the served blocks and their KV cache live: auto (cuda:0 when a GPU is visible), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype,
                  "Element type of the KV cache: f32, or bf16/f16 (half the bytes per token: twice the tokens "
                  "per budget; keys and values rounded once as stored)")
      ->capture_default_str();
  cmd->add_option("--weights", a->weights,
                  "Linear weights inference sessions read: f32, bf16 (copies made at load: half the bytes per "
                  "token), int8 (quantised at load per output channel: a quarter) or nf4 (4-bit NormalFloat in "
                  "blocks of 64: about an eighth). Each block is converted as it loads and its f32 parameters "
                  "freed, so the server holds these copies only; fine-tuning requests compute with them, widened "
                  "one block at a time")
      ->capture_default_str();
  cmd->add_option("--adapter", a->adapters,
                  "A LoRA adapter (PEFT directory, as `corolla train --lora-rank` saves) that sessions may ask for "
                  "by NAME (`generate --swarm --adapter NAME`): NAME=DIR, or DIR named by its last component. "
                  "Repeatable; sessions of different adapters and of none share the weights and the decode batch")
      ->type_name("NAME=DIR");
  cmd->add_flag("--keep-f32-weights", a->keep_f32,
                "With --weights other than f32: also keep the f32 parameters (fine-tuning requests then compute "
                "with the exact f32 weights; the blocks take that much more memory)");
  cmd->add_option("--batch-wait", a->batch_wait,
                  "How long a decode batch waits for the sessions of the last two batches that have not sent their "
                  "next step yet, as a fraction of the last batch's time (0: no wait)")
      ->capture_default_str();
  cmd->add_option("--batch-wait-max-ms", a->batch_wait_max_ms, "The most that wait lasts, in ms (0: no wait)")
      ->capture_default_str();
  cmd->add_option("--session-idle-s", a->session_idle_s, "Close sessions unused this many seconds")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->add_option("--drain-timeout-s", a->drain_timeout_s,
                  "On SIGINT/SIGTERM, serve the open sessions (refusing new ones) for at most this long before "
                  "stopping; a second signal stops at once (0 = stop at once)")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  a->node.add_to(cmd, "server");
  cmd->add_option("--initial-peers", a->initial_peers,
                  "DHT nodes of the swarm to join through (HOST:PORT,...; the 'dht' address other servers "
                  "print); none: start a new swarm");
  cmd->add_option("--dht-listen", a->dht_listen, "UDP address of this server's DHT node (port 0 = any)")
      ->capture_default_str();
  cmd->add_option("--metrics-listen", a->metrics_listen,
                  "HOST:PORT to serve Prometheus metrics on (GET /metrics: steps and their times, sessions, cache, "
                  "links; port 0 = any)");
  cmd->add_option("--dht-ttl-s", a->dht_ttl_s, "Validity of the server's DHT record without refresh")
      ->check(CLI::Range(1, 300))
      ->capture_default_str();
  cmd->add_option("--network-speed", a->network_speed,
                  "The network side of the throughput this server announces: auto (the --link-profile's bandwidth, "
                  "else the NIC's rate, else measured against another server of the swarm), measure (always "
                  "measured), or a bandwidth such as 20Mbit (an uplink slower than the NIC)")
      ->check([](const std::string& v) -> std::string {
        if (v == "auto" || v == "measure") return {};
        try {
          if (net::parse_link_profile("bw=" + v).bandwidth_bps > 0) return {};
        } catch (const std::exception&) {
        }
        return "expected auto, measure or a bandwidth above 0 such as 20Mbit, got '" + v + "'";
      })
      ->capture_default_str();
  cmd->add_flag("--no-dht", a->no_dht, "Do not join or announce in a DHT (clients are given the endpoint)");
  cmd->add_option("--rebalance-period-s", a->rebalance_period_s,
                  "Mean seconds between checks whether moving to other blocks would strengthen the swarm "
                  "(randomised by +-1/3; 0 = never move)")
      ->check(finite_between(0, 86400))
      ->capture_default_str();
  cmd->add_flag("--no-listen", a->no_listen,
               "Open no listening socket (a machine behind NAT): keep a connection to a relay instead, chosen "
               "from the swarm's DHT or given with --relay, and announce that clients reach this server through it");
  cmd->add_option("--announce-endpoint", a->announce_endpoint,
                  "Endpoint to announce instead of the one bound (port forwarding, a 0.0.0.0 bind); a server of "
                  "the swarm dials it back, and a server it cannot reach uses a relay");
  cmd->add_option("--relay", a->relays,
                  "Relays to try first when this server cannot be dialled (--no-listen, or a failed dial-back): "
                  "HOST:PORT[#CURVEKEY],... (any server that listens)");
  cmd->add_flag("--no-relay-service", a->no_relay_service,
                "Do not pass messages on for servers behind NAT (a listening server does by default)");
  cmd->add_option("--relay-rate", a->relay_rate_mbit,
                  "Mbit/s each peer may send through this server as a relay, on average, in bursts of 8 s of it; "
                  "what goes over is refused (0 = no limit)")
      ->check(finite_at_least(0))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "CPU threads (0 = every core but one, so the machine stays usable while it serves)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([&action, a] { action = [a] { return run_serve(*a); }; });
}

}  // namespace corolla::app
