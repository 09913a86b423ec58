// apps/bench_api_load.hpp — what the API benchmarks share: their default
// tokenizer, concurrent streaming clients on the HTTP API, and the figures
// one level of concurrency yields (bench api, bench api --local).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace corolla::app {

using bench_clock = std::chrono::steady_clock;

/// corolla bench api's options.
struct api_bench_options {
  std::string model_dir;
  std::uint64_t seed = 0;
  int servers = 2;
  std::vector<int> clients{1, 8, 32};
  int prompt_tokens = 16;
  int new_tokens = 16;
  int rounds = 3;
  bool local = false;           ///< the model in this process (apps/bench_api_local.cpp)
  std::string device = "auto";  ///< with local
  std::string weights = "f32";  ///< with local
  int shared_prefix = 0;        ///< tokens every prompt starts with (then: also without shared pages)
  int turns = 1;                ///< swarm: > 1 adds conversations of that many turns per level
  /// local: > 0 adds the batcher serving that many LoRA adapters, the
  /// clients' requests naming them in turn
  int adapters = 0;
  int adapter_rank = 8;         ///< their rank (all linear weights adapted)
  bool json_only = false;
};

/// corolla bench api --local: the API over the model in this process, its
/// decode steps batched vs a generator per request. Returns the exit code.
int run_bench_api_local(const api_bench_options& o);

double seconds_between(bench_clock::time_point a, bench_clock::time_point b);

/// A byte-level BPE tokenizer.json with exactly `vocab` ids: the 256 bytes,
/// then merges of printable byte pairs, so every id the random model can
/// generate decodes to text.
void write_bench_tokenizer(const std::filesystem::path& dir, int vocab);

/// What one level of concurrency measured, one way.
struct load_result {
  double wall_s = 0;
  std::vector<double> first_token_s;  ///< per request
  std::vector<double> request_s;      ///< per request
  std::vector<std::string> texts;     ///< per request
  int tokens = 0;                     ///< generated in all
  int failed = 0;

  /// Room for the figures of `clients` requests.
  static load_result for_clients(int clients);
  /// Generated tokens per second of wall time.
  double tokens_per_s() const { return wall_s > 0 ? tokens / wall_s : 0.0; }
  /// The level's JSON figures: requests/s (of `requests` in all), tokens/s,
  /// time to first text (median, worst), failures.
  nlohmann::json to_json(int requests) const;
};

double median(std::vector<double> v);
double mean(const std::vector<double>& v);

/// Adds round `r` to the pooled figures `into`.
void pool(load_result& into, const load_result& r);

/// How one way (`fast`) compares with another (`slow`): tokens/s fast over
/// slow, and time to first text slow over fast, median and worst (0 where a
/// figure is missing).
struct way_ratios {
  double tokens_per_s = 0, first_text_p50 = 0, first_text_max = 0;
};
way_ratios compare_ways(const load_result& fast, const load_result& slow);

/// `n` prompts, each `shared` followed by `own()`'s ids.
std::vector<std::vector<std::int32_t>> prompts_after(const std::vector<std::int32_t>& shared, int n,
                                                     const std::function<std::vector<std::int32_t>()>& own);

/// `clients` streaming greedy requests at once through the HTTP API on
/// 127.0.0.1:`port` (request i gets prompts[i % size], `new_tokens` tokens,
/// end of sequence ignored). With a `salt_prefix`, client i sends the
/// cache_salt `salt_prefix` + i (its caches apart from the others'). With
/// `models`, client i names models[i % size] instead of `model_id` (LoRA
/// adapters served beside it).
load_result run_http(int port, const std::string& model_id, const std::vector<std::vector<std::int32_t>>& prompts,
                     int clients, int new_tokens, const std::string& salt_prefix = {},
                     const std::vector<std::string>& models = {});

}  // namespace corolla::app
