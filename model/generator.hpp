// model/generator.hpp — local text generation: prefill, then decode.
//
// The prompt runs through the blocks once (prefill, optionally in chunks),
// filling a paged KV cache; then each step embeds the last token, runs one
// row through every block against the cache, and samples from the logits of
// that row. After the first decode step the loop allocates nothing: the
// head, the stage and the sampler work in preallocated buffers, and the KV
// cache takes a page from the pool only every page_tokens tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/head.hpp"
#include "model/kv_cache.hpp"
#include "model/sampler.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"
#include "model/workspace.hpp"

namespace corolla {

/// What one generate() call does.
struct generation_params {
  int max_new_tokens = 32;  ///< >= 0
  sampling_params sampling; ///< greedy by default
  bool ignore_eos = false;  ///< keep going past the end-of-sequence token
  /// End-of-sequence id; -1 takes the model config's eos_token_id (none
  /// when that is -1 too).
  int eos_id = -1;
  /// Rows per prefill step; 0 runs the whole prompt as one chunk.
  int prefill_chunk = 0;
  /// More ids that end generation like the end-of-sequence token (a chat
  /// template's end of turn, e.g. Llama 3's <|eot_id|>, ChatML's
  /// <|im_end|>); also ignored with ignore_eos.
  std::vector<std::int32_t> stop_ids;
  /// Asked after each generated token (after the token callback): true
  /// stops generation there (reason = caller), e.g. a stop string matched
  /// or the client went away.
  std::function<bool()> should_stop;
};

/// Why generation stopped.
enum class stop_reason {
  max_tokens,  ///< max_new_tokens were generated
  eos,         ///< the end-of-sequence token (or a stop id) was generated (and is included)
  context,     ///< prompt + generated tokens reached the model context
  caller,      ///< generation_params::should_stop said so
};

/// The outcome of generate().
struct generation_result {
  std::vector<std::int32_t> tokens;  ///< generated ids only (not the prompt)
  stop_reason reason = stop_reason::max_tokens;
  int prompt_tokens = 0;
  /// Seconds from the start until the first token was sampled (the prompt's
  /// forward, the head and the sampler).
  double prefill_seconds = 0.0;
  /// Seconds of the decode steps (each: one row through the model, sampled).
  double decode_seconds = 0.0;
  /// Decode steps run: tokens.size() - 1 when any token was generated.
  int decode_steps = 0;
};

/// Called with each generated id as soon as it is sampled (streaming).
using token_callback = std::function<void(std::int32_t)>;

/// Runs `ids` (at positions [start, start + ids.size())) through the whole
/// model and returns the logits of the last row (vocab_size values, valid
/// until the next call). Throws model_error when it cannot.
using logits_step = std::function<std::span<const float>(std::span<const std::int32_t> ids, std::int64_t start)>;

/// The generation loop over any way of computing logits (in this process, or
/// through a swarm): validates the request (the errors listed at
/// generator::generate), prefills the prompt (in prefill_chunk pieces),
/// samples, and decodes one token per step until max_new_tokens, the
/// end-of-sequence token or the context.
generation_result generate_tokens(const model_config& cfg, std::span<const std::int32_t> prompt,
                                  const generation_params& p, const logits_step& step,
                                  const token_callback& on_token = {});

/// Runs generation for one model in this process. Not thread-safe; one
/// generate() at a time. The model is borrowed (its weights shared, not
/// copied) and must outlive the generator.
class generator {
 public:
  /// A generator whose KV cache may hold `kv_budget_bytes` (0 = enough for
  /// one sequence of the full context; pages are taken lazily either way).
  /// `weights` is the format of the linear weights decode reads: f32 (the
  /// model's own parameters), or bf16, int8 or nf4 (copies of every block's
  /// q, k, v, o, gate, up, down and of the LM head made here,
  /// stage::use_inference_weights and head::use_inference_weights; norms,
  /// biases and embeddings stay f32). The copies are a snapshot of
  /// the model's parameters at construction and live next to them (the
  /// model keeps its f32 weights). A model loaded for inference only
  /// (transformer::load_inference) has no f32 block weights: its generators
  /// read its inference weights (shared), and `weights` must be their
  /// format (model_error otherwise). `kv` is the KV cache's element type:
  /// f32, or bf16/f16 (half the cache memory; keys and values rounded once
  /// as they are stored). Throws model_error for another KV dtype.
  explicit generator(transformer& model, std::size_t kv_budget_bytes = 0,
                     weight_format weights = weight_format::f32, dtype kv = dtype::f32);
  /// A generator of the same model reading `weights_of`'s inference weights
  /// (its format, the copies shared, not made again), with a KV cache and
  /// workspace of its own: N generators of one model (a local API's
  /// concurrent requests) hold one set of weights. `weights_of` must be a
  /// generator of `model`; it may be destroyed first (the shared tensors
  /// keep their storage). Throws tensor_error for a generator of another
  /// shape or backend.
  generator(transformer& model, const generator& weights_of, std::size_t kv_budget_bytes = 0,
            dtype kv = dtype::f32);

