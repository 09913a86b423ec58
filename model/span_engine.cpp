// model/span_engine.cpp — sessions, incremental inference steps, batched
// decode and accounting of a server's span engine. The stateless
// forward/backward for fine-tuning clients is in span_engine_finetune.cpp.
#include "model/span_engine.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "model/lora.hpp"


namespace corolla {

/// One inference session: its KV cache and the last step (for retries).
struct span_session {
  /// A session over blocks [from_block, to_block) of the stage: its cache
  /// holds pages for those layers only.
  span_session(std::string session_id, std::shared_ptr<kv_pool> pool, std::int64_t max_len, int from_block,
               int to_block)
      : id(std::move(session_id)), kv(std::move(pool), from_block, to_block), max_length(max_len),
        from(from_block), to(to_block) {}

  std::string id;
  kv_sequence kv;
  std::int64_t max_length = 0;
  /// Blocks this session runs, as indices into the engine's stage: a client
  /// may route through part of a server's span.
  int from = 0, to = 0;
  // The last successful step. Invariant while has_last: the cache holds
  // exactly last_start + last_rows tokens, the last of which that step
  // wrote, so repeating it would change nothing and return last_output.
  bool has_last = false;
  std::uint64_t last_step_id = 0;
  std::int64_t last_start = 0;
  std::int64_t last_rows = 0;
  Tensor last_output;  ///< host f32 [last_rows, D]; its buffer is reused across steps
  /// Deep prompts [to - from, P, D] on the stage's device, or undefined.
  Tensor prompts;
  std::int64_t prefix() const { return prompts.defined() ? prompts.dim(1) : 0; }
  /// The adapter its steps take (its name, and the engine's factors for the
  /// whole stage), or none.
  std::string adapter;
  std::shared_ptr<const span_lora> lora;

  /// Tokens cached: every layer the session runs holds the same number (the
  /// layers of blocks outside its range stay empty).
  std::int64_t length() const { return kv.length(from); }
};

namespace {

span_error error(span_errc code, std::string message) { return {code, std::move(message)}; }

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; }

std::string in_quotes(const std::string& id) { return "'" + id + "'"; }

}  // namespace

const char* span_errc_name(span_errc e) {
  switch (e) {
    case span_errc::unknown_session: return "unknown_session";
    case span_errc::duplicate_session: return "duplicate_session";
    case span_errc::invalid_argument: return "invalid_argument";
    case span_errc::bad_position: return "bad_position";
    case span_errc::cache_full: return "cache_full";
    case span_errc::internal: return "internal";
    case span_errc::wrong_span: return "wrong_span";
    case span_errc::unknown_adapter: return "unknown_adapter";
  }
  return "internal";
}

// ---- construction ------------------------------------------------------------------

std::size_t span_engine::kv_bytes_per_token(const model_config& cfg, int n_blocks, dtype type) {
  return kv_pool::token_bytes(n_blocks, std::int64_t{cfg.n_kv_heads} * cfg.head_dim, type);
}

span_engine::span_engine(stage blocks, std::int64_t cache_tokens,
                         const span_engine_options& options)
    : stage_(std::move(blocks)), options_(options), step_rows_(stage_.config().hidden_size) {
  const model_config& cfg = stage_.config();
  if (stage_.size() < 1)
    throw std::invalid_argument("span_engine: a server must host at least one block");
  if (cache_tokens < 0)
    throw std::invalid_argument("span_engine: cache tokens must be >= 0, got " +
                                std::to_string(cache_tokens));
  if (options.page_tokens <= 0 || options.max_forward_rows <= 0)
    throw std::invalid_argument("span_engine: page tokens and max forward rows must be positive");
  const std::int64_t pt = options.page_tokens;
  const std::int64_t tokens = (cache_tokens + pt - 1) / pt * pt;
  const std::size_t budget =
      static_cast<std::size_t>(tokens) * kv_bytes_per_token(cfg, stage_.size(), options.kv_dtype);
  pool_ = std::make_shared<kv_pool>(budget, stage_.size(), cfg.n_kv_heads, cfg.head_dim,
                                    options.page_tokens, &stage_.backend(), options.kv_dtype,
                                    options.cache_allocation);
  // (An inference-only stage already reads them: then this does nothing.)
  if (options.weights != weight_format::f32) stage_.use_inference_weights(options.weights);
}

