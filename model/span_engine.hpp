// model/span_engine.hpp — what a swarm server computes over its span of blocks.
//
// A volunteer server (Petals' role, issue 4) hosts blocks [first, last) of a
// model and serves two kinds of clients:
//
//  * Inference sessions. Each session keeps the attention (KV) cache of its
//    tokens in the server's one paged pool (model/kv_cache.hpp), sized by a
//    token budget and allocated whole when the engine is made; a session
//    takes pages from it as its tokens arrive, never reserving its maximum
//    length up front. A step sends hidden states [n, D] for positions
//    [start, start + n) and gets the span's output back. A start below the
//    session's length rolls the cache back first (replay after a failover,
//    speculative decoding), anything up to the length is accepted. A retried
//    step (same step id, start and size as the last one) gets the stored
//    output back instead of being recomputed. Decode steps of many sessions
//    run together (decode_batch): one GEMM per projection over all rows.
//
//  * Adapters. A server may hold LoRA adapters by name (add_adapter; Petals'
//    servers' --adapters). A session opened with one runs its steps with the
//    adapter's low-rank terms beside the frozen weights (model/
//    lora_factors.hpp), so sessions of different adapters and of none share
//    one copy of the weights and one decode batch.
//
//  * Fine-tuning clients (stateless). forward / backward of B sequences of T
//    tokens through the span, optionally with deep prompts: P trainable
//    vectors per block, ADDED to the hidden states of each sequence's first
//    P positions at the input of that block (Petals' deep prompt tuning; see
//    docs/swarm_serving.md). backward recomputes the span's forward: nothing
//    is kept between calls. The server's weights are frozen: backward
//    returns the input gradient and the per-block prompt gradients only.
//
// Errors are values (span_expected): bad input from the network is normal
// and the server keeps serving. A failed step changes nothing: everything
// is validated and the KV pages reserved before any computation.
//
// Not thread-safe: no method may run concurrently with another on the same
// engine. The server actor owns its engine and calls it from one thread at
// a time (it serialises requests and batches decode steps itself). The KV
// pool underneath is thread-safe, but the session table is not.
//
// This file knows nothing of networking or CAF: the server actor wraps it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/outcome.hpp"
#include "model/safetensors.hpp"
#include "model/stage.hpp"
#include "model/workspace.hpp"

