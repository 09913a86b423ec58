// corolla bench api — the OpenAI-compatible API over a local swarm of
// `corolla serve` processes, under 1, 8 and 32 concurrent streaming
// clients, next to the same load put on the same swarm engine directly (what
// `corolla generate --swarm` does in-process) in the same run:
//  * requests/s and generated tokens/s of each;
//  * time to first text (the first streamed chunk; directly: the first
//    token that completes text), median and worst;
//  * the API's overhead per token: the mean request time through HTTP minus
//    the direct one, divided by the tokens of a request (the median over
//    --rounds rounds that alternate which path goes first);
//  * greedy text through the API must equal the direct tokens' text.
// With --shared-prefix N every prompt starts with the level's N tokens (a
// system prompt), each path's prompts their own after it: a third path, an
// engine whose requests share no KV pages (--prefix-sharing off), run
// directly on the direct path's prompts, shows what the servers gain from
// starting requests on the pages of running and kept sessions; its text
// must equal the direct path's. With --turns T each level then runs its
// number of concurrent T-turn conversations on both engines: time to first
// text of the turns after the first (a chat's next turn starts on the last
// turn's parked sessions) and tokens/s, the replies equal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "api/completion_engine.hpp"
#include "api/http_api.hpp"
#include "api/openai_request.hpp"
#include "apps/bench_api_load.hpp"
#include "apps/bench_model.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/local_swarm.hpp"
#include "kernels/backend.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"

namespace corolla::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = bench_clock;

/// `clients` requests at once, straight on the engine.
load_result run_direct(api::completion_engine& engine, const tokenizer& tok,
                       const std::vector<std::vector<std::int32_t>>& prompts, int clients, int new_tokens) {
  load_result r = load_result::for_clients(clients);
  std::vector<int> counts(static_cast<std::size_t>(clients));
  const auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      const auto u = static_cast<std::size_t>(i);
      const auto start = clock_type::now();
      generation_params p;
      p.max_new_tokens = new_tokens;
      p.ignore_eos = true;
      bool first = true;
      // Time to the first text, as generate --swarm prints it (and as the
      // API streams it): a token that ends in the middle of a UTF-8
      // character shows nothing until the next one.
      stream_decoder text(tok);
      try {
        const auto on_token = [&](std::int32_t id) {
          if (first && !text.push(id).empty()) r.first_token_s[u] = seconds_between(start, clock_type::now()), first = false;
        };
        const auto out = engine.generate(prompts[u % prompts.size()], p, on_token, {});
        // As the API writes text: bytes that form no UTF-8 character as U+FFFD.
        r.texts[u] = json::parse(api::to_body(json(tok.decode(out.result.tokens)))).get<std::string>();
        counts[u] = static_cast<int>(out.result.tokens.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench api: direct request %d failed: %s\n", i, e.what());
        counts[u] = -1;
      }
      r.request_s[u] = seconds_between(start, clock_type::now());
    });
  for (auto& t : threads) t.join();
  r.wall_s = seconds_between(t0, clock_type::now());
  for (int c : counts) c < 0 ? ++r.failed : r.tokens += c;
  return r;
}

