// corolla bench serve — a swarm server's decode under concurrent sessions
// against one session, in the same run. The server is the span server actor
// that `corolla serve` runs (actors/span_server.hpp) over every block of the
// model on --device, with --weights inference weights and a KV cache of
// --kv-dtype allocated up front at --max-memory (what is left after the
// weights) or --cache-tokens; clients reach it over loopback ZeroMQ, one
// thread, swarm client and session each (actors/swarm_client.hpp), sending
// one-row steps of hidden states: the server's work only, no head. Per
// --sessions level:
//  * aggregate decode tokens/s through the server, each session's, the
//    steps' latency and the server's mean batch (its counters), and the
//    ratio to one session;
//  * the engine's own decode_batch over the same sessions without the actor
//    and the wire, measured first (what the wire and batching by mailbox
//    cost);
//  * one session against the memory-bandwidth bound of the blocks' weights
//    (the device's HBM, or the host's; apps/bench_common.hpp);
//  * with --link-profile (each session then on a client node, so a link, of
//    its own), every level against what the link allows: S sessions at most
//    S / (the link's time per step + S / the engine's tokens/s).
// Prints a table and one JSON line.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "actors/swarm_client.hpp"
#include "apps/bench_common.hpp"
#include "apps/bench_engine.hpp"
#include "apps/commands.hpp"
#include "apps/serve_memory.hpp"
#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "net/shaping.hpp"
#include "schedule/block_selection.hpp"