namespace corolla {

/// What went wrong with a request to a span_engine (the server actor maps
/// these to its wire errors).
enum class span_errc : std::uint8_t {
  unknown_session,    ///< no open session has that id
  duplicate_session,  ///< open_session with an id already open
  invalid_argument,   ///< wrong shape, dtype, size, or an empty request
  bad_position,       ///< a start beyond the session's tokens, or past its max length
  cache_full,         ///< the KV budget cannot hold the step's tokens
  internal,           ///< the computation itself failed (a bug or out of memory)
  wrong_span,         ///< blocks this server does not hold (it moved, or the client's view is stale)
  unknown_adapter,    ///< open_session with an adapter this server does not hold
};

/// "unknown_session", "cache_full", ...
const char* span_errc_name(span_errc e);

/// An error value: a code and one complete message for the client.
struct span_error {
  span_errc code = span_errc::internal;
  std::string message;
};

/// A value or a span_error (model/outcome.hpp). Test it with `if (r)`
/// before calling value().
template <class T>
using span_expected = outcome<T, span_error>;

/// How a span_engine is set up (beyond its blocks and token budget).
struct span_engine_options {
  /// Tokens per KV page: the granularity of cache allocation.
  int page_tokens = 16;
  /// Most rows (B*T) one stateless forward/backward request may carry: its
  /// activations are about 10-20 x rows x D floats per block.
  std::int64_t max_forward_rows = 8192;
  /// Element type of the KV cache: f32, or bf16/f16 (half the bytes per
  /// token, so twice the tokens per budget; keys and values are rounded
  /// once as they are stored and read back into f32).
  dtype kv_dtype = dtype::f32;
  /// When the KV cache's pages are allocated (model/kv_cache.hpp): up front,
  /// the whole budget when the engine is made (a server then holds every
  /// token it announces, and a budget the device cannot hold fails at
  /// start), or lazily as sessions grow.
  kv_allocation cache_allocation = kv_allocation::up_front;
  /// Called after each block load() read: (blocks done, blocks in all).
  std::function<void(int done, int total)> on_block_loaded;
  /// The linear weights the cached forwards read (stage::use_inference_weights,
  /// applied by the constructor when not f32).
  weight_format weights = weight_format::f32;
  /// With `weights` other than f32: keep the f32 parameters beside them
  /// (fine-tuning requests then compute with the exact f32 weights). When
  /// false (seen by load() only), load() reads each block's parameters, makes its inference
  /// weights and frees them (stage::load_inference): the server holds the
  /// `weights` copies only, and fine-tuning requests compute with those,
  /// widened one block at a time.
  bool keep_parameters = true;
};

/// One session's decode step in a decode_batch.
struct decode_item {
  std::string session_id;
  Tensor hidden;                     ///< [n, D] float (f32, bf16 or f16), host; n is usually 1
  std::int64_t start_position = 0;   ///< position of the first row
  std::uint64_t step_id = 0;         ///< 0 = no retry detection
};

/// One session's step in a device-resident batch (span_engine::prepare_steps,
/// run_prepared): the rows themselves are the caller's, on the engine's
/// backend.
struct batch_step {
  std::string session_id;
  std::int64_t start_position = 0;  ///< position of the first row
  std::int64_t rows = 0;            ///< >= 1
};

/// Gradients of a stateless backward.
struct span_gradients {
  Tensor grad_input;    ///< [B*T, D] f32, host
  Tensor grad_prompts;  ///< [blocks, P, D] f32, host; undefined without deep prompts
  /// With a carried adapter (lora_span_values): the gradient of its values,
  /// laid out as they are, f32 [values], host; undefined without one.
  Tensor grad_lora;
};

struct lora_span_values;  // model/lora.hpp

/// One open session as seen by accounting.
struct span_session_info {
  std::string id;
  std::int64_t length = 0;      ///< tokens cached
  std::int64_t max_length = 0;  ///< as opened
  std::int64_t held_tokens = 0; ///< tokens its pages can hold (>= length, whole pages)
  std::int64_t prompt_positions = 0;  ///< deep prompts' positions (a prefix), 0 = none
  std::string adapter;                ///< the adapter its steps take, "" = none
};

struct span_session;
class lora_adapter;

/// The compute engine of one server: a stage over [first, last), a KV pool
/// sized by a token budget, the open sessions. See the file comment for the
/// protocol and for thread-safety (none: one call at a time).
class span_engine {
 public:
  /// An engine over `blocks` (at least one block) with room for
  /// `cache_tokens` tokens of KV cache, rounded up to whole pages:
  /// budget bytes = ceil(cache_tokens / page_tokens) * page_tokens *
  /// kv_bytes_per_token(). The pool lives on the stage's backend. Throws
  /// std::invalid_argument for an empty span, negative cache_tokens or
  /// non-positive options, and std::runtime_error when the pool is
  /// allocated up front (the default) and the device cannot hold it.
  span_engine(stage blocks, std::int64_t cache_tokens, const span_engine_options& options = {});
  /// Loads blocks [first, last) of `ck` (only their tensors) and builds the
  /// engine. Throws model_error for a missing or misshapen tensor, and as
  /// the constructor.
  static span_engine load(const checkpoint& ck, const model_config& cfg, int first, int last,
                          Backend& be, std::int64_t cache_tokens,
                          const span_engine_options& options = {});
  ~span_engine();
  span_engine(span_engine&&) noexcept;
  span_engine& operator=(span_engine&&) noexcept;

  /// The model's shape, the span and the stage computing it.
  const model_config& config() const { return stage_.config(); }
  int first() const { return stage_.first(); }
  int last() const { return stage_.last(); }
  int size() const { return stage_.size(); }
  stage& blocks() { return stage_; }