/// `clients` conversations of `turns` turns at once, straight on the
/// engine: conversation i's first prompt is firsts[i], each later turn's the
/// conversation so far (prompts and replies) followed by `own(i, turn)`.
/// The figures are of the turns after the first (what a kept session
/// spares); tokens count every turn; texts[i] is conversation i's replies.
load_result run_chats(api::completion_engine& engine, const tokenizer& tok,
                      const std::vector<std::vector<std::int32_t>>& firsts, int turns, int new_tokens,
                      const std::function<std::vector<std::int32_t>(int, int)>& own) {
  const int clients = static_cast<int>(firsts.size());
  load_result r = load_result::for_clients(clients * (turns - 1));
  std::vector<std::string> texts(static_cast<std::size_t>(clients));
  std::vector<int> counts(static_cast<std::size_t>(clients));
  const auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      const auto u = static_cast<std::size_t>(i);
      std::vector<std::int32_t> conversation = firsts[u];
      generation_params p;
      p.max_new_tokens = new_tokens;
      p.ignore_eos = true;
      try {
        for (int turn = 0; turn < turns; ++turn) {
          if (turn > 0) {
            const auto more = own(i, turn);
            conversation.insert(conversation.end(), more.begin(), more.end());
          }
          const auto start = clock_type::now();
          bool first = true;
          stream_decoder text(tok);
          const auto slot = u * static_cast<std::size_t>(turns - 1) + static_cast<std::size_t>(turn - 1);
          const auto on_token = [&](std::int32_t id) {
            if (first && !text.push(id).empty()) {
              if (turn > 0) r.first_token_s[slot] = seconds_between(start, clock_type::now());
              first = false;
            }
          };
          const auto out = engine.generate(conversation, p, on_token, {});
          if (turn > 0) r.request_s[slot] = seconds_between(start, clock_type::now());
          conversation.insert(conversation.end(), out.result.tokens.begin(), out.result.tokens.end());
          texts[u] += tok.decode(out.result.tokens);
          counts[u] += static_cast<int>(out.result.tokens.size());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench api: conversation %d failed: %s\n", i, e.what());
        counts[u] = -1;
      }
    });
  for (auto& t : threads) t.join();
  r.wall_s = seconds_between(t0, clock_type::now());
  for (int c : counts) c < 0 ? ++r.failed : r.tokens += c;
  r.texts = std::move(texts);
  return r;
}

