// api/completion_engine.hpp — where the API's completions are computed: the
// model in this process, or a swarm of servers holding its blocks.
//
// Each engine serves up to `slots` requests at once; more wait for a free
// slot in arrival order. Locally the slots' steps run together by default:
// one actor (actors/decode_batcher.hpp) holds the model's blocks, one KV
// pool and the head; the prompts and decode steps of all requests waiting
// together go through the weights once, and the last `slots` finished
// requests' caches serve prompts that start the same way. Without batching a local slot is a
// generator of its own (its own KV cache and workspace; the model's
// weights, and the bf16/int8/nf4 copies the first generator makes of them,
// shared), each reading every weight per token. A swarm slot is a swarm client and
// a head of its own (embeddings and LM head shared), and every request opens
// its own session on the servers, which batch decode steps across sessions;
// a session may start on the servers' pages of another request's session
// that computed the same prompt prefix (a system prompt), so the servers
// compute and hold it once.
// A request keeps its slot until generation ends; ending it early (a stop
// string, a client that went away) closes its session and frees its cache.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/decode_batcher.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "api/swarm_prefix_board.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/transformer.hpp"

namespace corolla {
class lora_adapter;
}

namespace corolla::api {

/// What one generation reports besides the tokens.
struct engine_result {
  generation_result result;
  int failovers = 0;  ///< swarm failures recovered on the way
  int cached_tokens = 0;  ///< prompt tokens an earlier request's cache held (not computed)
};

/// A fixed number of slots; acquire() waits for a free one.
class slot_pool {
 public:
  explicit slot_pool(int slots);
  /// Blocks until a slot is free; returns its index.
  int acquire();
  void release(int slot);
  int size() const { return static_cast<int>(free_.size()); }
  /// Requests holding a slot now.
  int busy() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<bool> free_;
};

/// Computes completions. Thread-safe: HTTP threads call it concurrently.
class completion_engine {
 public:
  virtual ~completion_engine() = default;
  /// The model's shape.
  virtual const model_config& config() const = 0;
  /// Throws api_error 503 when the engine cannot serve a request now (no
  /// chain of servers covers every block), naming what is missing.
  virtual void check_ready() = 0;
  /// Generates after `prompt` (waiting for a free slot first). Throws
  /// model_error for a bad request (400), api_error 503 when the swarm fails
  /// for good. The prompt starts on, or waits for, the caches of requests of
  /// the same `cache_domain` only (the request's `cache_salt`; "" for
  /// none): requests of different domains share nothing, so `cached_tokens`
  /// and the time to the first token tell neither anything of the other's
  /// prompt.
  /// `adapter`: one of adapters() that every step computes with, its
  /// low-rank terms beside the frozen weights ("": the base model);
  /// requests of different adapters share no cache.
  virtual engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                                 const token_callback& on_token, const std::string& cache_domain,
                                 const std::string& adapter = {}) = 0;
  /// The LoRA adapters a request may name (its `model`), sorted; none by
  /// default.
  virtual std::vector<std::string> adapters() const { return {}; }
  /// Whether adapters() follows what the engine finds (a swarm's servers)
  /// rather than a list fixed when it was made.
  virtual bool discovers_adapters() const { return false; }
  /// Requests holding a slot now, and the number of slots.
  virtual int busy() const = 0;
  virtual int slots() const = 0;
  /// The decode batcher's counters, for an engine that batches its slots'
  /// steps in this process (none otherwise).
  virtual std::optional<decode_batcher_stats> batching() const { return std::nullopt; }
  /// What a swarm engine's prompts shared of each other's servers' pages
  /// (none for another engine, or with sharing off).
  virtual std::optional<prefix_board_stats> prompt_sharing() const { return std::nullopt; }
};

/// How a local engine runs its slots' decode steps.
enum class local_decoding {
  batched,      ///< together, through one decode_batcher (one pass over the weights per step of all)
  /// batched, but every request computes its prompt unless it continues a
  /// finished request's cache: no KV pages shared between requests
  /// (decode_batcher_options::share_prefixes off)
  batched_unshared,
  /// batched, and no request starts on another's cache, running or
  /// finished (none kept, no pages shared): `cached_tokens` is always 0,
  /// and neither it nor the time to the first token tells a client
  /// anything of another's prompt (`corolla api --isolate-requests`)
  batched_isolated,
  per_request,  ///< a generator per slot, each on its own HTTP thread
};

/// A LoRA adapter a local engine serves by name (`corolla api --adapter
/// NAME=DIR`): requests whose `model` is the name compute with it.
struct named_adapter {
  std::string name;
  std::shared_ptr<const lora_adapter> adapter;  ///< on the host
};

/// The model in this process (borrowed; it must outlive the engine), with
/// `weights` / `kv` as generator's and a KV budget of `slots` whole
/// contexts. `adapters`: served beside the base model, unmerged (their
/// terms beside the frozen weights, in the same batches as the base
/// model's requests: span_engine::add_adapter); batched decoding only.
/// Throws model_error for a KV dtype other than f32/bf16/f16, adapters with
/// per-request decoding or refused by the engine (a repeated name, another
/// model's), and as generator's constructor.
std::unique_ptr<completion_engine> make_local_engine(transformer& model, int slots, weight_format weights = weight_format::f32,
                                                     dtype kv = dtype::f32,
                                                     local_decoding decoding = local_decoding::batched,
                                                     const std::vector<named_adapter>& adapters = {});

/// Through the swarm `options` describe, over `runtime` (borrowed; it and
/// whatever options.discover reads must outlive the engine). `client_head`
/// is the model's embeddings and LM head, shared by the slots (each slot
/// reads its LM head in `weights`, as head::use_inference_weights). With
/// `share_prefixes`, a request's prompt starts on the servers' pages of a
/// running request's session holding the most of it, or waits for one still
/// computing a page more of it (api/swarm_prefix_board.hpp).
/// `adapters`: LoRA adapters the servers hold (`serve --adapter NAME=DIR`)
/// that requests may name, each NAME or NAME@DIGEST (as
/// swarm_client_options::adapter); a request's sessions open with its
/// adapter on servers holding it only. A name without a digest is pinned to
/// the digest the first server holding it announces, for every later request.
/// "*" among them: requests may also name any adapter the swarm's servers
/// hold over the whole model now (swarm_client::complete_adapters, asked at
/// most every adapter_discovery_interval; the first
/// max_discovered_adapters names met are taken, later ones ignored, so
/// that a swarm cannot grow the engine's clients and metric series
/// without bound).
/// Throws std::invalid_argument for options.adapter set (name adapters
/// here: requests choose them), a malformed or repeated name.
/// How old a swarm engine's list of discovered adapters may grow.
inline constexpr std::chrono::seconds adapter_discovery_interval{5};
/// The most adapter names a swarm engine discovers (ever).
inline constexpr std::size_t max_discovered_adapters = 64;

std::unique_ptr<completion_engine> make_swarm_engine(node& runtime, swarm_client_options options, head client_head,
                                                     int slots, weight_format weights = weight_format::f32,
                                                     bool share_prefixes = true,
                                                     const std::vector<std::string>& adapters = {});

}  // namespace corolla::api