span_engine span_engine::load(const checkpoint& ck, const model_config& cfg, int first, int last,
                              Backend& be, std::int64_t cache_tokens,
                              const span_engine_options& options) {
  if (options.weights != weight_format::f32 && !options.keep_parameters)
    return span_engine(stage::load_inference(ck, cfg, first, last, be, options.weights, options.on_block_loaded),
                       cache_tokens, options);
  return span_engine(stage::load(ck, cfg, first, last, be, options.on_block_loaded), cache_tokens, options);
}

span_engine::~span_engine() = default;
span_engine::span_engine(span_engine&&) noexcept = default;
span_engine& span_engine::operator=(span_engine&&) noexcept = default;

// ---- accounting ----------------------------------------------------------------------

// Pages hold one layer each: a session over the whole span takes one page
// per block for every page_tokens tokens.
std::int64_t span_engine::cache_tokens() const {
  return pool_->max_pages() / pool_->n_layers() * pool_->page_tokens();
}

std::int64_t span_engine::cache_tokens_left() const {
  return (pool_->max_pages() - pool_->pages_in_use()) / pool_->n_layers() * pool_->page_tokens();
}

std::int64_t span_engine::reclaimable_tokens(std::span<const std::string> ids) const {
  // A page is freed when every sequence holding it is closed: count, per
  // page, how many of these sessions hold it.
  std::unordered_map<const std::byte*, std::int64_t> held;
  for (const auto& id : ids)
    if (const auto it = sessions_.find(id); it != sessions_.end())
      for (const std::byte* page : it->second->kv.held_pages()) ++held[page];
  std::int64_t pages = 0;
  for (const auto& [page, n] : held) pages += n == pool_->holders(page) ? 1 : 0;
  // As cache_tokens_left: whole-span tokens of those pages, added to the free ones.
  const std::int64_t free = pool_->max_pages() - pool_->pages_in_use();
  return (free + pages) / pool_->n_layers() * pool_->page_tokens() - cache_tokens_left();
}

std::size_t span_engine::cache_bytes_used() const {
  return static_cast<std::size_t>(pool_->pages_in_use()) * pool_->page_bytes();
}

std::vector<span_session_info> span_engine::sessions() const {
  std::vector<span_session_info> out;
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_)
    out.push_back({id, s->length(), s->max_length, s->kv.capacity(), s->prefix(), s->adapter});
  return out;
}

span_expected<std::int64_t> span_engine::session_length(const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end())
    return error(span_errc::unknown_session, "unknown session " + in_quotes(id));
  return it->second->length();
}

// ---- sessions ------------------------------------------------------------------------