int run_bench_api(const api_bench_options& o) {
  const bench_model_dir on_disk(o.model_dir, "api", o.seed, [](const fs::path& d) {
    write_bench_tokenizer(d, bench_llama_config().vocab_size);
  });
  const fs::path& dir = on_disk.path();

  const model_config cfg = load_config(dir);
  if (o.servers > cfg.n_layers) throw std::invalid_argument("more servers than blocks");
  if (o.turns < 1) throw std::invalid_argument("--turns must be at least 1");
  const int context = o.shared_prefix + o.turns * (o.prompt_tokens + o.new_tokens);
  if (context > cfg.max_positions)
    throw std::invalid_argument("--shared-prefix + --turns x (--prompt-tokens + --new-tokens) (" +
                                std::to_string(context) + ") exceed the model context of " +
                                std::to_string(cfg.max_positions));
  const auto tok = load_tokenizer(dir);
  std::mt19937_64 rng(o.seed + 11);
  const auto random_ids = [&](int n) {
    std::vector<std::int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>(rng() % cfg.vocab_size));
    return ids;
  };
  std::vector<std::vector<std::int32_t>> prompts(4);
  for (auto& p : prompts) p = random_ids(o.prompt_tokens);
  // With --shared-prefix every request of a round gets a prompt of its own
  // after the level's shared one (a system prompt).
  std::vector<std::int32_t> shared;
  const auto fresh_prompts = [&](int n) { return prompts_after(shared, n, [&] { return random_ids(o.prompt_tokens); }); };

  std::fprintf(stderr, "bench api: %d layers, dim %lld; starting %d server(s)...\n", cfg.n_layers,
               static_cast<long long>(cfg.hidden_size), o.servers);
  local_swarm sw;
  const int server_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / (o.servers + 1));
  for (int i = 0; i < o.servers; ++i)
    sw.start(dir, "s-" + std::to_string(i), cfg.n_layers * i / o.servers, cfg.n_layers * (i + 1) / o.servers,
             {"--threads", std::to_string(server_threads), "--log-level", "error"});
  auto runtime = node::start([] {
    node_options no;
    no.listen = "";
    return no;
  }());
  if (!runtime) throw std::runtime_error("bench api: the client node did not start: " + error_message(runtime.error()));
  swarm_client_options so;
  so.servers = sw.endpoints();
  so.model = model_id_of(dir.string());
  // The client side only embeds and samples, on many threads at once: one
  // CPU thread each, as corolla api --swarm.
  set_cpu_threads(1);
  const int slots = *std::max_element(o.clients.begin(), o.clients.end());
  auto engine = api::make_swarm_engine(**runtime, so, head::load(checkpoint::open(dir), cfg, cpu_backend()), slots);
  // With a shared prefix, also an engine whose requests share no pages
  // (each computes its prompt on the servers), run directly.
  const bool unshared_too = o.shared_prefix > 0 || o.turns > 1;
  std::unique_ptr<api::completion_engine> unshared;
  if (unshared_too)
    unshared = api::make_swarm_engine(**runtime, so, head::load(checkpoint::open(dir), cfg, cpu_backend()), slots,
                                      weight_format::f32, false);
  api::api_config ac;
  ac.model_id = so.model;
  ac.http_threads = slots + 4;
  api::http_api server(*engine, *tok, std::nullopt, "bench api: no chat", ac);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.run(); });
  struct stop_server {
    api::http_api& s;
    std::thread& t;
    ~stop_server() {
      s.stop();
      t.join();
    }
  } stopper{server, serving};

  // Warm-up: routes, caches, the first connection.
  engine->check_ready();
  run_direct(*engine, *tok, prompts, 1, 2);
  run_http(port, ac.model_id, prompts, 1, 2);

  json levels = json::array();
  bool equal = true;
  if (!o.json_only)
    std::printf("%8s  %-8s  %9s  %9s  %10s  %10s  %13s\n", "clients", "path", "req/s", "tokens/s", "TTFT p50",
                "TTFT max", "overhead/tok");
  for (int c : o.clients) {
    std::fprintf(stderr, "bench api: %d concurrent client(s)...\n", c);
    // Rounds alternate which path goes first; the figures pool the rounds
    // and the overhead is the median of the rounds' differences (the
    // swarm's own run-to-run swings are far larger than the API's cost).
    load_result direct, http, apart;
    std::vector<double> overheads;
    bool same = true;
    shared = random_ids(o.shared_prefix);
    const auto before = engine->prompt_sharing().value_or(api::prefix_board_stats{});
    for (int round = 0; round < o.rounds; ++round) {
      // With a shared prefix the API gets prompts of its own: the engine
      // keeps finished requests' sessions, and the same whole prompts
      // again would start on them. The unshared engine keeps nothing and
      // gets the direct path's prompts (its text must be the same).
      const auto direct_prompts = unshared_too ? fresh_prompts(c) : prompts;
      const auto http_prompts = unshared_too ? fresh_prompts(c) : prompts;
      load_result d, h, u;
      // Each round another path goes first.
      const std::function<void()> ways[] = {
          [&] { d = run_direct(*engine, *tok, direct_prompts, c, o.new_tokens); },
          [&] { h = run_http(port, ac.model_id, http_prompts, c, o.new_tokens); },
          [&] { u = run_direct(*unshared, *tok, direct_prompts, c, o.new_tokens); }};
      const std::size_t n_ways = unshared_too ? 3 : 2;
      for (std::size_t k = 0; k < n_ways; ++k) ways[(k + static_cast<std::size_t>(round)) % n_ways]();
      same = same && d.failed == 0 && h.failed == 0 &&
             (unshared_too ? u.failed == 0 && u.texts == d.texts : d.texts == h.texts);
      overheads.push_back((mean(h.request_s) - mean(d.request_s)) / o.new_tokens * 1e3);
      pool(direct, d);
      pool(http, h);
      if (unshared_too) pool(apart, u);
    }
    const auto after = engine->prompt_sharing().value_or(api::prefix_board_stats{});
    equal = equal && same;
    const double overhead_ms = median(overheads);
    const auto row = [&](const char* path, const load_result& r, bool with_overhead, int requests = 0) {
      if (o.json_only) return;
      std::printf("%8d  %-8s  %9.2f  %9.1f  %8.1fms  %8.1fms  %11s\n", c, path,
                  (requests > 0 ? requests : c * o.rounds) / r.wall_s, r.tokens / r.wall_s,
                  median(r.first_token_s) * 1e3, *std::max_element(r.first_token_s.begin(), r.first_token_s.end()) * 1e3,
                  with_overhead ? (std::to_string(overhead_ms).substr(0, 6) + "ms").c_str() : "");
    };
    row("direct", direct, false);
    row("http", http, true);
    json level = {{"clients", c},
                  {"direct", direct.to_json(c * o.rounds)},
                  {"http", http.to_json(c * o.rounds)},
                  {"http_to_direct_tokens_per_s", (http.tokens / http.wall_s) / (direct.tokens / direct.wall_s)},
                  {"overhead_ms_per_token", overhead_ms},
                  {"shared_prompt_tokens", after.shared_tokens - before.shared_tokens},
                  {"prefix_waits", after.waits - before.waits},
                  {"same_text", same}};
    if (unshared_too) {
      row("unshared", apart, false);
      const way_ratios w = compare_ways(direct, apart);
      level["unshared"] = apart.to_json(c * o.rounds);
      level["direct_to_unshared_tokens_per_s"] = w.tokens_per_s;
      level["unshared_to_direct_first_text_p50"] = w.first_text_p50;
      level["unshared_to_direct_first_text_max"] = w.first_text_max;
      if (!o.json_only)
        std::printf("%8s  shared prompt pages against none (direct): %.2fx tokens/s; time to first text %.2fx "
                    "shorter (p50), %.2fx (worst); %llu prompt tokens shared, %llu requests waited for a prefix\n",
                    "", w.tokens_per_s, w.first_text_p50, w.first_text_max,
                    static_cast<unsigned long long>(after.shared_tokens - before.shared_tokens),
                    static_cast<unsigned long long>(after.waits - before.waits));
    }
    if (o.turns > 1) {
      // Conversations: the same turns on both engines (greedy replies, so
      // the same conversations), alternating which goes first by level.
      std::fprintf(stderr, "bench api: %d conversation(s) of %d turns...\n", c, o.turns);
      shared = random_ids(o.shared_prefix);
      const auto firsts = fresh_prompts(c);
      std::vector<std::vector<std::vector<std::int32_t>>> owns(static_cast<std::size_t>(c));
      for (auto& turns : owns)
        for (int t = 0; t < o.turns; ++t) turns.push_back(random_ids(o.prompt_tokens));
      const auto own = [&](int i, int turn) { return owns[static_cast<std::size_t>(i)][static_cast<std::size_t>(turn)]; };
      load_result kept, apart_chat;
      const auto chat_before = engine->prompt_sharing().value_or(api::prefix_board_stats{});
      const auto run_kept = [&] { kept = run_chats(*engine, *tok, firsts, o.turns, o.new_tokens, own); };
      const auto run_apart = [&] { apart_chat = run_chats(*unshared, *tok, firsts, o.turns, o.new_tokens, own); };
      if (levels.size() % 2 == 0) run_kept(), run_apart();
      else run_apart(), run_kept();
      const auto chat_after = engine->prompt_sharing().value_or(api::prefix_board_stats{});
      const bool chat_same = kept.failed == 0 && apart_chat.failed == 0 && kept.texts == apart_chat.texts;
      equal = equal && chat_same;
      const way_ratios w = compare_ways(kept, apart_chat);
      row("chat", kept, false, c * o.turns);
      row("chat-un", apart_chat, false, c * o.turns);
      if (!o.json_only)
        std::printf("%8s  %d-turn conversations, turns 2-%d, kept sessions against none: %.2fx tokens/s; time to "
                    "first text %.2fx shorter (p50), %.2fx (worst)\n",
                    "", o.turns, o.turns, w.tokens_per_s, w.first_text_p50, w.first_text_max);
      level["chat"] = {{"turns", o.turns},
                       {"kept", kept.to_json(c * o.turns)},
                       {"unshared", apart_chat.to_json(c * o.turns)},
                       {"shared_prompt_tokens", chat_after.shared_tokens - chat_before.shared_tokens},
                       {"kept_to_unshared_tokens_per_s", w.tokens_per_s},
                       {"unshared_to_kept_first_text_p50", w.first_text_p50},
                       {"unshared_to_kept_first_text_max", w.first_text_max},
                       {"same_text", chat_same}};
    }
    levels.push_back(level);
  }
  const json out = {{"bench", "api"},
                    {"layers", cfg.n_layers},
                    {"hidden", cfg.hidden_size},
                    {"servers", o.servers},
                    {"prompt_tokens", o.prompt_tokens},
                    {"shared_prefix", o.shared_prefix},
                    {"turns", o.turns},
                    {"new_tokens", o.new_tokens},
                    {"rounds", o.rounds},
                    {"levels", levels},
                    {"same_text", equal}};
  if (!o.json_only)
    std::printf("%s: %s\n",
                unshared_too ? "greedy text with shared pages equals the text without"
                             : "greedy text through the API equals the direct tokens' text",
                equal ? "yes" : "NO");
  std::printf("%s\n", out.dump().c_str());
  return equal ? 0 : 1;
}

}  // namespace

