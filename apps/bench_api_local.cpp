// corolla bench api --local — the OpenAI-compatible API over the model in
// this process (`corolla api --local`), under 1, 8 and 32 concurrent
// streaming clients, two ways in the same run: the requests' decode steps
// batched by one actor (actors/decode_batcher.hpp, the default) and a
// generator per request (--batching off, what the API did before); with
// --shared-prefix a third, the batcher without shared prompt pages
// (--prefix-sharing off), and a fourth, the batcher with no request
// starting on another's cache (--isolate-requests: the cost of isolation):
//  * requests/s and generated tokens/s of each, and their ratio;
//  * time to first text, median and worst;
//  * the batcher's mean batch at each level, and the prompt tokens other
//    requests' caches spared (retained caches continued, or pages shared;
//    every prompt is its own after --shared-prefix tokens they all share:
//    a system prompt);
//  * greedy text must be the same every way;
//  * with --adapters N, also the batcher holding N LoRA adapters (api
//    --adapter; B zero, so their terms cost what any adapter's do and
//    change no text) whose clients name them in turn: the cost of serving
//    adapters unmerged beside the base model.
// Rounds rotate which engine goes first; all serve from the same weights
// (one model in memory).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/completion_engine.hpp"
#include "api/http_api.hpp"
#include "apps/bench_api_load.hpp"
#include "apps/bench_common.hpp"
#include "apps/bench_model.hpp"
#include "apps/commands.hpp"
#include "apps/model_load.hpp"
#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"

