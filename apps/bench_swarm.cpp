// corolla bench swarm — decode through a chain of `corolla serve` processes on
// loopback next to local decode of the same model in the same run:
//  * LAN: steps/s of a 3-server chain vs one process (and the outputs must
//    be equal, token for token);
//  * emulated WAN links (1 Gbit/s with 5 ms RTT, 100 Mbit/s with 100 ms RTT
//    by default): steps/s vs the bound that link latency plus compute set,
//    with servers pushing to each other (one step crosses servers + 1 links
//    one way: client -> s0 -> ... -> client) and with the client carrying
//    every hop (a round trip per server), each against its own bound and
//    against each other;
//  * recovery: the last hop's server is killed mid-generation (a spare holds
//    its span): the extra time of the step that recovers (replay included);
//  * fine-tuning: deep prompt tuning steps/s through the LAN chain
//    (span.forward / span.backward) vs the same steps with local blocks;
//  * per-hop overhead: ms per decode step of a tiny model (negligible
//    compute) locally, through one server and through two.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_finetune.hpp"
#include "actors/swarm_generate.hpp"
#include "apps/bench_model.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/local_swarm.hpp"
#include "apps/scratch_dir.hpp"
#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "model/prompt_tuning.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"
#include "net/shaping.hpp"

namespace corolla::app {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

struct swarm_bench_options {
  std::string model_dir;
  std::uint64_t seed = 0;
  int servers = 3;
  int prompt_tokens = 16;
  int new_tokens = 32;
  int wan_new_tokens = 12;
  std::vector<std::string> wan_profiles{"bw=1Gbit,lat=2.5ms", "bw=100Mbit,lat=50ms"};
  int server_threads = 0;  ///< 0 = every core (the servers of a chain compute one at a time)
  int tune_steps = 3, tune_batch = 2, tune_seq = 64, tune_prompt_len = 8;
  bool json = false;
  bool hop_only = false;  ///< only the per-hop overhead (seconds, not a minute)
};

/// One measured swarm run.
struct swarm_run {
  generation_result result;
  std::vector<double> token_at_s;  ///< seconds from the start at each token
  int failovers = 0;
  std::uint64_t pushed_hops = 0;
  std::string route;
};

/// Splits n blocks into k nearly equal consecutive spans.
std::vector<std::pair<int, int>> even_spans(int n, int k) {
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < k; ++i) out.emplace_back(n * i / k, n * (i + 1) / k);
  return out;
}

swarm_run run_swarm(local_swarm& sw, const fs::path& dir, const model_config& cfg, const std::vector<std::int32_t>& prompt,
                    const generation_params& p, const std::string& client_profile, bool push = true,
                    const std::function<void(int)>& after_token = {}, std::string* route_now = nullptr,
                    const std::vector<std::string>& servers = {}, bool post_steps = true) {
  node_options no;
  no.listen = "";
  no.link_profile = client_profile;
  auto n = node::start(no);
  if (!n) throw std::runtime_error("client node: " + error_message(n.error()));
  swarm_client_options so;
  so.servers = servers.empty() ? sw.endpoints() : servers;
  so.server_push = push;
  so.post_steps = post_steps;
  swarm_run run;
  so.on_event = [&](const std::string& e) {
    if (e.rfind("route ", 0) != 0) return;
    run.route = e.substr(6);
    if (route_now) *route_now = run.route;
  };
  swarm_client client(**n, so);
  head h = head::load(checkpoint::open(dir), cfg, cpu_backend());
  if (auto err = client.refresh()) throw std::runtime_error(error_message(err));
  const auto t0 = clock_type::now();
  int produced = 0;
  swarm_generation g = swarm_generate(client, h, prompt, p, [&](std::int32_t) {
    run.token_at_s.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    if (after_token) after_token(++produced);
  });
  run.result = g.result;
  run.failovers = g.failovers;
  run.pushed_hops = g.pushed_hops;
  return run;
}