span_session* span_engine::find(const std::string& id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

span_expected<std::pair<int, int>> span_engine::local_blocks(int first_block, int last_block) const {
  const int a = first_block < 0 ? first() : first_block, b = last_block < 0 ? last() : last_block;
  if (a < first() || b > last() || a >= b)
    return span_error{a < b ? span_errc::wrong_span : span_errc::invalid_argument,
                      "blocks [" + std::to_string(a) + ", " + std::to_string(b) +
                          ") are not a non-empty part of this server's span [" + std::to_string(first()) + ", " +
                          std::to_string(last()) + ")"};
  return std::pair<int, int>{a - first(), b - first()};
}

span_expected<void> span_engine::open_session(const std::string& id, std::int64_t max_length, int first_block,
                                              int last_block, const Tensor& prompts, const std::string& adapter) {
  if (id.empty()) return error(span_errc::invalid_argument, "a session id must not be empty");
  auto lora = find_adapter(adapter);
  if (!lora) return lora.error();
  if (max_length <= 0)
    return error(span_errc::invalid_argument,
                 "max length must be positive, got " + std::to_string(max_length));
  const int context = config().max_positions;
  if (max_length > context)
    return error(span_errc::invalid_argument,
                 "max length " + std::to_string(max_length) + " exceeds the model context of " +
                     std::to_string(context));
  if (sessions_.count(id))
    return error(span_errc::duplicate_session, "session " + in_quotes(id) + " is already open");
  auto blocks = local_blocks(first_block, last_block);
  if (!blocks) return blocks.error();
  auto s = std::make_unique<span_session>(id, pool_, max_length, blocks.value().first, blocks.value().second);
  if (prompts.defined()) {
    const shape_t& got = prompts.shape();
    if (prompts.type() != dtype::f32 || got.size() != 3 || got[0] != s->to - s->from ||
        got[2] != config().hidden_size || got[1] < 1)
      return error(span_errc::invalid_argument,
                   "deep prompts for " + std::to_string(s->to - s->from) + " blocks must be f32 [" +
                       std::to_string(s->to - s->from) + ", P, " + std::to_string(config().hidden_size) +
                       "] (P >= 1), got " + dtype_name(prompts.type()) + " " + shape_str(got));
    if (got[1] >= max_length)
      return error(span_errc::invalid_argument,
                   "deep prompts of " + std::to_string(got[1]) + " positions leave no room in a session of " +
                       std::to_string(max_length) + " tokens");
    Backend& be = stage_.backend();
    s->prompts = be.empty(got);
    be.copy(prompts, s->prompts);
  }
  s->adapter = adapter;
  s->lora = std::move(lora.value());
  sessions_.emplace(id, std::move(s));
  return {};
}

span_expected<void> span_engine::close_session(const std::string& id) {
  if (sessions_.erase(id) == 0)
    return error(span_errc::unknown_session, "unknown session " + in_quotes(id));
  return {};
}

span_expected<std::int64_t> span_engine::share_prefix(const std::string& to, const std::string& from,
                                                      std::int64_t tokens) {
  span_session* t = find(to);
  if (!t) return error(span_errc::unknown_session, "unknown session " + in_quotes(to));
  const span_session* f = find(from);
  if (!f) return error(span_errc::unknown_session, "unknown session " + in_quotes(from));
  if (t == f) return error(span_errc::invalid_argument, "session " + in_quotes(to) + " cannot share its own cache");
  if (t->length() != 0 || t->kv.pages() != 0)
    return error(span_errc::invalid_argument,
                 "session " + in_quotes(to) + " already holds " + std::to_string(t->length()) + " tokens");
  if (t->from != f->from || t->to != f->to || t->prefix() != 0 || f->prefix() != 0 || t->adapter != f->adapter)
    return error(span_errc::invalid_argument, "sessions " + in_quotes(to) + " and " + in_quotes(from) +
                                                  " run other blocks, deep prompts or adapters: their caches differ");
  return t->kv.share_prefix(f->kv, std::min(tokens, t->max_length));
}

// ---- validation ----------------------------------------------------------------------

span_expected<void> span_engine::check_hidden(const Tensor& hidden, const char* what) const {
  const std::int64_t D = config().hidden_size;
  if (!hidden.defined()) return error(span_errc::invalid_argument, std::string(what) + " are missing");
  if (hidden.dev().kind != device_kind::cpu)
    return error(span_errc::invalid_argument,
                 std::string(what) + " must be in host memory, got " + hidden.dev().str());
  if (!is_float(hidden.type()))
    return error(span_errc::invalid_argument, std::string(what) + " must be f32, bf16 or f16, got " +
                                                  dtype_name(hidden.type()));
  if (hidden.rank() != 2 || hidden.dim(1) != D)
    return error(span_errc::invalid_argument,
                 std::string(what) + " must be [n, " + std::to_string(D) +
                     "] (the model's hidden size is " + std::to_string(D) + "), got " +
                     shape_str(hidden.shape()));
  if (hidden.dim(0) == 0)
    return error(span_errc::invalid_argument,
                 std::string(what) + " have no rows: a request needs at least one token");
  return {};
}

span_expected<void> span_engine::check_step(const span_session& s, std::int64_t n, std::int64_t start) const {
  const std::int64_t length = s.length();
  if (start < 0)
    return error(span_errc::bad_position,
                 "step starts at negative position " + std::to_string(start));
  if (start > length)
    return error(span_errc::bad_position, "step starts at position " + std::to_string(start) +
                                              " but the session holds " + std::to_string(length) +
                                              " tokens");
  if (start + n > s.max_length)
    return error(span_errc::bad_position,
                 "step covers positions " + std::to_string(start) + ".." +
                     std::to_string(start + n - 1) + " but session " + in_quotes(s.id) +
                     " was opened for " + std::to_string(s.max_length) + " tokens");
  return {};
}

span_expected<void> span_engine::admit_step(span_session& s, std::int64_t n, std::int64_t start) {
  if (auto ok = check_step(s, n, start); !ok) return ok;
  // From start on the step writes: over tokens held (a rollback), and
  // perhaps into pages another session holds too (share_prefix).
  if (kv_reservation r = s.kv.reserve(start + n, start); !r) return error(span_errc::cache_full, r.error);
  return {};
}

// ---- steps -----------------------------------------------------------------------------

Tensor& span_engine::upload(const Tensor& host, row_buffer& buffer) {
  Backend& be = stage_.backend();
  Tensor& rows = buffer.rows(be, host.dim(0));
  be.copy(host, rows);  // converts bf16/f16 to f32
  return rows;
}

Tensor span_engine::download(const Tensor& device_rows) {
  Tensor out = Tensor::empty(device_rows.shape(), dtype::f32);
  stage_.backend().copy(device_rows, out);
  return out;
}

void span_engine::finish_step(span_session& s, std::int64_t start, std::int64_t rows,
                              std::uint64_t step_id, const Tensor& output) {
  // After a rollback the cache may still hold pages past the new end.
  s.kv.truncate(start + rows);
  if (!s.last_output.defined() || s.last_output.shape() != output.shape())
    s.last_output = Tensor::empty(output.shape(), dtype::f32);
  s.last_output.copy_from(output);
  s.has_last = true;
  s.last_step_id = step_id;
  s.last_start = start;
  s.last_rows = rows;
}

void span_engine::fail_step(span_session& s, std::int64_t start) {
  // Some layers may hold the new tokens and others not; positions below
  // start are untouched in every layer, so cutting there is consistent.
  s.kv.truncate(start);
  s.has_last = false;
}

namespace {

/// Whether a step is a retry of the session's last one.
bool is_retry(const span_session& s, std::uint64_t step_id, std::int64_t start, std::int64_t n) {
  return s.has_last && step_id != 0 && step_id == s.last_step_id && start == s.last_start &&
         n == s.last_rows && s.length() == s.last_start + s.last_rows;
}

}  // namespace

span_expected<Tensor> span_engine::inference_step(const std::string& id, const Tensor& hidden,
                                                  std::int64_t start, std::uint64_t step_id) {
  span_session* s = find(id);
  if (!s) return error(span_errc::unknown_session, "unknown session " + in_quotes(id));
  if (auto ok = check_hidden(hidden, "hidden states"); !ok) return ok.error();
  const std::int64_t n = hidden.dim(0);
  if (is_retry(*s, step_id, start, n)) return s->last_output.clone();
  // Reserve before computing: a full pool fails the step with nothing
  // changed. Pages past start + n are released only after success.
  if (auto ok = admit_step(*s, n, start); !ok) return ok.error();
  try {
    Tensor& x = upload(hidden, step_rows_);
    // kv_sequence::append rewrites from `start`, dropping what followed:
    // the rollback needs no separate truncation before the compute.
    const std::int64_t in_prefix = std::min(n, s->prefix() - start);
    if (in_prefix <= 0) {
      stage_.forward_cached(x, s->kv, start, x, s->from, s->to, s->lora.get());
    } else {
      // Rows of prefix positions get prompt i at the input of block i.
      Backend& be = stage_.backend();
      const std::int64_t D = config().hidden_size;
      Tensor rows = x.slice(0, in_prefix);
      for (int b = s->from; b < s->to; ++b) {
        const Tensor prompt = s->prompts.slice(b - s->from, b - s->from + 1).view({s->prefix(), D});
        be.add(rows, prompt.slice(start, start + in_prefix), rows);
        stage_.forward_cached(x, s->kv, start, x, b, b + 1, s->lora.get());
      }
    }
    Tensor out = download(x);
    finish_step(*s, start, n, step_id, out);
    return out;
  } catch (const std::exception& e) {
    fail_step(*s, start);
    return error(span_errc::internal, std::string("span computation failed: ") + e.what());
  }
}

span_expected<span_session*> span_engine::find_once(const std::string& id, std::unordered_set<const span_session*>& seen,
                                                     const char* batch) {
  span_session* s = find(id);
  if (!s) return error(span_errc::unknown_session, "unknown session " + in_quotes(id));
  if (!seen.insert(s).second)
    return error(span_errc::invalid_argument, "session " + in_quotes(s->id) + " appears more than once in one " + batch);
  return s;
}

std::vector<span_expected<Tensor>> span_engine::decode_batch(std::span<const decode_item> items) {
  struct pending_step {
    std::size_t index;
    span_session* session;
    std::int64_t start, rows, row;
    std::uint64_t step_id;
  };
  std::vector<span_expected<Tensor>> results;
  results.reserve(items.size());
  std::vector<pending_step> pending;
  std::vector<cached_rows> segments;
  std::unordered_set<const span_session*> seen;
  std::int64_t total_rows = 0;
  bool adapted = false;  // a session with an adapter: its rows take extra products

  // Validate and reserve everything first: an item's error is its own.
  for (std::size_t i = 0; i < items.size(); ++i) {
    const decode_item& item = items[i];
    span_expected<span_session*> member = find_once(item.session_id, seen, "decode batch");
    if (!member) {
      results.emplace_back(member.error());
      continue;
    }
    span_session* s = *member;
    if (s->from != 0 || s->to != size() || item.start_position < s->prefix()) {
      // Part of the span (its own blocks), or deep-prompt positions (added
      // between blocks): it runs outside the batch.
      results.push_back(inference_step(item.session_id, item.hidden, item.start_position, item.step_id));
      continue;
    }
    if (auto ok = check_hidden(item.hidden, "hidden states"); !ok) {
      results.emplace_back(ok.error());
      continue;
    }
    const std::int64_t n = item.hidden.dim(0);
    if (is_retry(*s, item.step_id, item.start_position, n)) {
      results.emplace_back(s->last_output.clone());
      continue;
    }
    if (auto ok = admit_step(*s, n, item.start_position); !ok) {
      results.emplace_back(ok.error());
      continue;
    }
    pending.push_back({i, s, item.start_position, n, 0, item.step_id});
    adapted = adapted || s->lora != nullptr;
    results.emplace_back(Tensor());  // filled below
  }
  if (pending.empty()) return results;
  // The sessions of one adapter side by side: each adapter's terms are
  // then one pair of products over all its rows (block_forward_cached_batch
  // joins adjacent rows of the same adapter), not a pair per session.
  if (adapted)
    std::stable_sort(pending.begin(), pending.end(), [](const pending_step& a, const pending_step& b) {
      return std::less<const span_lora*>()(a.session->lora.get(), b.session->lora.get());
    });
  // The batch's rows in that order.
  for (pending_step& p : pending) {
    p.row = total_rows;
    segments.push_back({&p.session->kv, p.start, p.rows, p.session->lora.get()});
    total_rows += p.rows;
  }

  Backend& be = stage_.backend();
  try {
    Tensor& x = step_rows_.rows(be, total_rows);
    // On a device the batch crosses the bus once each way: the sessions'
    // rows gathered on the host and copied up together, the outputs copied
    // down together and handed out as row ranges of that one host tensor
    // (16 sessions were 16 copies up and 16 synchronising copies down).
    const bool on_device = be.dev().kind != device_kind::cpu && pending.size() > 1;
    if (on_device) {
      Tensor staged = Tensor::empty({total_rows, x.dim(1)}, dtype::f32);
      for (const pending_step& p : pending) staged.slice(p.row, p.row + p.rows).copy_from(items[p.index].hidden);
      // A batch of decode steps (one row each) is the same ops every time:
      // a step graph per batch size (Backend::run_step; repeatable, the
      // rows copied up again first). The outputs come down after it.
      // Batches with adapters run unrecorded: their terms' scratch
      // (block_decode_workspace) grows with the rows and ranks they see,
      // and a recording must not allocate.
      const bool decode_steps =
          total_rows == static_cast<std::int64_t>(pending.size()) && stage_.steps_recordable() && !adapted;
      auto ops = [&] {
        be.copy(staged, x);
        stage_.forward_cached_batch(x, segments, x);
      };
      if (decode_steps)
        be.run_step(batch_recordings_[pending.size()], ops);
      else
        ops();
    } else {
      for (const pending_step& p : pending) {
        Tensor dst = x.slice(p.row, p.row + p.rows);
        be.copy(items[p.index].hidden, dst);
      }
      stage_.forward_cached_batch(x, segments, x);
    }
    const Tensor outputs = on_device ? download(x) : Tensor();
    for (const pending_step& p : pending) {
      Tensor out = on_device ? outputs.slice(p.row, p.row + p.rows) : download(x.slice(p.row, p.row + p.rows));
      finish_step(*p.session, p.start, p.rows, p.step_id, out);
      results[p.index] = std::move(out);
    }
  } catch (const std::exception& e) {
    // Outputs of a failed batch are not trusted, whichever item they were.
    for (const pending_step& p : pending) {
      fail_step(*p.session, p.start);
      results[p.index] =
          error(span_errc::internal, std::string("span computation failed: ") + e.what());
    }
  }
  return results;
}

// ---- adapters ---------------------------------------------------------------------------

span_expected<void> span_engine::add_adapter(const std::string& name, const lora_adapter& a) {
  if (name.empty()) return error(span_errc::invalid_argument, "an adapter needs a name");
  if (adapters_.count(name)) return error(span_errc::invalid_argument, "adapter " + in_quotes(name) + " is held already");
  if (adapters_.size() >= max_adapters)
    return error(span_errc::invalid_argument,
                 "a server holds at most " + std::to_string(max_adapters) + " adapters (span.info lists them all)");
  if (!a.fits(config()))
    return error(span_errc::invalid_argument, "adapter " + in_quotes(name) + " was made for another model (" +
                                                  std::to_string(a.n_layers()) + " layers)");
  adapters_.emplace(name, held_adapter{std::make_shared<const span_lora>(a.factors(stage_.backend(), first(), size())),
                                       a.digest()});
  return {};
}

span_expected<std::shared_ptr<const span_lora>> span_engine::find_adapter(const std::string& name) const {
  if (name.empty()) return std::shared_ptr<const span_lora>();
  const auto it = adapters_.find(name);
  if (it != adapters_.end()) return it->second.factors;
  std::string held;
  for (const auto& [n, f] : adapters_) held += (held.empty() ? "" : ", ") + n;
  return error(span_errc::unknown_adapter, "this server holds no adapter " + in_quotes(name) +
                                               (held.empty() ? " (it holds none)" : " (it holds " + held + ")"));
}

std::vector<std::string> span_engine::adapters() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : adapters_) names.push_back(name);
  return names;
}