namespace corolla::app {
namespace {

using json = nlohmann::json;

/// An API server over `engine` on a free loopback port, stopped on destruction.
class bench_server {
 public:
  bench_server(api::completion_engine& engine, const tokenizer& tok, const std::string& model_id, int slots) {
    api::api_config ac;
    ac.model_id = model_id;
    ac.http_threads = slots + 4;
    server_ = std::make_unique<api::http_api>(engine, tok, std::nullopt, "bench api: no chat", ac);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~bench_server() {
    server_->stop();
    thread_.join();
  }
  bench_server(const bench_server&) = delete;
  bench_server& operator=(const bench_server&) = delete;
  int port() const { return port_; }

 private:
  std::unique_ptr<api::http_api> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

int run_bench_api_local(const api_bench_options& o) {
  // The flags first: the default model is 425 MB to write.
  const weight_format weights = parse_weights_flag(o.weights);
  Backend& be = backend_for(parse_device(o.device));
  const bench_model_dir on_disk(o.model_dir, "api", o.seed, [](const std::filesystem::path& d) {
    write_bench_tokenizer(d, bench_llama_config().vocab_size);
  });
  const std::filesystem::path& dir = on_disk.path();
  const model_config cfg = load_config(dir);
  if (o.shared_prefix + o.prompt_tokens + o.new_tokens > cfg.max_positions)
    throw std::invalid_argument("--shared-prefix + --prompt-tokens + --new-tokens (" +
                                std::to_string(o.shared_prefix + o.prompt_tokens + o.new_tokens) +
                                ") exceed the model context of " + std::to_string(cfg.max_positions));
  const auto tok = load_tokenizer(dir);
  std::mt19937_64 rng(o.seed + 11);
  const auto random_ids = [&](int n) {
    std::vector<std::int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>(rng() % cfg.vocab_size));
    return ids;
  };
  // Every request's prompt is its own (a prompt seen before would continue
  // from the batcher's retained caches), after --shared-prefix tokens that
  // the requests of a level share (a system prompt, new at each level: its
  // first round's requests arrive together with nothing cached; the
  // warm-up has none).
  std::vector<std::int32_t> shared;
  const auto fresh_prompts = [&](int n) { return prompts_after(shared, n, [&] { return random_ids(o.prompt_tokens); }); };

  std::fprintf(stderr, "bench api --local: %d layers, dim %lld, %s weights on %s; loading...\n", cfg.n_layers,
               static_cast<long long>(cfg.hidden_size), weight_format_name(weights), be.dev().str().c_str());
  // As api --local loads it: with --weights other than f32 only those
  // weights, shared by both engines.
  transformer model = load_for_decoding(dir.string(), be, weights, "bench api");
  const int slots = *std::max_element(o.clients.begin(), o.clients.end());
  auto batched = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::batched);
  auto per_request = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::per_request);
  const std::string model_id = model_id_of(dir.string());
  bench_server batched_server(*batched, *tok, model_id, slots);
  bench_server per_request_server(*per_request, *tok, model_id, slots);
  // With a shared prefix, also the batcher without shared pages (each
  // request computes its prompt unless it continues a finished one's
  // cache), isolated (each computes its whole prompt), and salted (each
  // client's requests send a cache_salt of their own: they share its own
  // earlier requests' caches only).
  const bool unshared_too = o.shared_prefix > 0;
  std::unique_ptr<api::completion_engine> unshared, isolated, salted;
  std::unique_ptr<bench_server> unshared_server, isolated_server, salted_server;
  if (unshared_too) {
    unshared = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::batched_unshared);
    unshared_server = std::make_unique<bench_server>(*unshared, *tok, model_id, slots);
    isolated = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::batched_isolated);
    isolated_server = std::make_unique<bench_server>(*isolated, *tok, model_id, slots);
    salted = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::batched);
    salted_server = std::make_unique<bench_server>(*salted, *tok, model_id, slots);
  }
  // With --adapters, the batcher holding them (a fresh adapter's B is
  // zero: its terms cost what any adapter's do, and the text stays the
  // base model's).
  std::unique_ptr<api::completion_engine> adapted;
  std::unique_ptr<bench_server> adapted_server;
  std::vector<std::string> adapter_names;
  if (o.adapters > 0) {
    lora_config lc;
    lc.rank = o.adapter_rank;
    lc.alpha = 2.0f * static_cast<float>(o.adapter_rank);
    lc.targets = {"all-linear"};
    std::vector<api::named_adapter> held;
    for (int i = 0; i < o.adapters; ++i) {
      adapter_names.push_back("adapter-" + std::to_string(i));
      held.push_back({adapter_names.back(), std::make_shared<const lora_adapter>(lora_adapter::init(
                                                  cfg, lc, o.seed + 100 + static_cast<std::uint64_t>(i), cpu_backend()))});
    }
    adapted = api::make_local_engine(model, slots, weights, dtype::f32, api::local_decoding::batched, held);
    adapted_server = std::make_unique<bench_server>(*adapted, *tok, model_id, slots);
  }
  std::vector<int> ports{batched_server.port(), per_request_server.port()};
  if (unshared_too) {
    ports.push_back(unshared_server->port());
    ports.push_back(isolated_server->port());
    ports.push_back(salted_server->port());
  }
  constexpr std::size_t kSaltedWay = 4;
  const std::size_t adapted_way = ports.size();
  if (adapted) ports.push_back(adapted_server->port());

  // Warm-up: the first connection, buffers, the inference copies.
  for (std::size_t way = 0; way < ports.size(); ++way)
    run_http(ports[way], model_id, fresh_prompts(1), 1, 2, {},
             way == adapted_way ? adapter_names : std::vector<std::string>{});

  json levels = json::array();
  bool equal = true;
  int failed = 0;
  if (!o.json_only)
    std::printf("%8s  %-11s  %9s  %9s  %10s  %10s  %10s\n", "clients", "decoding", "req/s", "tokens/s", "TTFT p50",
                "TTFT max", "mean batch");
  for (int c : o.clients) {
    std::fprintf(stderr, "bench api --local: %d concurrent client(s)...\n", c);
    // Pooled figures of each way, in the order of `ports`.
    std::vector<load_result> pooled(ports.size());
    load_result &b = pooled[0], &p = pooled[1];
    bool same = true;
    shared = random_ids(o.shared_prefix);
    const decode_batcher_stats before = *batched->batching();
    const decode_batcher_stats isolated_before = unshared_too ? *isolated->batching() : decode_batcher_stats{};
    const decode_batcher_stats salted_before = unshared_too ? *salted->batching() : decode_batcher_stats{};
    for (int round = 0; round < o.rounds; ++round) {
      const auto prompts = fresh_prompts(c);
      // Each round another way goes first.
      std::vector<load_result> got(ports.size());
      for (std::size_t k = 0; k < ports.size(); ++k) {
        const std::size_t way = (k + static_cast<std::size_t>(round)) % ports.size();
        got[way] = run_http(ports[way], model_id, prompts, c, o.new_tokens, way == kSaltedWay ? "client-" : "",
                            way == adapted_way ? adapter_names : std::vector<std::string>{});
      }
      for (std::size_t way = 0; way < ports.size(); ++way) {
        same = same && got[way].texts == got[0].texts;
        failed += got[way].failed;
        pool(pooled[way], got[way]);
      }
    }
    const decode_batcher_stats after = *batched->batching();
    const decode_batcher_stats isolated_after = unshared_too ? *isolated->batching() : decode_batcher_stats{};
    const decode_batcher_stats salted_after = unshared_too ? *salted->batching() : decode_batcher_stats{};
    const auto batches = after.batches - before.batches;
    const double mean_batch =
        batches == 0 ? 0.0 : static_cast<double>(after.steps - before.steps) / static_cast<double>(batches);
    // Prompt tokens not computed: continued retained caches and shared pages.
    // Prompt tokens a batcher did not compute between two of its counters.
    const auto spared = [](const decode_batcher_stats& from, const decode_batcher_stats& to) {
      return (to.reused_tokens + to.shared_tokens) - (from.reused_tokens + from.shared_tokens);
    };
    const auto cached_tokens = spared(before, after);
    const auto shared_tokens = after.shared_tokens - before.shared_tokens;
    const auto prefix_waits = after.prefix_waits - before.prefix_waits;
    equal = equal && same;
    const double ratio = p.tokens_per_s() > 0 ? b.tokens_per_s() / p.tokens_per_s() : 0.0;
    if (!o.json_only) {
      const auto row = [&](const char* how, const load_result& r, const std::string& batch) {
        std::printf("%8d  %-11s  %9.2f  %9.1f  %8.1fms  %8.1fms  %10s\n", c, how, c * o.rounds / r.wall_s,
                    r.tokens_per_s(), median(r.first_token_s) * 1e3,
                    *std::max_element(r.first_token_s.begin(), r.first_token_s.end()) * 1e3, batch.c_str());
      };
      char mb[32];
      std::snprintf(mb, sizeof mb, "%.2f", mean_batch);
      row("batched", b, mb);
      if (unshared_too) {
        row("unshared", pooled[2], "");
        row("isolated", pooled[3], "");
        row("salted", pooled[kSaltedWay], "");
      }
      if (adapted) row("adapters", pooled[adapted_way], "");
      row("per-request", p, "");
      std::printf("%8s  batched / per-request tokens/s: %.2fx; prompt tokens from other requests' caches: %llu of %d "
                  "(%llu on shared pages; %llu requests waited for a prefix)\n",
                  "", ratio, static_cast<unsigned long long>(cached_tokens),
                  c * o.rounds * (o.shared_prefix + o.prompt_tokens), static_cast<unsigned long long>(shared_tokens),
                  static_cast<unsigned long long>(prefix_waits));
    }
    json jb = b.to_json(c * o.rounds);
    jb["mean_batch"] = mean_batch;
    jb["cached_prompt_tokens"] = cached_tokens;
    jb["shared_prompt_tokens"] = shared_tokens;
    jb["prefix_waits"] = prefix_waits;
    json level = {{"clients", c},
                  {"batched", jb},
                  {"per_request", p.to_json(c * o.rounds)},
                  {"batched_to_per_request_tokens_per_s", ratio},
                  {"same_text", same}};
    if (unshared_too) {
      // The batched way against each: its figures and ratios, and a line.
      const auto against = [&](const char* name, const load_result& r, const char* what) {
        const way_ratios w = compare_ways(b, r);
        level[name] = r.to_json(c * o.rounds);
        level[std::string("batched_to_") + name + "_tokens_per_s"] = w.tokens_per_s;
        level[std::string(name) + "_to_batched_first_text_p50"] = w.first_text_p50;
        level[std::string(name) + "_to_batched_first_text_max"] = w.first_text_max;
        if (!o.json_only)
          std::printf("%8s  %s: %.2fx tokens/s; time to first text %.2fx shorter (p50), %.2fx (worst)\n", "", what,
                      w.tokens_per_s, w.first_text_p50, w.first_text_max);
      };
      against("unshared", pooled[2], "shared prompt pages against none");
      against("isolated", pooled[3], "shared caches against isolated requests");
      against("salted", pooled[kSaltedWay], "shared caches against a salt per client");
      // Isolated: no prompt token from another request's cache, ever.
      level["isolated"]["cached_prompt_tokens"] = spared(isolated_before, isolated_after);
      // Salted: only from the same client's earlier requests.
      level["salted"]["cached_prompt_tokens"] = spared(salted_before, salted_after);
      const way_ratios s = compare_ways(pooled[kSaltedWay], pooled[3]);
      level["salted_to_isolated_tokens_per_s"] = s.tokens_per_s;
      level["isolated_to_salted_first_text_p50"] = s.first_text_p50;
      if (!o.json_only)
        std::printf("%8s  a salt per client against isolated requests: %.2fx tokens/s; time to first text %.2fx "
                    "shorter (p50)\n",
                    "", s.tokens_per_s, s.first_text_p50);
    }
    if (adapted) {
      // The requests naming adapters against the base model's, batched both.
      const way_ratios w = compare_ways(pooled[adapted_way], b);
      level["adapters"] = pooled[adapted_way].to_json(c * o.rounds);
      level["adapters_to_batched_tokens_per_s"] = w.tokens_per_s;
      if (!o.json_only)
        std::printf("%8s  %d adapter(s) of rank %d against the base model, batched both: %.2fx tokens/s\n", "",
                    o.adapters, o.adapter_rank, w.tokens_per_s);
    }
    levels.push_back(level);
  }
  const json out = {{"bench", "api_local"},
                    {"layers", cfg.n_layers},
                    {"hidden", cfg.hidden_size},
                    {"device", be.dev().str()},
                    {"weights", weight_format_name(weights)},
                    {"prompt_tokens", o.prompt_tokens},
                    {"shared_prefix", o.shared_prefix},
                    {"new_tokens", o.new_tokens},
                    {"rounds", o.rounds},
                    {"adapters", o.adapters},
                    {"adapter_rank", o.adapter_rank},
                    {"levels", levels},
                    {"same_text", equal},
                    {"step_graph_counts", step_graph_report()}};
  if (!o.json_only)
    std::printf("greedy text batched equals a generator per request: %s\n", equal ? "yes" : "NO");
  std::printf("%s\n", out.dump().c_str());
  return equal && failed == 0 ? 0 : 1;
}

}  // namespace corolla::app