  // ---- memory accounting ----------------------------------------------------------
  /// Bytes one token's keys and values of `type` take over `n_blocks`
  /// blocks of `cfg` (what `--cache-tokens N` is multiplied by):
  /// 2 * n_blocks * Hkv * Dh * (4 for f32, 2 for bf16/f16).
  static std::size_t kv_bytes_per_token(const model_config& cfg, int n_blocks, dtype type = dtype::f32);
  /// Bytes one token's keys and values take over this span.
  std::size_t kv_bytes_per_token() const { return pool_->bytes_per_token(); }
  /// Tokens the whole budget holds (the cache_tokens asked for, rounded up
  /// to whole pages).
  std::int64_t cache_tokens() const;
  /// Tokens the pages not held by any session can hold: what a new session
  /// can count on (the DHT record's cache_tokens_left). Sessions also have
  /// slack in their last page, which this does not count.
  std::int64_t cache_tokens_left() const;
  /// Tokens closing sessions `ids` (unknown ones skipped) would add to
  /// cache_tokens_left(): their pages no other session holds.
  std::int64_t reclaimable_tokens(std::span<const std::string> ids) const;
  /// Bytes of KV pages held by sessions now.
  std::size_t cache_bytes_used() const;
  /// The KV pool (pages, budget).
  const kv_pool& pool() const { return *pool_; }
  /// Number of open sessions.
  std::size_t session_count() const { return sessions_.size(); }
  /// Every open session (order unspecified).
  std::vector<span_session_info> sessions() const;
  /// Tokens cached for session `id`, or unknown_session.
  span_expected<std::int64_t> session_length(const std::string& id) const;

  // ---- inference sessions ---------------------------------------------------------
  /// Opens session `id` for up to `max_length` tokens (positions
  /// [0, max_length)) over blocks [first_block, last_block) (-1: the span's
  /// own first / last; a client may route through part of a span: every
  /// step of the session then runs just those blocks, outside the decode
  /// batch). Takes no KV pages yet. Errors: blocks outside the span
  /// (wrong_span; an empty range is invalid_argument), an empty id or
  /// max_length <= 0 (invalid_argument), max_length beyond the model
  /// context ("max length M exceeds the model context of P"), an id already
  /// open (duplicate_session).
  ///
  /// `prompts` (optional): trained deep prompts for the session's blocks,
  /// f32 [to - from, P, D] on the host (what `corolla finetune` trains,
  /// sliced to these blocks). Positions [0, P) are then a prefix: at the
  /// input of each block i of the session, prompt i - from is added to the
  /// rows of those positions (as generator::set_deep_prompts does locally;
  /// the client sends zero rows for them). Steps that cover prefix
  /// positions run outside the decode batch. Errors (invalid_argument): a
  /// wrong dtype or shape, P < 1, or P >= max_length.
  ///
  /// `adapter` (optional): the name of an adapter this engine holds
  /// (add_adapter); every step of the session takes it. An adapter it does
  /// not hold is unknown_adapter.
  span_expected<void> open_session(const std::string& id, std::int64_t max_length, int first_block = -1,
                                   int last_block = -1, const Tensor& prompts = {},
                                   const std::string& adapter = "");
  /// Closes session `id` and returns its pages to the pool; unknown_session
  /// when it is not open.
  span_expected<void> close_session(const std::string& id);
  /// Starts session `to` (open, nothing cached yet) with the keys and values
  /// of the first `tokens` tokens of session `from`, whose steps the caller
  /// knows began with the same inputs, by holding the same KV pages
  /// (kv_sequence::share_prefix: the whole pages shared, the one they end
  /// inside copied). Returns the tokens `to` now holds (its next step
  /// starts there; fewer when the pool has no page for the copy). Errors:
  /// either session unknown (unknown_session); `to`
  /// holding tokens, `to` == `from`, or the two over other blocks or with
  /// deep prompts or adapters (invalid_argument).
  span_expected<std::int64_t> share_prefix(const std::string& to, const std::string& from, std::int64_t tokens);

  /// Runs hidden [n, D] (f32, bf16 or f16 on the host) for positions
  /// [start, start + n) through the span against session `id`'s cache and
  /// returns the output [n, D] (f32, host, owned by the caller).
  /// start < the session's length rolls the cache back to start first;
  /// start > length is a bad_position ("step starts at position P but the
  /// session holds L tokens"). A step whose step_id (non-zero), start and n
  /// equal the last successful step's returns that step's output again
  /// without computing (a retry). Other errors: n == 0, a wrong width or
  /// dtype (invalid_argument); start + n beyond max_length (bad_position);
  /// a full pool ("KV cache full: ...", cache_full). On any error the
  /// session is unchanged and stays usable.
  span_expected<Tensor> inference_step(const std::string& id, const Tensor& hidden,
                                       std::int64_t start, std::uint64_t step_id = 0);

