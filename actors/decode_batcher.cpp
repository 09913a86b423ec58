// The model in this process behind one batching actor (actors/decode_batcher.hpp).
#include "actors/decode_batcher.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/errors.hpp"
#include "actors/step_queue.hpp"
#include "model/error.hpp"
#include "model/workspace.hpp"

namespace corolla {
namespace batcher_detail {

/// One step of one generation: `ids` at positions [start, start + n).
struct step_request {
  std::string session;
  std::vector<std::int32_t> ids;
  std::int64_t start = 0;
};

/// The logits of a step's last row: host f32 [1, V] (a row of the batch's
/// logits, shared).
struct step_logits {
  Tensor row;
};

}  // namespace batcher_detail
}  // namespace corolla

// These travel only between the batcher and threads of this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::step_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::step_logits)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::decode_batcher_stats)

namespace corolla {
namespace {

using namespace batcher_detail;
using clock_type = std::chrono::steady_clock;

using open_atom = caf::atom_constant<caf::atom("dbopen")>;
using step_atom = caf::atom_constant<caf::atom("dbstep")>;
using close_atom = caf::atom_constant<caf::atom("dbclose")>;
using flush_atom = caf::atom_constant<caf::atom("dbflush")>;
using stats_atom = caf::atom_constant<caf::atom("dbstats")>;

/// A step waiting for its batch.
struct queued_step {
  step_request step;
  caf::response_promise promise;
};

struct batcher_state {
  std::unique_ptr<span_engine> engine;
  std::unique_ptr<head> h;
  std::int64_t max_rows = 0;  ///< decode_batcher_options::max_batch_rows
  step_queue<queued_step> queue;
  std::int64_t queued_rows = 0;
  decode_batcher_stats stats;
  // Reused across steps: ids and positions on the host, rows on the device.
  row_buffer ids{0, dtype::i32}, positions{0, dtype::i32};
  row_buffer embedded, rows, logits;
  static inline const char* name = "decode_batcher";
};

using batcher_actor = caf::stateful_actor<batcher_state>;

caf::error to_caf(const span_error& e) { return error_from_wire(span_errc_name(e.code), e.message); }

/// `t` (rows on the backend) copied to a new host f32 tensor.
Tensor to_host(Backend& be, const Tensor& t) {
  if (be.dev().kind == device_kind::cpu) return t.clone();
  Tensor out = Tensor::empty(t.shape(), dtype::f32);
  be.copy(t, out);
  be.synchronize();
  return out;
}

/// Embeds `ids` at `positions` (one each) into st.embedded; returns the
/// rows on the host (what the span engine takes).
Tensor embed(batcher_state& st, std::span<const std::int32_t> ids, std::span<const std::int64_t> positions) {
  Backend& be = st.h->backend();
  const auto n = static_cast<std::int64_t>(ids.size());
  Tensor& id_rows = st.ids.rows(cpu_backend(), n);
  copy_i32(ids, id_rows);
  Tensor& pos = st.positions.rows(cpu_backend(), n);
  auto* p = pos.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(positions[static_cast<std::size_t>(i)]);
  Tensor& x = st.embedded.rows(be, n);
  st.h->embed(id_rows, pos, x);
  return to_host(be, x);
}

/// Logits (host [n, V]) of `hidden` (host [n, D]).
Tensor logits_of(batcher_state& st, const Tensor& hidden) {
  Backend& be = st.h->backend();
  const std::int64_t n = hidden.dim(0);
  Tensor& x = st.rows.rows(be, n);
  be.copy(hidden, x);
  Tensor& out = st.logits.rows(be, n);
  st.h->logits(x, out, nullptr);
  return to_host(be, out);
}

/// Runs every queued step as one batch and answers each with the logits of
/// its last row.
void run_batch(batcher_actor* self) {
  auto& st = self->state;
  if (st.queue.empty()) return;
  std::vector<std::string> sessions;
  std::vector<queued_step> batch = st.queue.take(sessions);
  st.queued_rows = 0;
  const auto t0 = clock_type::now();
  std::vector<std::int32_t> ids;
  std::vector<std::int64_t> positions;
  for (const auto& q : batch) {
    ids.insert(ids.end(), q.step.ids.begin(), q.step.ids.end());
    for (std::size_t i = 0; i < q.step.ids.size(); ++i) positions.push_back(q.step.start + static_cast<std::int64_t>(i));
    if (q.step.ids.size() == 1) {
      ++st.stats.decode_steps;
    } else {
      ++st.stats.prefill_steps;
      st.stats.prefill_tokens += q.step.ids.size();
    }
  }
  try {
    const Tensor hidden = embed(st, ids, positions);
    std::vector<decode_item> items;
    std::int64_t row = 0;
    for (const auto& q : batch) {
      const auto n = static_cast<std::int64_t>(q.step.ids.size());
      items.push_back({q.step.session, hidden.slice(row, row + n), q.step.start, 0});
      row += n;
    }
    // A step alone takes the single-sequence path (matrix-vector products
    // split across the threads at one row), faster than a batch of one.
    std::vector<span_expected<Tensor>> results;
    if (items.size() == 1)
      results.push_back(st.engine->inference_step(items[0].session_id, items[0].hidden, items[0].start_position));
    else
      results = st.engine->decode_batch(items);
    // The LM head over the last rows of the steps that came through, together.
    std::vector<std::size_t> ok;
    for (std::size_t i = 0; i < results.size(); ++i)
      if (results[i]) ok.push_back(i);
    Tensor logits;
    if (!ok.empty()) {
      const std::int64_t D = st.engine->config().hidden_size;
      Tensor last = Tensor::empty({static_cast<std::int64_t>(ok.size()), D}, dtype::f32);
      for (std::size_t k = 0; k < ok.size(); ++k) {
        const Tensor& out = *results[ok[k]];
        Tensor dst = last.slice(static_cast<std::int64_t>(k), static_cast<std::int64_t>(k) + 1);
        dst.copy_from(out.slice(out.dim(0) - 1, out.dim(0)));
      }
      logits = logits_of(st, last);
    }
    std::int64_t k = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!results[i]) {
        ++st.stats.step_errors;
        batch[i].promise.deliver(to_caf(results[i].error()));
        continue;
      }
      batch[i].promise.deliver(step_logits{logits.slice(k, k + 1)});
      ++k;
    }
  } catch (const std::exception& e) {
    // Every waiting generation gets an answer, whatever failed (out of memory).
    st.stats.step_errors += batch.size();
    for (auto& q : batch) q.promise.deliver(error_from_wire("internal", std::string("the batch failed: ") + e.what()));
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  ++st.stats.batches;
  st.stats.steps += batch.size();
  st.stats.max_batch = std::max<std::uint64_t>(st.stats.max_batch, batch.size());
  st.stats.batch_seconds += s;
  st.queue.ran(sessions, s);
}

/// The flush of queue `seq`: runs it, or waits for the generations of the
/// last batches (actors/step_queue.hpp).
void on_flush(batcher_actor* self, std::uint64_t seq) {
  auto& st = self->state;
  const auto d = st.queue.on_flush(seq);
  if (d.run) return run_batch(self);
  if (d.wait.count() == 0) return;  // stale
  if (d.first_wait) ++st.stats.gathering_waits;
  self->delayed_send(self, d.wait, flush_atom::value, seq);
}

void on_step(batcher_actor* self, step_request& r) {
  auto& st = self->state;
  auto rp = self->make_response_promise();
  if (r.ids.empty()) return rp.deliver(make_error(errc::invalid_argument, "a step of no tokens"));
  if (auto len = st.engine->session_length(r.session); !len) return rp.deliver(to_caf(len.error()));
  const auto n = static_cast<std::int64_t>(r.ids.size());
  // A generation appears once per batch, and a batch holds at most max_rows
  // rows (a longer prompt runs alone): a step that does not fit runs the
  // queue first.
  if (st.queued_rows + n > st.max_rows || st.queue.holds(r.session)) run_batch(self);
  std::string session = r.session;
  // Steps of other generations already in the mailbox join this one: the
  // flush message is queued behind them.
  if (st.queue.push(std::move(session), {std::move(r), rp})) self->send(self, flush_atom::value, st.queue.seq());
  st.queued_rows += n;
  // The queue waits for the generations of the last batches: the last of them runs it.
  if (st.queue.complete()) run_batch(self);
}

caf::behavior batcher(batcher_actor* self, std::shared_ptr<span_engine> engine, std::shared_ptr<head> h,
                      decode_batcher_options options) {
  auto& st = self->state;
  // The actor owns both from now on (they are destroyed on its thread).
  st.engine = std::make_unique<span_engine>(std::move(*engine));
  st.h = std::make_unique<head>(std::move(*h));
  st.queue = step_queue<queued_step>(options.gathering);
  st.max_rows = std::max<std::int64_t>(options.max_batch_rows, 1);
  st.embedded = row_buffer(st.engine->config().hidden_size);
  st.rows = row_buffer(st.engine->config().hidden_size);
  st.logits = row_buffer(st.engine->config().vocab_size);
  return {
      [self](open_atom, const std::string& session, std::int64_t max_length) -> caf::result<bool> {
        auto& st = self->state;
        run_batch(self);  // steps queued before go first
        if (auto r = st.engine->open_session(session, max_length); !r) return to_caf(r.error());
        ++st.stats.sessions_opened;
        return true;
      },
      [self](step_atom, step_request& r) { on_step(self, r); },
      [self](close_atom, const std::string& session) -> caf::result<bool> {
        auto& st = self->state;
        // A step of it still queued (a generation that gave up) runs first.
        run_batch(self);
        st.queue.forget(session);
        if (auto r = st.engine->close_session(session); !r) return to_caf(r.error());
        ++st.stats.sessions_closed;
        return true;
      },
      [self](flush_atom, std::uint64_t seq) { on_flush(self, seq); },
      [self](stats_atom) { return self->state.stats; },
  };
}

/// The reply of `actor` to a request, waited for on this (non-actor) thread.
template <class Reply, class... Ts>
Reply ask(caf::scoped_actor& self, const caf::actor& actor, const char* what, Ts&&... xs) {
  std::optional<Reply> reply;
  caf::error err;
  self->request(actor, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](Reply& r) { reply = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
  if (reply) return std::move(*reply);
  const std::string code = error_code(err), message = error_message(err);
  // What the request got wrong is the client's (400); the rest is ours.
  if (code == "invalid_argument" || code == "bad_position" || code == "cache_full") throw model_error(message);
  throw std::runtime_error(std::string("the decode batcher failed to ") + what + ": " + message);
}

}  // namespace

decode_batcher::decode_batcher(caf::actor_system& system, span_engine engine, head h, decode_batcher_options options)
    : system_(system), cfg_(engine.config()) {
  if (engine.first() != 0 || engine.last() != cfg_.n_layers)
    throw std::invalid_argument("decode_batcher: the engine holds blocks [" + std::to_string(engine.first()) + ", " +
                                std::to_string(engine.last()) + ") of " + std::to_string(cfg_.n_layers) +
                                "; it must hold all of them");
  const model_config& hc = h.config();
  if (hc.arch != cfg_.arch || hc.hidden_size != cfg_.hidden_size || hc.vocab_size != cfg_.vocab_size ||
      hc.max_positions != cfg_.max_positions || &h.backend() != &engine.blocks().backend())
    throw std::invalid_argument("decode_batcher: the head is of another model or on another backend than the blocks");
  actor_ = system_.spawn<caf::detached>(batcher, std::make_shared<span_engine>(std::move(engine)),
                                        std::make_shared<head>(std::move(h)), options);
}

decode_batcher::~decode_batcher() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

generation_result decode_batcher::generate(std::span<const std::int32_t> prompt, const generation_params& p,
                                           const token_callback& on_token) {
  const std::string session = "g" + std::to_string(next_session_.fetch_add(1));
  const std::int64_t max_length = std::min<std::int64_t>(
      cfg_.max_positions, static_cast<std::int64_t>(prompt.size()) + std::max(p.max_new_tokens, 0));
  // The session opens with the first step (after generate_tokens has
  // checked the request) and closes however generation ends.
  caf::scoped_actor self{system_};
  struct session_guard {
    caf::scoped_actor& self;
    const caf::actor& batcher;
    const std::string& id;
    bool open = false;
    ~session_guard() {
      if (!open) return;
      try {
        ask<bool>(self, batcher, "close a session", close_atom::value, id);
      } catch (const std::exception&) {
        // Closing a session of a batcher that stopped: nothing is left to free.
      }
    }
  } guard{self, actor_, session};
  Tensor last;  // the logits returned to generate_tokens stay valid until the next step
  return generate_tokens(cfg_, prompt, p,
                         [&](std::span<const std::int32_t> ids, std::int64_t start) {
                           if (!guard.open) {
                             ask<bool>(self, actor_, "open a session", open_atom::value, session, max_length);
                             guard.open = true;
                           }
                           step_request r{session, {ids.begin(), ids.end()}, start};
                           last = ask<step_logits>(self, actor_, "run a step", step_atom::value, std::move(r)).row;
                           return std::span<const float>(last.data<float>(), static_cast<std::size_t>(cfg_.vocab_size));
                         },
                         on_token);
}

decode_batcher_stats decode_batcher::stats() const {
  caf::scoped_actor self{system_};
  return ask<decode_batcher_stats>(self, actor_, "report its counters", stats_atom::value);
}

}  // namespace corolla
