// actors/decode_batcher.hpp — the model in this process behind one actor
// that runs the decode steps of many generations together.
//
// `corolla api --local` serves many requests at once. One generator per
// request reads every weight once per token of each request; a decode step
// is a matrix-vector product per projection, bound by memory bandwidth, so
// N requests cost N passes over the weights. The batcher owns one
// span_engine over every block (one paged KV pool, a session per
// generation) and the head on the same backend; each generation sends its
// steps to it as messages, and the steps waiting together run as one
// batch: the rows embedded together, one GEMM per projection over all of
// them (span_engine::prepare_steps and run_prepared: the rows stay on the
// engine's device), the LM head over each step's last row, and each
// generation gets its own row of logits back to sample from (the one copy
// to the host a batch makes). A batch of decode steps only runs as one
// Backend::run_step recorded per number of steps (a CUDA graph with step
// graphs on, kernels/cuda/step_graph.cpp). Prompts join
// the batch too (their rows through the same products, each attending over
// its own cache), so a new request's prefill rides on the others' decode
// step. A batch waits, briefly, for the generations of the last batches
// whose next step is still on its way, and for the first step of one just
// opened (schedule/decode_gathering.hpp, the rule the swarm's servers use).
// Finished generations may leave their cache behind for a later prompt
// that starts the same way (options:
// retained_sessions), which then computes only the rest. Generations whose
// prompts begin alike (a system prompt) hold the same KV pages for it
// (kv_sequence::share_prefix: whole pages shared, the last one copied): a
// new one starts on a running or retained generation's pages, and one that
// arrives while another is still computing that prefix waits for it
// instead of computing it too.
//
// Results equal one generator's per request up to GEMM rounding (a batch's
// products sum in another order, ~1e-6): greedy text is the same except at
// near-ties of the logits.
//
// The actor is detached (its own thread): its compute blocks no CAF worker.
// generate() blocks the calling thread (an HTTP thread), which must not be
// an actor's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/span_engine.hpp"
#include "schedule/decode_gathering.hpp"