  /// Runs several sessions' steps together: every item is validated (as
  /// inference_step) and its pages reserved, then all valid items' rows go
  /// through the span as one batch (one GEMM per projection per block over
  /// all rows; attention per session against its own cache). Results are in
  /// item order and equal running inference_step per item up to GEMM
  /// rounding (~1e-6); an item's error fails only that item. A session may
  /// appear once per batch (a second item for it is invalid_argument).
  std::vector<span_expected<Tensor>> decode_batch(std::span<const decode_item> items);

  // ---- device-resident batches (the in-process decode batcher) -----------------
  /// The first half of a batch whose rows never leave the device: validates
  /// each step (an open session of the whole span without deep prompts,
  /// once per call, rows >= 1, positions as inference_step checks them) and
  /// reserves its KV pages. An item's error is its own; nothing is computed.
  std::vector<span_expected<void>> prepare_steps(std::span<const batch_step> steps);
  /// The second half, for steps prepare_steps accepted (nothing in between):
  /// one Backend::run_step (`rec`: a CUDA graph with step graphs on) in
  /// which `fill(x)` queues the steps' rows into x [sum of rows, D] f32 on
  /// the engine's backend, consecutive in step order, the span runs over
  /// them in place (one step alone: the single-sequence path), and `use(x)`
  /// queues what reads the outputs (an LM head). Neither may read back to
  /// the host, and both must be repeatable (run_step may run them twice).
  /// A session's adapter adds its terms to its own rows; a batch holding
  /// one runs unrecorded (as decode_batch's). No output is kept for
  /// retries. On failure every step's cache is cut
  /// back to its start and the error (internal) is returned.
  span_expected<void> run_prepared(std::span<const batch_step> steps, std::unique_ptr<step_recording>& rec,
                                   const std::function<void(Tensor&)>& fill,
                                   const std::function<void(const Tensor&)>& use);

  // ---- adapters -------------------------------------------------------------------
  /// Holds LoRA adapter `a` as `name` for sessions that open with it: its
  /// factors for this span's blocks are copied to the stage's device
  /// (lora_adapter::factors; the rest of the adapter is not kept). Errors
  /// (invalid_argument): an empty name or one held already, an adapter made
  /// for another model, more than max_adapters.
  span_expected<void> add_adapter(const std::string& name, const lora_adapter& a);
  /// The names of the adapters held, sorted.
  std::vector<std::string> adapters() const;
  /// Their fingerprints (lora_adapter::digest), in the order of adapters().
  std::vector<std::string> adapter_digests() const;
  /// The most adapters one engine holds (what span.info may list).
  static constexpr std::size_t max_adapters = 64;

  // ---- stateless forward / backward (fine-tuning clients) -------------------------
  /// Forward of `batch` sequences of `seq` tokens (hidden [B*T, D], float,
  /// host; row b*T + t is token t of sequence b at position t) through
  /// blocks [first_block, last_block) of the span (-1 = the span's own
  /// bound). With deep prompts ([blocks, P, D], 1 <= P <= T) prompt i is
  /// added to rows b*T + [0, P) of every sequence at the input of block
  /// first_block+i. Returns [B*T, D] f32 (host). Errors (invalid_argument):
  /// non-positive B or T, T beyond the context, B*T beyond
  /// max_forward_rows, wrong shapes or dtypes; wrong_span for blocks
  /// outside the span. With `routing_margins`, it is set to one value per
  /// row: of a mixture-of-experts model the smallest routing_margin of the
  /// row over the blocks run (how near its routing came to a tie, which
  /// spot checks excuse), of a dense model +inf. With `adapter` (one this
  /// engine holds, else unknown_adapter) each adapted weight's output gets
  /// the adapter's low-rank term beside the frozen weight (block_forward's
  /// lora: two rank-r products, no merged copy of the weight). With
  /// `carried` instead, the client's own adapter for these blocks (Petals'
  /// client-side trainable parameters: a client training LoRA through the
  /// swarm) computes the same way; it is checked against the blocks
  /// (invalid_argument naming what does not fit, or a rank above
  /// max_carried_lora_rank) and kept for this request only. Not both.
  span_expected<Tensor> forward(const Tensor& hidden, int batch, int seq,
                                const Tensor& deep_prompts = Tensor(), int first_block = -1,
                                int last_block = -1, std::vector<float>* routing_margins = nullptr,
                                const std::string& adapter = "", const lora_span_values* carried = nullptr);
  /// Backward of forward() for the same inputs: given grad_output [B*T, D]
  /// (the gradient of the client's loss with respect to the span's output),
  /// recomputes the forward and returns the gradient with respect to hidden
  /// and, with deep prompts, with respect to each block's prompts (summed
  /// over the batch). The blocks' weights get no gradients, nor does a
  /// held adapter (the input gradient goes through it); a `carried` one's
  /// tensors get theirs (span_gradients::grad_lora). Errors as forward,
  /// plus a grad_output of another shape.
  span_expected<span_gradients> backward(const Tensor& hidden, const Tensor& grad_output,
                                         int batch, int seq,
                                         const Tensor& deep_prompts = Tensor(), int first_block = -1,
                                         int last_block = -1, const std::string& adapter = "",
                                         const lora_span_values* carried = nullptr);