  /// Generates up to p.max_new_tokens tokens after `prompt`. Throws
  /// model_error for an empty prompt, an id outside [0, V) ("prompt id X is
  /// outside the vocabulary (V tokens)"), a prompt longer than the context
  /// ("prompt of N tokens exceeds the model context of P"), invalid
  /// sampling parameters, or a KV budget too small. When prompt +
  /// max_new_tokens exceeds the context it stops there (reason = context).
  generation_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                             const token_callback& on_token = {});

  /// Generates after trained deep prompts (what `corolla finetune` saves,
  /// Petals' deep prompt tuning): `prompts` [n_layers, P, D] f32 on the
  /// host. Every generation then starts with P virtual positions [0, P):
  /// they enter block 0 as zero rows and prompt i is added to them at the
  /// input of block i; the prompt tokens follow at positions P.., as in
  /// prompt tuning. The context left for tokens shrinks by P. An undefined
  /// tensor removes them. Throws model_error for a wrong shape or dtype, or
  /// P beyond the context.
  void set_deep_prompts(const Tensor& prompts);
  /// Virtual prefix positions in front of every generation (0 = none).
  std::int64_t prefix_length() const { return prompts_.defined() ? prompts_.dim(1) : 0; }

  /// The model's shape.
  const model_config& config() const { return cfg_; }
  /// The format of the linear weights decode reads (see the constructor).
  weight_format weights() const { return stage_.inference_format(); }
  /// The pool the generator's sequences draw from.
  const kv_pool& pool() const { return *pool_; }
  /// The blocks and the head it computes with (their inference weights).
  const stage& blocks() const { return stage_; }
  const head& output_head() const { return head_; }

 private:
  struct bare {};
  /// What both public constructors share: the head, the stage (over the
  /// model's parameters, or sharing an inference-only model's weights),
  /// the KV cache and the buffers; no inference weights made or shared yet.
  generator(transformer& model, std::size_t kv_budget_bytes, dtype kv, bare);
  /// Embeds `ids` at positions start.., runs the blocks, and leaves the
  /// logits of the last row in logits_ (host). Throws on a full cache.
  void step(std::span<const std::int32_t> ids, std::int64_t start, kv_sequence& kv);
  /// Runs the P prefix positions through the blocks into `kv` (prompts set).
  void prefix(kv_sequence& kv);

  model_config cfg_;
  Backend* be_;
  head head_;
  stage stage_;
  std::shared_ptr<kv_pool> pool_;
  row_buffer ids_{0, dtype::i32};        ///< on the host (model/workspace.hpp)
  row_buffer positions_{0, dtype::i32};  ///< on the host
  row_buffer hidden_;
  Tensor logits_;       ///< [1, V] on the device
  Tensor host_logits_;  ///< [1, V] on the host (== logits_ on the CPU backend)
  Tensor prompts_;  ///< deep prompts [n_layers, P, D] on the backend's device, or undefined
  /// The decode step's recording (Backend::run_step: a CUDA graph with
  /// step graphs on), kept from one step to the next.
  std::unique_ptr<step_recording> decode_step_;
};

}  // namespace corolla