namespace corolla {

/// How a decode batcher runs.
struct decode_batcher_options {
  /// How long a queue of steps waits for the generations of the last
  /// batches that have not sent their next step yet.
  swarm::gathering_policy gathering{};
  /// Most rows (tokens) one batch holds: a step that would pass it runs
  /// the steps queued before it first, and a longer prompt runs alone.
  std::int64_t max_batch_rows = 2048;
  /// Prompts are sent in pieces of at most this many tokens (or the
  /// request's own prefill_chunk when smaller), so a long prompt holds the
  /// others' decode steps for one piece at a time, not for its whole forward.
  int prefill_chunk = 512;
  /// Finished generations whose KV cache is kept for reuse (0: none). A new
  /// prompt that starts with the tokens one of them holds continues from it
  /// (the shared prefix is not computed again: a chat's system prompt and
  /// earlier turns). When one must go (one too many, or a batch needs their
  /// pages), the cache domain holding the most of what ran out (kept
  /// caches, or kept tokens) lets its least recently finished one go, never
  /// the most recently finished while another is kept
  /// (schedule/cache_retention.hpp).
  int retained_sessions = 0;
  /// Generations whose prompts begin alike hold the same KV pages for what
  /// they share (a running or retained generation's; the page it ends
  /// inside copied), and one arriving while another computes it waits for
  /// it. Off: each computes its prompt unless it continues a retained
  /// cache, cut back to what it shares (what the batcher did before;
  /// `corolla bench api --local --shared-prefix N` compares both).
  bool share_prefixes = true;
};

/// What one generation through the batcher reports besides its tokens.
struct batched_generation {
  generation_result result;
  /// Prompt tokens whose keys and values came from another generation's
  /// cache (a retained one continued, or pages shared) instead of being
  /// computed.
  int cached_prompt_tokens = 0;
};

/// What a decode batcher has done (counters since it started).
struct decode_batcher_stats {
  std::uint64_t sessions_opened = 0;
  std::uint64_t sessions_closed = 0;
  std::uint64_t batches = 0;          ///< batches run
  std::uint64_t steps = 0;            ///< steps in them (prompts and decode steps)
  std::uint64_t decode_steps = 0;     ///< steps of one token
  std::uint64_t prefill_steps = 0;    ///< steps of more than one token (prompts)
  std::uint64_t prefill_tokens = 0;
  std::uint64_t max_batch = 0;        ///< most steps one batch held
  std::uint64_t gathering_waits = 0;  ///< batches that waited for late generations
  std::uint64_t step_errors = 0;
  std::uint64_t reused_sessions = 0;  ///< generations that continued a retained one's cache
  std::uint64_t reused_tokens = 0;    ///< prompt tokens not computed thanks to that
  std::uint64_t evicted_sessions = 0; ///< retained caches let go (for room or by count)
  std::uint64_t shared_sessions = 0;  ///< generations that began holding another's KV pages
  std::uint64_t shared_tokens = 0;    ///< prompt tokens not computed thanks to that
  std::uint64_t prefix_waits = 0;     ///< generations that waited for another's prompt to share it
  std::int64_t kv_pages_in_use = 0;   ///< KV pages held now (each once, however many hold it)
  std::int64_t kv_pages_shared = 0;   ///< of them, pages more than one generation holds now
  double batch_seconds = 0;           ///< compute time of the batches
  /// Mean steps per batch (0 before the first batch).
  double mean_batch() const {
    return batches == 0 ? 0.0 : static_cast<double>(steps) / static_cast<double>(batches);
  }
};

/// One model's generations through one batching actor. Thread-safe:
/// generate() may run on many threads at once (that is the point).
class decode_batcher {
 public:
  /// Spawns the actor over `engine` (every block of the model: first() 0,
  /// last() n_layers; its KV budget bounds the tokens of the generations
  /// running at once) and `h` (embeddings and LM head of the same model, on
  /// the engine's backend, with whatever inference weights it reads). Both
  /// move into the actor. Throws std::invalid_argument for an engine that
  /// does not cover the whole model, or a head of another shape or backend.
  decode_batcher(caf::actor_system& system, span_engine engine, head h, decode_batcher_options options = {});
  /// Stops the actor (as stop()).
  ~decode_batcher();
  decode_batcher(const decode_batcher&) = delete;
  decode_batcher& operator=(const decode_batcher&) = delete;

  /// The model's shape.
  const model_config& config() const { return cfg_; }

  /// Generates up to p.max_new_tokens tokens after `prompt`, with
  /// generator::generate's validation and stop rules (generate_tokens).
  /// Throws model_error for a bad request or a full KV cache ("KV cache
  /// full: ..."); std::runtime_error when the computation fails or the
  /// batcher has stopped.
  /// `cache_domain`: the generation starts on, or waits for, the caches of
  /// generations of the same domain only (the API's `cache_salt`: clients
  /// of one domain learn nothing of another's prompts from `cached_tokens`
  /// or timing). "" is a domain too, the default one.
  /// `adapter`: the name of a LoRA adapter the engine holds
  /// (span_engine::add_adapter) that every step of the generation takes,
  /// its terms beside the frozen weights in the same batches as the others'
  /// ("": none). Caches never cross adapters (schedule::adapter_domain). An
  /// adapter the engine does not hold: model_error naming those it holds.
  batched_generation generate(std::span<const std::int32_t> prompt, const generation_params& p,
                              const token_callback& on_token = {}, const std::string& cache_domain = {},
                              const std::string& adapter = {});
  /// The adapters the engine holds (span_engine::adapters), sorted.
  const std::vector<std::string>& adapters() const { return adapters_; }

  /// The counters now (asks the actor; waits for the batch it is running).
  decode_batcher_stats stats() const;

  /// Stops the actor: generations waiting for a step fail at once
  /// (std::runtime_error), as do later ones; the engine and head are let go.
  void stop();

 private:
  caf::actor_system& system_;
  caf::actor actor_;
  model_config cfg_;
  std::vector<std::string> adapters_;
  int prefill_chunk_ = 512;
  std::atomic<std::uint64_t> next_session_{0};
};

}  // namespace corolla
