// corolla bench api --local — the OpenAI-compatible API over the model in
// this process (`corolla api --local`), under 1, 8 and 32 concurrent
// streaming clients, two ways in the same run: the requests' decode steps
// batched by one actor (actors/decode_batcher.hpp, the default) and a
// generator per request (--batching off, what the API did before):
//  * requests/s and generated tokens/s of each, and their ratio;
//  * time to first text, median and worst;
//  * the batcher's mean batch at each level, and the prompt tokens its
//    retained caches spared (every prompt is its own, after --shared-prefix
//    tokens they all share: a system prompt);
//  * greedy text must be the same both ways.
// Rounds alternate which engine goes first; both serve from the same
// weights (one model in memory).
#include <algorithm>
#include <cstdio>
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
  for (int c : o.clients)
    if (c < 1) throw std::invalid_argument("--clients must be positive");
  const bench_model_dir on_disk(o.model_dir, "api", o.seed, [](const std::filesystem::path& d) {
    write_bench_tokenizer(d, bench_llama_config().vocab_size);
  });
  const std::filesystem::path& dir = on_disk.path();
  const weight_format weights = parse_weights_flag(o.weights);
  Backend& be = backend_for(parse_device(o.device));
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
  // all share (a system prompt).
  const std::vector<std::int32_t> shared = random_ids(o.shared_prefix);
  const auto fresh_prompts = [&](int n) {
    std::vector<std::vector<std::int32_t>> prompts;
    for (int i = 0; i < n; ++i) {
      prompts.push_back(shared);
      const auto own = random_ids(o.prompt_tokens);
      prompts.back().insert(prompts.back().end(), own.begin(), own.end());
    }
    return prompts;
  };

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

  // Warm-up: the first connection, buffers, the inference copies.
  run_http(batched_server.port(), model_id, fresh_prompts(1), 1, 2);
  run_http(per_request_server.port(), model_id, fresh_prompts(1), 1, 2);

  json levels = json::array();
  bool equal = true;
  int failed = 0;
  if (!o.json_only)
    std::printf("%8s  %-11s  %9s  %9s  %10s  %10s  %10s\n", "clients", "decoding", "req/s", "tokens/s", "TTFT p50",
                "TTFT max", "mean batch");
  for (int c : o.clients) {
    std::fprintf(stderr, "bench api --local: %d concurrent client(s)...\n", c);
    load_result b, p;
    bool same = true;
    const decode_batcher_stats before = *batched->batching();
    for (int round = 0; round < o.rounds; ++round) {
      const auto prompts = fresh_prompts(c);
      load_result rb, rp;
      if (round % 2 == 0) {
        rb = run_http(batched_server.port(), model_id, prompts, c, o.new_tokens);
        rp = run_http(per_request_server.port(), model_id, prompts, c, o.new_tokens);
      } else {
        rp = run_http(per_request_server.port(), model_id, prompts, c, o.new_tokens);
        rb = run_http(batched_server.port(), model_id, prompts, c, o.new_tokens);
      }
      same = same && rb.texts == rp.texts;
      failed += rb.failed + rp.failed;
      pool(b, rb);
      pool(p, rp);
    }
    const decode_batcher_stats after = *batched->batching();
    const auto batches = after.batches - before.batches;
    const double mean_batch =
        batches == 0 ? 0.0 : static_cast<double>(after.steps - before.steps) / static_cast<double>(batches);
    const auto cached_tokens = after.reused_tokens - before.reused_tokens;
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
      row("per-request", p, "");
      std::printf("%8s  batched / per-request tokens/s: %.2fx; prompt tokens from retained caches: %llu of %d\n", "",
                  ratio, static_cast<unsigned long long>(cached_tokens),
                  c * o.rounds * (o.shared_prefix + o.prompt_tokens));
    }
    json jb = b.to_json(c * o.rounds);
    jb["mean_batch"] = mean_batch;
    jb["cached_prompt_tokens"] = cached_tokens;
    levels.push_back({{"clients", c},
                      {"batched", jb},
                      {"per_request", p.to_json(c * o.rounds)},
                      {"batched_to_per_request_tokens_per_s", ratio},
                      {"same_text", same}});
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
                    {"levels", levels},
                    {"same_text", equal},
                    {"step_graph_counts", step_graph_report()}};
  if (!o.json_only)
    std::printf("greedy text batched equals a generator per request: %s\n", equal ? "yes" : "NO");
  std::printf("%s\n", out.dump().c_str());
  return equal && failed == 0 ? 0 : 1;
}

}  // namespace corolla::app