double steps_per_s(const generation_result& r) { return r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The fixed cost of a hop, on a model whose compute is negligible (2
/// blocks of width 64): ms per decode step locally, through one server
/// holding both blocks, and through two servers of one block each (push
/// on; steps posted, and again with every hop answering), every process on
/// one thread. The second server's extra time is
/// what one more hop costs: a link crossing, a wake-up, a decode and an
/// encode, whatever the model. The routes' servers all run at once and the
/// routes take turns, hop_rounds times: a figure is the median of its
/// rounds, a difference the median of the rounds' differences (one route
/// run against the other a moment later), with its smallest and largest.
struct hop_overhead {
  double local_ms = 0, one_server_ms = 0, two_servers_ms = 0;
  /// The one server behind NAT (--no-listen), reached through a relay
  /// node in this process: what the relay's leg adds per step.
  double relayed_ms = 0;
  double per_hop_ms = 0, per_hop_min_ms = 0, per_hop_max_ms = 0;
  /// The same two servers with every hop answering its request
  /// (swarm_client_options::post_steps off): the baseline of posted steps.
  double requested_two_servers_ms = 0, requested_per_hop_ms = 0;
  double relay_leg_ms = 0;
  int rounds = 0;
  bool equal = false;
};

constexpr int hop_rounds = 15;

hop_overhead measure_hop_overhead(std::uint64_t seed) {
  const model_config c = tiny_random_config(architecture::llama, 2);
  const scratch_dir scratch("corolla-bench-hop");
  const fs::path& dir = scratch.path();
  transformer::init(c, seed, cpu_backend()).save(dir);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 8; ++i) prompt.push_back(static_cast<std::int32_t>((i * 37 + 11) % c.vocab_size));
  generation_params p;
  p.max_new_tokens = 128;
  p.ignore_eos = true;
  hop_overhead h;
  transformer local = transformer::load(dir, cpu_backend());
  generator gen(local);
  gen.generate(prompt, p);  // warm-up
  const generation_result l = gen.generate(prompt, p);
  h.local_ms = 1e3 / steps_per_s(l);

  node_options ro;
  ro.relay_service = true;
  auto relay = node::start(ro);
  if (!relay) throw std::runtime_error("relay node: " + error_message(relay.error()));
  struct route {
    local_swarm sw;
    std::vector<std::string> servers;  ///< empty: every server of `sw`, directly
    std::vector<double> ms;
  };
  std::array<route, 3> routes;  // one server, two servers, one server behind the relay
  const auto start = [&](route& r, const std::string& prefix, const std::vector<std::pair<int, int>>& spans,
                         const std::string& via = "") {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const std::string id = prefix + std::to_string(i);
      std::vector<std::string> f{"--threads", "1"};
      if (!via.empty()) f.insert(f.end(), {"--no-listen", "--relay", via});
      r.sw.start(dir, id, spans[i].first, spans[i].second, f);
      if (!via.empty()) r.servers.push_back(id + "@" + via);
    }
  };
  start(routes[0], "a", {{0, 2}});
  start(routes[1], "b", {{0, 1}, {1, 2}});
  start(routes[2], "c", {{0, 2}}, (*relay)->endpoint());
  h.equal = true;
  const auto run = [&](route& r, bool post_steps = true) {
    const swarm_run out = run_swarm(r.sw, dir, c, prompt, p, "", true, {}, nullptr, r.servers, post_steps);
    h.equal = h.equal && out.result.tokens == l.tokens;
    return 1e3 / steps_per_s(out.result);
  };
  for (route& r : routes) run(r);  // warm-up: links between the servers
  std::vector<double> hop, leg, requested, requested_hop;
  for (int round = 0; round < hop_rounds; ++round) {
    for (route& r : routes) r.ms.push_back(run(r));
    requested.push_back(run(routes[1], false));
    hop.push_back(routes[1].ms.back() - routes[0].ms.back());
    requested_hop.push_back(requested.back() - routes[0].ms.back());
    leg.push_back(routes[2].ms.back() - routes[0].ms.back());
  }
  h.rounds = hop_rounds;
  h.one_server_ms = median(routes[0].ms);
  h.two_servers_ms = median(routes[1].ms);
  h.relayed_ms = median(routes[2].ms);
  h.per_hop_ms = median(hop);
  h.per_hop_min_ms = *std::min_element(hop.begin(), hop.end());
  h.per_hop_max_ms = *std::max_element(hop.begin(), hop.end());
  h.relay_leg_ms = median(leg);
  h.requested_two_servers_ms = median(requested);
  h.requested_per_hop_ms = median(requested_hop);
  return h;
}