std::vector<std::string> span_engine::adapter_digests() const {
  std::vector<std::string> digests;
  for (const auto& [name, held] : adapters_) digests.push_back(held.digest);
  return digests;
}

// ---- device-resident batches -------------------------------------------------------

std::vector<span_expected<void>> span_engine::prepare_steps(std::span<const batch_step> steps) {
  std::vector<span_expected<void>> results;
  results.reserve(steps.size());
  std::unordered_set<const span_session*> seen;
  for (const batch_step& step : steps) {
    span_expected<span_session*> member = find_once(step.session_id, seen, "batch");
    if (!member) {
      results.emplace_back(member.error());
      continue;
    }
    span_session* s = *member;
    if (s->from != 0 || s->to != size() || s->prefix() > 0) {
      results.emplace_back(error(span_errc::invalid_argument,
                                 "session " + in_quotes(s->id) +
                                     " holds part of the span or deep prompts: a device-resident batch "
                                     "takes sessions of the whole span without them"));
      continue;
    }
    if (step.rows < 1) {
      results.emplace_back(error(span_errc::invalid_argument, "a step of session " + in_quotes(s->id) +
                                                                  " has no rows: it needs at least one token"));
      continue;
    }
    results.push_back(admit_step(*s, step.rows, step.start_position));
  }
  return results;
}