void register_bench_api(CLI::App* bench, action_fn& action) {
  static api_bench_options o;
  auto* cmd = bench->add_subcommand(
      "api", "The OpenAI-compatible API over a local swarm vs the same load on the swarm engine directly "
             "(--local: over the model in this process, batched vs a generator per request)");
  cmd->add_option("--model", o.model_dir,
                  "HuggingFace model directory with a tokenizer (default: the random ~100M-parameter bench model "
                  "with a byte-level BPE tokenizer, written to a temporary directory)");
  cmd->add_option("--seed", o.seed, "Seed of the random default model and the prompts")
      ->check(unsigned_integer())
      ->capture_default_str();
  auto* servers = cmd->add_option("--servers", o.servers, "Servers in the chain (the blocks split evenly)")
                      ->check(CLI::Range(1, 64))
                      ->capture_default_str();
  cmd->add_option("--clients", o.clients, "Concurrent streaming clients, one run each (each level at most 1024)")
      ->delimiter(',')
      ->check(integer_between(1, 1024))
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o.prompt_tokens, "Prompt length")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--new-tokens", o.new_tokens, "Tokens generated per request")
      ->check(CLI::Range(2, 4096))
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Runs of each path per level, alternating which goes first")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  auto* local = cmd->add_flag("--local", o.local,
                              "The API over the model in this process instead: its decode steps batched vs a "
                              "generator per request");
  // Flags of one path only, refused with the other (a swarm's servers
  // and conversations; the local engine's device and weights).
  servers->excludes(local);
  cmd->add_option("--device", o.device, "With --local: auto, cpu, cuda or cuda:N")->needs(local)->capture_default_str();
  cmd->add_option("--weights", o.weights, "With --local: f32, bf16, int8 or nf4")->needs(local)->capture_default_str();
  cmd->add_option("--shared-prefix", o.shared_prefix,
                  "Tokens every prompt starts with (a system prompt), before its own --prompt-tokens; also "
                  "measures the engine without shared prompt pages")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  auto* turns = cmd->add_option("--turns", o.turns,
                  "Swarm: after each level, that many concurrent conversations of this many turns (each turn's "
                  "prompt the conversation so far and --prompt-tokens new ids) with kept sessions and without")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  turns->excludes(local);
  cmd->add_option("--adapters", o.adapters,
                  "With --local: also the batcher serving this many LoRA adapters (api --adapter), the clients' "
                  "requests naming them in turn, against the base model's requests")
      ->needs(local)
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--adapter-rank", o.adapter_rank, "With --adapters: their rank (every linear weight adapted)")
      ->needs(local)
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_flag("--json", o.json_only, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return o.local ? run_bench_api_local(o) : run_bench_api(o); }; });
}

}  // namespace corolla::app