nlohmann::json hop_json(const hop_overhead& hop) {
  return {{"local_ms_per_step", hop.local_ms},
          {"one_server_ms_per_step", hop.one_server_ms},
          {"two_servers_ms_per_step", hop.two_servers_ms},
          {"ms_per_extra_hop", hop.per_hop_ms},
          {"ms_per_extra_hop_min", hop.per_hop_min_ms},
          {"ms_per_extra_hop_max", hop.per_hop_max_ms},
          {"requested_two_servers_ms_per_step", hop.requested_two_servers_ms},
          {"requested_ms_per_extra_hop", hop.requested_per_hop_ms},
          {"rounds", hop.rounds},
          {"relayed_server_ms_per_step", hop.relayed_ms},
          {"ms_per_relay_leg", hop.relay_leg_ms},
          {"equal_to_local", hop.equal}};
}

void print_hop(const hop_overhead& hop) {
  std::printf("per-hop overhead (2 blocks of width 64, one thread each; medians of %d alternating rounds): local "
              "%.3f ms/step, 1 server %.3f ms (+%.3f), 2 servers %.3f ms: %.3f ms per extra hop (rounds %.3f to "
              "%.3f; output %s)\n",
              hop.rounds, hop.local_ms, hop.one_server_ms, hop.one_server_ms - hop.local_ms, hop.two_servers_ms,
              hop.per_hop_ms, hop.per_hop_min_ms, hop.per_hop_max_ms, hop.equal ? "equal" : "DIFFERENT");
  std::printf("  the same 2 servers with every hop answering (no posted steps): %.3f ms/step, %.3f ms per extra hop "
              "(posted: %.3f of that)\n",
              hop.requested_two_servers_ms, hop.requested_per_hop_ms,
              hop.requested_per_hop_ms > 0 ? hop.per_hop_ms / hop.requested_per_hop_ms : 0.0);
  std::printf("behind NAT: the 1 server reached through a relay %.3f ms/step: %.3f ms for the relay's leg "
              "(ratio to direct %.3f)\n",
              hop.relayed_ms, hop.relay_leg_ms, hop.one_server_ms / hop.relayed_ms);
}