span_expected<void> span_engine::run_prepared(std::span<const batch_step> steps, std::unique_ptr<step_recording>& rec,
                                              const std::function<void(Tensor&)>& fill,
                                              const std::function<void(const Tensor&)>& use) {
  std::vector<span_session*> sessions;
  std::vector<cached_rows> segments;
  std::int64_t total_rows = 0;
  bool adapted = false;
  for (const batch_step& step : steps) {
    span_session* s = find(step.session_id);
    if (!s) return error(span_errc::unknown_session, "unknown session " + in_quotes(step.session_id));
    sessions.push_back(s);
    segments.push_back({&s->kv, step.start_position, step.rows, s->lora.get()});
    adapted = adapted || s->lora;
    total_rows += step.rows;
  }
  if (steps.empty()) return {};
  Backend& be = stage_.backend();
  try {
    Tensor& x = step_rows_.rows(be, total_rows);
    auto ops = [&] {
      fill(x);
      if (segments.size() == 1)
        stage_.forward_cached(x, *segments[0].kv, segments[0].start_pos, x, 0, -1, segments[0].lora);
      else
        stage_.forward_cached_batch(x, segments, x);
      use(x);
    };
    // A batch with an adapter runs unrecorded, as in decode_batch: the
    // terms' scratch grows with the rows and ranks it sees, and a
    // recording must not allocate.
    if (adapted)
      ops();
    else
      be.run_step(rec, ops);
  } catch (const std::exception& e) {
    for (std::size_t i = 0; i < steps.size(); ++i) fail_step(*sessions[i], steps[i].start_position);
    return error(span_errc::internal, std::string("span computation failed: ") + e.what());
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    // As finish_step, without an output kept for a retry.
    sessions[i]->kv.truncate(steps[i].start_position + steps[i].rows);
    sessions[i]->has_last = false;
  }
  return {};
}

}  // namespace corolla