 private:
  span_session* find(const std::string& id);
  /// find() for an item of a batch (`batch` names it in the error):
  /// unknown_session, or invalid_argument for a session already in `seen`.
  span_expected<span_session*> find_once(const std::string& id, std::unordered_set<const span_session*>& seen,
                                         const char* batch);
  span_expected<void> check_hidden(const Tensor& hidden, const char* what) const;
  /// A step of `rows` rows from `start` against `s`: bad_position errors.
  span_expected<void> check_step(const span_session& s, std::int64_t rows, std::int64_t start) const;
  /// check_step, then the KV pages for the step reserved (cache_full when
  /// the pool has no room; nothing changed then).
  span_expected<void> admit_step(span_session& s, std::int64_t rows, std::int64_t start);
  void finish_step(span_session& s, std::int64_t start, std::int64_t rows, std::uint64_t step_id,
                   const Tensor& output);
  void fail_step(span_session& s, std::int64_t start);
  /// Blocks [first_block, last_block) (-1 = the span's bound) as indices
  /// [from, to) into the span; wrong_span / invalid_argument otherwise.
  span_expected<std::pair<int, int>> local_blocks(int first_block, int last_block) const;
  span_expected<void> check_forward(const Tensor& hidden, int batch, int seq,
                                    const Tensor& deep_prompts, int blocks) const;
  Tensor& upload(const Tensor& host, row_buffer& buffer);
  Tensor download(const Tensor& device_rows);
  const Tensor& train_positions(int batch, int seq);
  void add_prompts(Tensor& x, int batch, int seq, const Tensor& prompts, int block);
  /// The adapter held as `name` ("": none, null), or unknown_adapter.
  span_expected<std::shared_ptr<const span_lora>> find_adapter(const std::string& name) const;
  /// A stateless request's adapter over local blocks `blocks`: the held
  /// one named `name`, or a client's `carried` one (made into `copy`, which
  /// then gives its gradients), or none; invalid_argument for both or a
  /// carried one that does not fit.
  struct request_lora;
  span_expected<std::unique_ptr<request_lora>> request_adapter(const std::string& name, const lora_span_values* carried,
                                                               std::pair<int, int> blocks);
  /// Frees what a stateless request held (the stage's widened weights).
  void release_request_weights();
  Tensor run_forward(const Tensor& x, int batch, int seq, const Tensor& prompts, std::pair<int, int> blocks,
                     std::vector<block_activations>* saved, std::vector<float>* routing_margins = nullptr,
                     const span_lora* lora = nullptr);

  stage stage_;
  span_engine_options options_;
  std::shared_ptr<kv_pool> pool_;
  std::unordered_map<std::string, std::unique_ptr<span_session>> sessions_;
  /// Adapters by name: their factors (a session holds its own reference)
  /// and fingerprints.
  struct held_adapter {
    std::shared_ptr<const span_lora> factors;
    std::string digest;
  };
  std::map<std::string, held_adapter> adapters_;

  row_buffer step_rows_;   ///< device rows of inference steps and batches
  /// decode_batch's step graphs (Backend::run_step), one per batch size.
  std::map<std::size_t, std::unique_ptr<step_recording>> batch_recordings_;
  Tensor train_positions_; ///< i32 [B*T] for the stateless paths
  int train_batch_ = 0, train_seq_ = 0;
  struct request_scope;
};

}  // namespace corolla