int run_bench_swarm(const swarm_bench_options& o) {
  if (o.servers < 1) throw std::invalid_argument("--servers must be at least 1");
  if (o.hop_only) {
    std::fprintf(stderr, "bench swarm: per-hop overhead on a tiny model...\n");
    const hop_overhead hop = measure_hop_overhead(o.seed);
    const nlohmann::json j{{"hop_overhead", hop_json(hop)}};
    if (!o.json) print_hop(hop);
    std::printf("%s\n", j.dump().c_str());
    return hop.equal ? 0 : 1;
  }
  // The model on disk: servers load their blocks from it.
  const bench_model_dir on_disk(o.model_dir, "swarm", o.seed);
  const fs::path& dir = on_disk.path();

  transformer local = transformer::load(dir, cpu_backend());
  const model_config cfg = local.config();
  if (o.servers > cfg.n_layers) throw std::invalid_argument("more servers than blocks");
  std::mt19937_64 rng(o.seed + 7);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < o.prompt_tokens; ++i) prompt.push_back(static_cast<std::int32_t>(rng() % cfg.vocab_size));
  generation_params p;
  p.max_new_tokens = o.new_tokens;
  p.ignore_eos = true;

  std::fprintf(stderr, "bench swarm: %d layers, dim %lld, %d servers; local decode...\n", cfg.n_layers,
               static_cast<long long>(cfg.hidden_size), o.servers);
  generator gen(local);
  gen.generate(prompt, p);  // warm-up
  const generation_result local_run = gen.generate(prompt, p);
  const double local_sps = steps_per_s(local_run);
  const double compute_s = 1.0 / local_sps;
  // Deep prompt tuning with local blocks, on the same cores as local decode.
  std::fprintf(stderr, "bench swarm: local prompt tuning...\n");
  const fs::path model_dir = dir;
  // With `lora`: a rank-8 LoRA adapter of q and v (c_attn) alone instead
  // of the prompts, its factors carried by every request.
  lora_config lc;
  lc.rank = 8;
  lc.alpha = 16.0f;
  const std::int64_t lora_values = lora_adapter::zeros(cfg, lc).numel();
  auto tune_steps_per_s = [&](span_runner& runner, bool lora = false) {
    head h = head::load(checkpoint::open(model_dir), cfg, cpu_backend());
    prompt_tuning_options to;
    to.prompt_len = lora ? 0 : o.tune_prompt_len;
    std::optional<lora_adapter> adapter;
    if (lora) adapter.emplace(lora_adapter::init(cfg, lc, o.seed, cpu_backend()));
    prompt_tuner tuner(h, runner, to, adapter ? &*adapter : nullptr);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(o.tune_batch) * o.tune_seq), targets(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
      targets[i] = static_cast<std::int32_t>(rng() % cfg.vocab_size);
    }
    tuner.step(ids, targets, o.tune_batch, o.tune_seq);  // warm-up
    const auto t0 = clock_type::now();
    for (int s = 0; s < o.tune_steps; ++s) tuner.step(ids, targets, o.tune_batch, o.tune_seq);
    return o.tune_steps / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  double local_tune_sps = 0, local_lora_sps = 0;
  {
    span_engine blocks = span_engine::load(checkpoint::open(dir), cfg, 0, cfg.n_layers, cpu_backend(), 16);
    local_span_runner runner(blocks);
    local_tune_sps = tune_steps_per_s(runner);
    local_lora_sps = tune_steps_per_s(runner, true);
  }

  // The servers share this machine, and in a chain one computes at a time:
  // each gets every core (idle OpenMP threads spin only briefly,
  // apps/openmp_spin.hpp, so the idle servers leave the busy one its
  // cores), and the client, which only embeds and samples, one thread.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int server_threads = o.server_threads > 0 ? o.server_threads : static_cast<int>(cores);
  const std::vector<std::string> server_flags{"--threads", std::to_string(server_threads)};
  set_cpu_threads(1);

  nlohmann::json j;
  j["bench"] = "swarm";
  j["server_threads"] = server_threads;
  j["servers"] = o.servers;
  j["model"] = {{"layers", cfg.n_layers}, {"hidden", cfg.hidden_size}, {"vocab", cfg.vocab_size}};
  j["local_steps_per_s"] = local_sps;

  // LAN (unshaped loopback) chain, then the same with a spare for the last span.
  const auto spans = even_spans(cfg.n_layers, o.servers);
  double lan_sps = 0, lan_carried_sps = 0;
  std::string tune_line;
  bool equal = true;
  {
    std::fprintf(stderr, "bench swarm: %d-server chain on loopback...\n", o.servers);
    local_swarm sw;
    for (int i = 0; i < o.servers; ++i) sw.start(dir, "s" + std::to_string(i), spans[i].first, spans[i].second, server_flags);
    run_swarm(sw, dir, cfg, prompt, p, "");  // warm-up (page-in of the servers' weights, server links)
    swarm_run r = run_swarm(sw, dir, cfg, prompt, p, "");
    swarm_run carried = run_swarm(sw, dir, cfg, prompt, p, "", false);
    lan_sps = steps_per_s(r.result);
    lan_carried_sps = steps_per_s(carried.result);
    equal = r.result.tokens == local_run.tokens && carried.result.tokens == local_run.tokens;
    // Prompt tuning through the same chain.
    double swarm_tune_sps = 0, swarm_lora_sps = 0;
    {
      node_options no;
      no.listen = "";
      auto n = node::start(no);
      if (!n) throw std::runtime_error("client node: " + error_message(n.error()));
      swarm_client_options so;
      so.servers = sw.endpoints();
      swarm_client client(**n, so);
      swarm_span_runner runner(client, o.seed);
      swarm_tune_sps = tune_steps_per_s(runner);
      swarm_lora_sps = tune_steps_per_s(runner, true);
    }
    j["finetune"] = {{"local_steps_per_s", local_tune_sps},
                     {"swarm_steps_per_s", swarm_tune_sps},
                     {"ratio_to_local", swarm_tune_sps / local_tune_sps},
                     {"batch", o.tune_batch},
                     {"seq", o.tune_seq},
                     {"prompt_len", o.tune_prompt_len},
                     {"lora",
                      {{"rank", lc.rank},
                       {"adapter_values", lora_values},
                       // each step's requests carry the factors (forward, backward) and answer their gradients
                       {"carried_bytes_per_step", 3 * 4 * lora_values},
                       {"local_steps_per_s", local_lora_sps},
                       {"swarm_steps_per_s", swarm_lora_sps},
                       {"ratio_to_local", swarm_lora_sps / local_lora_sps},
                       {"ratio_to_prompt_tuning", swarm_lora_sps / swarm_tune_sps}}}};
    tune_line = fmt::format("deep prompt tuning (B={}, T={}, P={}): local {:.2f} steps/s, chain {:.2f} steps/s, ratio {:.3f}\n"
                            "LoRA r {} of q, v ({} values carried each way): local {:.2f} steps/s, chain {:.2f} steps/s, "
                            "ratio {:.3f} (to prompt tuning on the chain {:.3f})",
                            o.tune_batch, o.tune_seq, o.tune_prompt_len, local_tune_sps, swarm_tune_sps,
                            swarm_tune_sps / local_tune_sps, lc.rank, lora_values, local_lora_sps, swarm_lora_sps,
                            swarm_lora_sps / local_lora_sps, swarm_lora_sps / swarm_tune_sps);
    j["lan"] = {{"steps_per_s", lan_sps},
                {"ratio_to_local", lan_sps / local_sps},
                {"client_carried_steps_per_s", lan_carried_sps},
                {"client_carried_ratio_to_local", lan_carried_sps / local_sps},
                {"pushed_hops", r.pushed_hops},
                {"route", r.route},
                {"equal_to_local", equal}};
  }

  // Emulated WAN links: both directions shaped (servers and client).
  nlohmann::json wan = nlohmann::json::array();
  std::vector<std::string> wan_lines;
  for (const auto& profile_text : o.wan_profiles) {
    const net::link_profile prof = net::parse_link_profile(profile_text);
    std::fprintf(stderr, "bench swarm: chain over %s...\n", net::describe(prof).c_str());
    local_swarm sw;
    for (int i = 0; i < o.servers; ++i)
      {
        auto flags = server_flags;
        flags.insert(flags.end(), {"--link-profile", profile_text});
        sw.start(dir, "s" + std::to_string(i), spans[i].first, spans[i].second, flags);
      }
    generation_params pw = p;
    pw.max_new_tokens = std::min(o.wan_new_tokens, o.new_tokens);
    // One untimed session first, so the servers' links to each other are up.
    {
      generation_params warm = pw;
      warm.max_new_tokens = 2;
      run_swarm(sw, dir, cfg, prompt, warm, profile_text);
    }
    swarm_run r = run_swarm(sw, dir, cfg, prompt, pw, profile_text);
    swarm_run carried = run_swarm(sw, dir, cfg, prompt, pw, profile_text, false);
    const double sps = steps_per_s(r.result), carried_sps = steps_per_s(carried.result);
    // A hidden row (D floats) crosses every link of a step's path once.
    const double row_s = prof.bandwidth_bps > 0 ? static_cast<double>(cfg.hidden_size) * 4 * 8 / prof.bandwidth_bps : 0;
    const double one_way_s = prof.latency_s + row_s;
    const double bound_sps = 1.0 / ((o.servers + 1) * one_way_s + compute_s);
    const double carried_bound_sps = 1.0 / (2 * o.servers * one_way_s + compute_s);
    auto prefix_equal = [&](const swarm_run& x) {
      return std::equal(x.result.tokens.begin(), x.result.tokens.end(), local_run.tokens.begin());
    };
    wan.push_back({{"profile", profile_text},
                   {"steps_per_s", sps},
                   {"bound_steps_per_s", bound_sps},
                   {"ratio_to_bound", sps / bound_sps},
                   {"pushed_hops", r.pushed_hops},
                   {"client_carried_steps_per_s", carried_sps},
                   {"client_carried_bound_steps_per_s", carried_bound_sps},
                   {"client_carried_ratio_to_bound", carried_sps / carried_bound_sps},
                   {"push_speedup", sps / carried_sps},
                   {"equal_to_local_prefix", prefix_equal(r) && prefix_equal(carried)}});
    char line[320];
    std::snprintf(line, sizeof line,
                  "  %-22s push %8.2f steps/s (bound %8.2f, ratio %.3f)   client-carried %8.2f (bound %8.2f, ratio "
                  "%.3f)   push speedup %.2fx",
                  profile_text.c_str(), sps, bound_sps, sps / bound_sps, carried_sps, carried_bound_sps,
                  carried_sps / carried_bound_sps, sps / carried_sps);
    wan_lines.push_back(line);
  }
  j["wan"] = wan;

  // Recovery: kill the last hop's server halfway; a spare holds its span.
  double recovery_ms = 0;
  int failovers = 0;
  bool recovered_equal = false;
  {
    std::fprintf(stderr, "bench swarm: recovery from kill -9...\n");
    local_swarm sw;
    for (int i = 0; i < o.servers; ++i) sw.start(dir, "s" + std::to_string(i), spans[i].first, spans[i].second, server_flags);
    sw.start(dir, "spare", spans.back().first, spans.back().second, server_flags);
    const int kill_at = std::max(2, o.new_tokens / 2);
    std::string route;  // the route's last hop is killed (the spare or its twin, whichever was chosen)
    swarm_run r = run_swarm(sw, dir, cfg, prompt, p, "", true, [&](int produced) {
      if (produced != kill_at) return;
      const auto at = route.rfind(" via ");
      if (at != std::string::npos) sw.signal(route.substr(at + 5), SIGKILL);
    }, &route);
    if (r.failovers == 0) throw std::runtime_error("the recovery run saw no failure: the kill missed the route");
    failovers = r.failovers;
    recovered_equal = r.result.tokens == local_run.tokens;
    std::vector<double> steps;
    for (std::size_t i = 1; i < r.token_at_s.size(); ++i) steps.push_back(r.token_at_s[i] - r.token_at_s[i - 1]);
    if (static_cast<std::size_t>(kill_at) < r.token_at_s.size()) {
      const double recovering_step = r.token_at_s[kill_at] - r.token_at_s[kill_at - 1];
      recovery_ms = (recovering_step - median(steps)) * 1e3;
    }
    j["recovery"] = {{"kill_after_token", kill_at}, {"failovers", failovers}, {"extra_ms", recovery_ms},
                     {"equal_to_local", recovered_equal}};
  }

  std::fprintf(stderr, "bench swarm: per-hop overhead on a tiny model...\n");
  const hop_overhead hop = measure_hop_overhead(o.seed);
  j["hop_overhead"] = hop_json(hop);

  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("local decode:           %8.2f steps/s\n", local_sps);
    std::printf("%d-server chain (LAN):  %8.2f steps/s   ratio to local %.3f   (client-carried %.2f, ratio %.3f)   "
                "output %s\n",
                o.servers, lan_sps, lan_sps / local_sps, lan_carried_sps, lan_carried_sps / local_sps,
                equal ? "equal" : "DIFFERENT");
    std::printf("emulated WAN (bound = links crossed one way x (latency + row transmission) + local compute; a step "
                "crosses servers + 1 links with push, 2 x servers client-carried):\n");
    for (const auto& l : wan_lines) std::printf("%s\n", l.c_str());
    std::printf("%s\n", tune_line.c_str());
    std::printf("recovery: kill -9 of the last hop's server: the next token took %.1f ms more than a step "
                "(%d failover(s), output %s)\n",
                recovery_ms, failovers, recovered_equal ? "equal" : "DIFFERENT");
    print_hop(hop);
    std::printf("%s\n", j.dump().c_str());
  }
  return equal && recovered_equal && hop.equal ? 0 : 1;
}

}  // namespace