namespace corolla::app {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

struct serve_bench_options {
  bench_common common;
  std::vector<int> sessions{1, 16};
  int prompt_tokens = 128;
  int new_tokens = 64;
  int rounds = 2;
  std::string weights = "f32";
  std::string kv_dtype = "f32";
  std::string max_memory;
  std::int64_t cache_tokens = 8192;
  std::string link_profile = "none";
  double batch_wait = 0.5;
  double batch_wait_max_ms = 50;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// The value at fraction q of `v` (sorted copy).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

/// The KV cache the server holds: its tokens, and where the figure came from.
struct cache_plan {
  std::int64_t tokens = 0;
  std::int64_t budget_bytes = 0;     ///< --max-memory, 0 without
  std::int64_t weight_bytes = 0;     ///< the served blocks' weights (and the f32 block set aside)
  std::size_t bytes_per_token = 0;   ///< keys and values over every block
};

/// --max-memory (`budget_bytes`, read by the caller): the tokens left after
/// the weights `corolla serve --weights` holds for every block
/// (model/block.hpp served_block_bytes; with 16-bit or quantised weights one
/// block of f32 set aside), in whole pages, as serve gives them to its cache
/// (schedule/block_selection.hpp cache_tokens_that_fit); else
/// --cache-tokens. Throws std::invalid_argument when the budget holds no
/// page, or the cache cannot hold `sessions` sessions of `tokens`.
cache_plan plan_cache(const serve_bench_options& o, const model_config& cfg, weight_format weights, dtype kv,
                      std::int64_t budget_bytes, int page_tokens, int sessions, int tokens) {
  cache_plan p;
  p.bytes_per_token = span_engine::kv_bytes_per_token(cfg, cfg.n_layers, kv);
  const auto mib = [](double b) { return b / (1 << 20); };
  if (o.max_memory.empty()) {
    if (o.cache_tokens < 1) throw std::invalid_argument("bench serve: --cache-tokens must be at least 1");
    p.tokens = (o.cache_tokens + page_tokens - 1) / page_tokens * page_tokens;
  } else {
    p.budget_bytes = budget_bytes;
    const swarm::memory_budget m =
        served_memory_budget(static_cast<std::uint64_t>(p.budget_bytes), cfg, weights, false, 0);
    p.weight_bytes = static_cast<std::int64_t>(m.bytes_per_block * cfg.n_layers + m.reserved_bytes);
    const std::int64_t page_bytes = static_cast<std::int64_t>(p.bytes_per_token) * page_tokens;
    p.tokens = swarm::cache_tokens_that_fit(m, static_cast<int>(cfg.n_layers), span_engine::kv_bytes_per_token(cfg, 1, kv),
                                            page_tokens, 0)
                   .value();
    if (p.tokens < 1) {
      char why[200];
      std::snprintf(why, sizeof why, "leaves no room for a page of KV cache (%.3f MiB) after the weights (%.3f MiB)",
                    mib(static_cast<double>(page_bytes)), mib(static_cast<double>(p.weight_bytes)));
      throw std::invalid_argument("bench serve: --max-memory " + o.max_memory + " " + why);
    }
  }
  const std::int64_t per_session = (tokens + page_tokens - 1) / page_tokens * page_tokens;
  if (p.tokens < per_session * sessions)
    throw std::invalid_argument("bench serve: the KV cache holds " + std::to_string(p.tokens) + " tokens; " +
                                std::to_string(sessions) + " sessions of " + std::to_string(tokens) +
                                " tokens need " + std::to_string(per_session * sessions) +
                                " (give more --max-memory or --cache-tokens, fewer --sessions or shorter runs)");
  return p;
}

/// One --sessions level, measured both ways.
struct level_result {
  int sessions = 0;
  double engine_tokens_per_s = 0;  ///< best over rounds
  double server_tokens_per_s = 0;  ///< best over rounds
  std::vector<double> session_tokens_per_s;  ///< each session's, in the best server round
  std::vector<double> step_s;                ///< every timed step's latency through the server, all rounds
  std::uint64_t batches = 0, steps = 0;      ///< the server's counters over the timed steps, all rounds
  std::uint64_t waits = 0;                   ///< batches that waited for late sessions (same steps)
};


/// `sessions` client threads through `server` on `server_node`: each opens a
/// session (session s on clients[s % clients.size()]), prefills, takes two
/// warm-up steps, waits for the others, then takes `new_tokens` timed
/// one-row steps. Adds to `r`; returns tokens/s.
double run_server(const std::vector<node*>& clients, node& server_node, const caf::actor& server, int sessions,
                  const Tensor& prompt, const Tensor& row, int new_tokens, level_result& r) {
  const std::int64_t P = prompt.dim(0);
  std::barrier sync(sessions + 1);
  std::mutex mu;
  std::string failure;
  std::vector<std::vector<double>> step_s(static_cast<std::size_t>(sessions));
  std::vector<double> session_s(static_cast<std::size_t>(sessions));
  std::vector<clock_type::time_point> done(static_cast<std::size_t>(sessions));
  auto fail = [&](const std::string& what) {
    std::lock_guard lock(mu);
    if (failure.empty()) failure = what;
  };
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s)
    threads.emplace_back([&, s] {
      const auto u = static_cast<std::size_t>(s);
      bool ok = false;
      std::unique_ptr<swarm_session> session;
      swarm_client_options so;
      so.servers = {server_node.endpoint()};
      swarm_client client(*clients[u % clients.size()], so);
      if (auto err = client.refresh()) {
        fail("refresh: " + error_message(err));
      } else if (auto opened = client.open_session(P + new_tokens + 2); !opened) {
        fail("open: " + error_message(opened.error()));
      } else {
        session = std::move(*opened);
        ok = session->step(prompt, 0) && session->step(row, P) && session->step(row, P + 1);
        if (!ok) fail("prefill or warm-up step failed");
      }
      sync.arrive_and_wait();  // everyone warm
      sync.arrive_and_wait();  // the clock runs
      if (!ok) return;
      const auto t0 = clock_type::now();
      for (int t = 0; t < new_tokens; ++t) {
        const auto ts = clock_type::now();
        if (auto out = session->step(row, P + 2 + t); !out) {
          fail("step " + std::to_string(t) + ": " + error_message(out.error()));
          return;
        }
        step_s[u].push_back(seconds_since(ts));
      }
      done[u] = clock_type::now();
      session_s[u] = std::chrono::duration<double>(done[u] - t0).count();
      session->close();
    });
  sync.arrive_and_wait();
  auto before = span_server_stats_of(server_node.system(), server);
  const auto t0 = clock_type::now();
  sync.arrive_and_wait();
  for (auto& t : threads) t.join();
  if (!failure.empty()) throw std::runtime_error("bench serve: a session failed: " + failure);
  const auto end = *std::max_element(done.begin(), done.end());
  const double wall = std::chrono::duration<double>(end - t0).count();
  auto after = span_server_stats_of(server_node.system(), server);
  if (before && after) {
    r.batches += after->decode_batches - before->decode_batches;
    r.steps += after->decode_steps - before->decode_steps;
    r.waits += after->decode_waits - before->decode_waits;
  }
  const double tps = sessions * new_tokens / wall;
  if (tps > r.server_tokens_per_s) {
    r.session_tokens_per_s.clear();
    for (double sec : session_s) r.session_tokens_per_s.push_back(new_tokens / sec);
  }
  for (auto& v : step_s) r.step_s.insert(r.step_s.end(), v.begin(), v.end());
  return tps;
}

int run_serve_bench(serve_bench_options o) {
  apply_common_options(o.common.threads, "warn");
  const weight_format weights = parse_weights_flag(o.weights);
  const dtype kv = parse_kv_dtype_flag(o.kv_dtype);
  if (o.sessions.empty() || *std::min_element(o.sessions.begin(), o.sessions.end()) < 1 ||
      *std::max_element(o.sessions.begin(), o.sessions.end()) > 256)
    throw std::invalid_argument("bench serve: --sessions takes levels from 1 to 256");
  if (std::find(o.sessions.begin(), o.sessions.end(), 1) == o.sessions.end()) o.sessions.push_back(1);
  std::sort(o.sessions.begin(), o.sessions.end());
  o.sessions.erase(std::unique(o.sessions.begin(), o.sessions.end()), o.sessions.end());
  if (o.rounds < 1) throw std::invalid_argument("bench serve: --rounds must be at least 1");
  const net::link_profile link = net::parse_link_profile(o.link_profile);
  const swarm::gathering_policy gathering = parse_batch_wait(o.batch_wait, o.batch_wait_max_ms);

  Backend& be = backend_for(parse_device(o.common.device));
  // auto is read before the model's f32 parameters take their share.
  const std::int64_t budget_bytes =
      o.max_memory.empty() ? 0 : parse_memory_budget(o.max_memory, "--max-memory", be.dev());
  std::optional<transformer> model(open_model(o.common, be));
  const model_config cfg = model->config();
  if (o.prompt_tokens < 1 || o.new_tokens < 2 || o.prompt_tokens + o.new_tokens + 2 > cfg.max_positions)
    throw std::invalid_argument("bench serve: need --prompt-tokens >= 1, --new-tokens >= 2 and their sum + 2 within "
                                "the context of " + std::to_string(cfg.max_positions));
  span_engine_options eo;
  eo.weights = weights;
  eo.kv_dtype = kv;
  eo.cache_allocation = kv_allocation::up_front;
  const cache_plan cache = plan_cache(o, cfg, weights, kv, budget_bytes, eo.page_tokens, o.sessions.back(),
                                      o.prompt_tokens + o.new_tokens + 2);
  const double block_bytes = decode_bytes_per_token(*model, weights, false);
  const long long params = cfg.parameter_count();
  if (!o.common.json)
    std::fprintf(stderr, "bench serve: %s, %.1fM parameters, all %d blocks on %s, %s weights, %s KV cache of %lld "
                 "tokens; measuring...\n", cfg.hf_architecture.c_str(), static_cast<double>(params) / 1e6,
                 cfg.n_layers, be.name().c_str(), weight_format_name(weights), dtype_name(kv),
                 static_cast<long long>(cache.tokens));
  // The server holds what `serve --weights` holds: with other than f32, the
  // inference weights alone (the model's f32 parameters go with it).
  stage blocks = served_blocks(model, weights, be);
  const auto alloc_t0 = clock_type::now();
  auto engine = std::make_shared<span_engine>(std::move(blocks), cache.tokens, eo);
  const double alloc_s = seconds_since(alloc_t0);

  const std::int64_t D = cfg.hidden_size;
  const Tensor prompt = random_rows(o.prompt_tokens, D, o.common.seed + 11);
  const Tensor row = random_rows(1, D, o.common.seed + 12);
  const bandwidth_result bw = measure_bound_bandwidth(be.dev());

  std::vector<level_result> levels;
  for (int s : o.sessions) {
    levels.emplace_back();
    levels.back().sessions = s;
  }
  // The engine alone first: nothing else calls it until the server starts.
  for (int round = 0; round < o.rounds; ++round)
    for (level_result& l : levels)
      l.engine_tokens_per_s =
          std::max(l.engine_tokens_per_s, engine_decode_tokens_per_s(*engine, l.sessions, prompt, row, o.new_tokens, std::to_string(round)));

  // Over an emulated link every session has a node, so a link, of its own
  // (a volunteer's client on its own machine); the server shapes its
  // replies on each as the client's hello asks. Unshaped, the sessions
  // share one client node.
  node_options server_opts;
  auto server_node = node::start(server_opts);
  if (!server_node) throw std::runtime_error("bench serve: server node: " + error_message(server_node.error()));
  auto server = start_span_server(**server_node, engine, {.model = "bench", .gathering = gathering});
  if (!server) throw std::runtime_error("bench serve: span server: " + error_message(server.error()));
  node_options client_opts;
  client_opts.listen = "";
  client_opts.link_profile = o.link_profile;
  std::vector<std::unique_ptr<node>> client_nodes;
  std::vector<node*> clients;
  for (int i = 0; i < (link.unshaped() ? 1 : o.sessions.back()); ++i) {
    auto client_node = node::start(client_opts);
    if (!client_node) throw std::runtime_error("bench serve: client node: " + error_message(client_node.error()));
    client_nodes.push_back(std::move(*client_node));
    clients.push_back(client_nodes.back().get());
  }
  // Rounds alternate the order of the levels, so drift hits them alike.
  for (int round = 0; round < o.rounds; ++round)
    for (std::size_t i = 0; i < levels.size(); ++i) {
      level_result& l = levels[round % 2 == 0 ? i : levels.size() - 1 - i];
      l.server_tokens_per_s =
          std::max(l.server_tokens_per_s, run_server(clients, **server_node, *server, l.sessions,
                                                     prompt, row, o.new_tokens, l));
    }

  const level_result& one = levels.front();
  const double bound = bw.read_gbps * 1e9 / block_bytes;
  // What the link adds to every step: both ways' latency, their mean
  // jitter and the row's transmission each way (f32 hidden states; the
  // messages' own headers not counted, so the bound is a little high).
  const double row_bits = 8.0 * 4.0 * static_cast<double>(D);
  const double link_s = 2 * link.latency_s + link.jitter_s +
                        (link.bandwidth_bps > 0 ? 2 * row_bits / link.bandwidth_bps : 0.0);
  json jl = json::array();
  for (const level_result& l : levels) {
    const double mean_batch = l.batches ? static_cast<double>(l.steps) / static_cast<double>(l.batches) : 0.0;
    // Every session waits for the link and its batch: S sessions at most
    // S / (link + S / engine) tokens/s (the engine's own rate unshaped).
    const double link_bound = l.sessions / (link_s + l.sessions / l.engine_tokens_per_s);
    jl.push_back({{"sessions", l.sessions},
                  {"server_tokens_per_s", l.server_tokens_per_s},
                  {"engine_tokens_per_s", l.engine_tokens_per_s},
                  {"server_vs_one_session", l.server_tokens_per_s / one.server_tokens_per_s},
                  {"engine_vs_one_session", l.engine_tokens_per_s / one.engine_tokens_per_s},
                  {"server_vs_engine", l.server_tokens_per_s / l.engine_tokens_per_s},
                  {"session_tokens_per_s_median", quantile(l.session_tokens_per_s, 0.5)},
                  {"step_ms_p50", 1e3 * quantile(l.step_s, 0.5)},
                  {"step_ms_p90", 1e3 * quantile(l.step_s, 0.9)},
                  {"server_decode_steps", l.steps},
                  {"server_batches", l.batches},
                  {"mean_batch", mean_batch},
                  {"server_decode_waits", l.waits},
                  {"link_bound_tokens_per_s", link_bound},
                  {"server_vs_link_bound", l.server_tokens_per_s / link_bound}});
  }
  const level_result& most = levels.back();
  json j = {{"bench", "serve"},
            {"device", be.name()},
            {"weights", weight_format_name(weights)},
            {"kv_dtype", dtype_name(kv)},
            {"params", params},
            {"blocks", cfg.n_layers},
            {"threads", cpu_threads()},
            {"prompt_tokens", o.prompt_tokens},
            {"new_tokens", o.new_tokens},
            {"rounds", o.rounds},
            {"link", net::describe(link)},
            {"link_ms_per_step", 1e3 * link_s},
            {"batch_wait", o.batch_wait},
            {"batch_wait_max_ms", o.batch_wait_max_ms},
            {"kv_cache",
             {{"tokens", engine->cache_tokens()},
              {"bytes_per_token", cache.bytes_per_token},
              {"bytes", engine->pool().max_pages() * static_cast<std::int64_t>(engine->pool().page_bytes())},
              {"allocated_up_front", engine->pool().pages_allocated() == engine->pool().max_pages()},
              {"allocation_s", alloc_s},
              {"max_memory_bytes", cache.budget_bytes},
              {"weight_bytes", cache.weight_bytes},
              {"from", o.max_memory.empty() ? "--cache-tokens" : "--max-memory"}}},
            {"read_bandwidth_gbps", bw.read_gbps},
            {"weight_bytes_per_token", block_bytes},
            {"bandwidth_bound_tokens_per_s", bound},
            {"one_session_vs_bound", one.server_tokens_per_s / bound},
            {"levels", jl},
            {"sessions", most.sessions},
            {"aggregate_vs_one_session", most.server_tokens_per_s / one.server_tokens_per_s},
            {"step_graph_counts", step_graph_report()}};
  if (!o.common.json) {
    const auto& kvj = j["kv_cache"];
    if (cache.budget_bytes > 0)
      std::printf("KV cache                %lld tokens of %s at --max-memory %s (%.1f MiB; %.1f MiB of weights; "
                  "%.3f MiB per token), allocated up front in %.2f s\n",
                  static_cast<long long>(engine->cache_tokens()), dtype_name(kv), o.max_memory.c_str(),
                  kvj["bytes"].get<double>() / (1 << 20), static_cast<double>(cache.weight_bytes) / (1 << 20),
                  static_cast<double>(cache.bytes_per_token) / (1 << 20), alloc_s);
    else
      std::printf("KV cache                %lld tokens of %s (--cache-tokens; %.1f MiB, %.3f MiB per token), "
                  "allocated up front in %.2f s\n",
                  static_cast<long long>(engine->cache_tokens()), dtype_name(kv),
                  kvj["bytes"].get<double>() / (1 << 20), static_cast<double>(cache.bytes_per_token) / (1 << 20),
                  alloc_s);
    std::printf("read bandwidth          %8.2f GB/s; blocks' weights %.1f MB per token (%s): bound %.2f tokens/s\n",
                bw.read_gbps, block_bytes / 1e6, weight_format_name(weights), bound);
    const bool shaped = !link.unshaped();
    if (shaped)
      std::printf("link                    %s, each session on its own: %.2f ms a step (both ways' latency, mean "
                  "jitter, a row each way); bound = sessions / (link + sessions / engine tok/s)\n",
                  net::describe(link).c_str(), 1e3 * link_s);
    std::printf("%8s %14s %14s %10s %12s %10s %10s %10s %9s%s\n", "sessions", "server tok/s", "engine tok/s",
                "vs 1", "per session", "step p50", "step p90", "mean batch", "vs engine", shaped ? "   vs bound" : "");
    for (const json& l : jl) {
      std::printf("%8d %14.2f %14.2f %9.2fx %12.2f %8.2fms %8.2fms %10.2f %8.2fx", l["sessions"].get<int>(),
                  l["server_tokens_per_s"].get<double>(), l["engine_tokens_per_s"].get<double>(),
                  l["server_vs_one_session"].get<double>(), l["session_tokens_per_s_median"].get<double>(),
                  l["step_ms_p50"].get<double>(), l["step_ms_p90"].get<double>(), l["mean_batch"].get<double>(),
                  l["server_vs_engine"].get<double>());
      if (shaped) std::printf(" %10.2fx", l["server_vs_link_bound"].get<double>());
      std::printf("\n");
    }
    std::printf("one session             %.1f%% of the bandwidth bound; %d sessions %.2fx one session's tokens/s\n",
                100.0 * one.server_tokens_per_s / bound, most.sessions,
                most.server_tokens_per_s / one.server_tokens_per_s);
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_serve(CLI::App* bench, action_fn& action) {
  static serve_bench_options o;
  auto* cmd = bench->add_subcommand(
      "serve", "A swarm server's decode with concurrent sessions vs one session (and vs its engine without the wire)");
  add_common(cmd, o.common, false);  // no --profile: the op profile is bench decode's and bench train's
  cmd->add_option("--sessions", o.sessions, "Concurrent sessions, one run each (one session is always measured)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "Rows each session prefills")->capture_default_str();
  cmd->add_option("--new-tokens", o.new_tokens, "Timed one-row steps per session")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Runs of each level (the best is reported; the order alternates)")
      ->capture_default_str();
  cmd->add_option("--weights", o.weights, "Linear weights the server decodes from: f32, bf16, int8 or nf4")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", o.kv_dtype, "KV cache elements: f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--max-memory", o.max_memory,
                  "The server's memory (e.g. 40GiB, or auto as serve reads it): the KV cache gets what the blocks' "
                  "weights leave, as many whole pages as fit");
  cmd->add_option("--cache-tokens", o.cache_tokens, "KV cache tokens without --max-memory")->capture_default_str();
  cmd->add_option("--link-profile", o.link_profile,
                  "Emulated link between each session and the server (net/shaping.hpp: none, wan, consumer or "
                  "bw=100Mbit,lat=20ms,jitter=5ms): every session then has a client node of its own")
      ->capture_default_str();
  cmd->add_option("--batch-wait", o.batch_wait, "As serve --batch-wait (a fraction of the last batch's time)")
      ->capture_default_str();
  cmd->add_option("--batch-wait-max-ms", o.batch_wait_max_ms, "As serve --batch-wait-max-ms")->capture_default_str();
  cmd->callback([&action] { action = [] { return run_serve_bench(o); }; });
}

}  // namespace corolla::app