void register_bench_swarm(CLI::App* bench, action_fn& action) {
  static swarm_bench_options o;
  auto* cmd = bench->add_subcommand("swarm", "Decode through corolla serve processes on loopback vs local decode");
  cmd->add_option("--model", o.model_dir,
                  "HuggingFace model directory (default: the random ~100M-parameter bench model, written to a "
                  "temporary directory)");
  cmd->add_option("--seed", o.seed, "Seed of the random default model and the prompt")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_option("--servers", o.servers, "Servers in the chain (the blocks split evenly)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "Prompt length")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--new-tokens", o.new_tokens, "Tokens generated per run")->check(CLI::Range(4, 4096))->capture_default_str();
  cmd->add_option("--wan-new-tokens", o.wan_new_tokens, "Tokens generated per emulated WAN run")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  cmd->add_option("--wan-profiles", o.wan_profiles, "Link profiles of the WAN runs (net/shaping.hpp syntax)")
      ->delimiter(';')
      ->check(link_profile())
      ->capture_default_str();
  cmd->add_option("--server-threads", o.server_threads,
                  "CPU threads of each server process (0 = every core: a chain's servers compute one at a time)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--tune-steps", o.tune_steps, "Timed prompt-tuning steps (after one warm-up step)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--hop-only", o.hop_only,
                "Measure only the per-hop overhead on a tiny model (about 10 seconds instead of a minute)");
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_bench_swarm(o); }; });
}

}  // namespace corolla::app
