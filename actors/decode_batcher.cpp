// The model in this process behind one batching actor (actors/decode_batcher.hpp).
#include "actors/decode_batcher.hpp"

#include <algorithm>
#include <chrono>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
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
#include "schedule/cache_retention.hpp"
#include "schedule/prompt_reuse.hpp"

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

/// A generation about to start: its own session id and its prompt.
struct open_request {
  std::string session;
  std::vector<std::int32_t> prompt;
  /// Its cache domain and adapter, as schedule::adapter_domain joins them:
  /// it starts on, or waits for, sessions of the same only.
  std::string domain;
  std::string adapter;  ///< the LoRA adapter its steps take ("": none)
};

/// The session the generation runs on (its own, or a retained one whose
/// cache holds the prompt's first `cached` tokens).
struct open_reply {
  std::string session;
  std::int64_t cached = 0;
};

}  // namespace batcher_detail
}  // namespace corolla

// These travel only between the batcher and threads of this process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::step_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::step_logits)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::open_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::batcher_detail::open_reply)
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

/// A generation whose prompt begins as a running generation's does, waiting
/// for that one's prompt to reach the cache so that it can hold the same
/// pages instead of computing them too.
struct waiting_open {
  open_request request;
  caf::response_promise promise;
  std::string on;            ///< the running generation's session
  std::int64_t tokens = 0;   ///< what it will be able to share then
};

struct batcher_state {
  std::unique_ptr<span_engine> engine;
  std::unique_ptr<head> h;
  std::int64_t max_rows = 0;  ///< decode_batcher_options::max_batch_rows
  step_queue<queued_step> queue;
  std::int64_t queued_rows = 0;
  /// The ids each open session's cache holds, position by position
  /// (retained ones included).
  std::unordered_map<std::string, std::vector<std::int32_t>> cached;
  /// The prompt of each running generation's session (not retained ones).
  schedule::session_ids prompts;
  /// Generations waiting to share a running one's prompt (open_generation).
  std::vector<waiting_open> waiting;
  /// Finished generations kept for their caches, the most recent first.
  std::list<std::string> retained;
  /// The cache domain of each open session, retained ones included: its
  /// generation's cache_domain ("" too) and adapter, joined by
  /// schedule::adapter_domain. A session without one is started on by
  /// nobody.
  std::unordered_map<std::string, std::string> domains;
  /// The engine holds adapters: a batch's steps are ordered by domain, so
  /// the rows of one adapter lie side by side (one pair of products each).
  bool adapters = false;
  std::size_t retain_limit = 0;
  bool share_prefixes = true;  ///< decode_batcher_options::share_prefixes
  decode_batcher_stats stats;
  // Reused across steps: ids, positions and the last rows' indices on the
  // host, the last rows and their logits on the device.
  row_buffer ids{0, dtype::i32}, positions{0, dtype::i32}, last_rows{0, dtype::i32};
  row_buffer rows, logits;
  /// Recordings of batches of decode steps (Backend::run_step: a CUDA graph
  /// with step graphs on), by the number of steps: the same shape of work
  /// each time, so an executable updates in place. Batches with a prompt's
  /// piece in them vary too much and run as they come.
  std::unordered_map<std::size_t, std::unique_ptr<step_recording>> recordings;
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

/// Runs the prepared `steps` (their ids and positions in `ids`, `positions`,
/// consecutive) as one batch on the device: embedded into the engine's rows,
/// through every block in place, the LM head over each step's last row.
/// Returns the logits (host [steps, V]) or the engine's error. Only the
/// logits cross to the host.
span_expected<Tensor> compute_batch(batcher_state& st, std::span<const batch_step> steps,
                                    std::span<const std::int32_t> ids, std::span<const std::int64_t> positions) {
  Backend& be = st.h->backend();
  const auto n = static_cast<std::int64_t>(ids.size());
  const auto k = static_cast<std::int64_t>(steps.size());
  Tensor& id_rows = st.ids.rows(cpu_backend(), n);
  copy_i32(ids, id_rows);
  Tensor& pos = st.positions.rows(cpu_backend(), n);
  auto* p = pos.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(positions[static_cast<std::size_t>(i)]);
  Tensor& last_index = st.last_rows.rows(cpu_backend(), k);
  auto* li = last_index.data<std::int32_t>();
  std::int64_t row = 0;
  for (std::int64_t i = 0; i < k; ++i) {
    row += steps[static_cast<std::size_t>(i)].rows;
    li[i] = static_cast<std::int32_t>(row - 1);
  }
  Tensor& last = st.rows.rows(be, k);
  Tensor& out = st.logits.rows(be, k);
  // Decode steps only (a row each): the same work for the same count, a
  // recording of its own; otherwise a fresh one, which runs as it comes (so
  // does a stage whose steps cannot be recorded).
  std::unique_ptr<step_recording> none;
  const bool recorded = n == k && st.engine->blocks().steps_recordable();
  std::unique_ptr<step_recording>& rec = recorded ? st.recordings[steps.size()] : none;
  auto ran = st.engine->run_prepared(
      steps, rec, [&](Tensor& x) { st.h->embed(id_rows, pos, x); },
      [&](const Tensor& x) {
        be.embedding(last_index, x, last);  // the steps' last rows, gathered
        st.h->logits(last, out, nullptr);
      });
  if (!ran) return ran.error();
  return to_host(be, out);
}

/// Closes a retained session, for `limit` (the count of retained sessions,
/// or KV room): the least recently finished of the cache domain holding
/// the most of it (schedule/cache_retention.hpp), so one client's burst
/// does not flush the others' caches.
void let_one_go(batcher_state& st, schedule::retention_limit limit) {
  const std::string id = schedule::next_to_let_go(st.retained, st.cached, schedule::domain_in(st.domains), limit);
  st.retained.remove(id);
  st.cached.erase(id);
  st.domains.erase(id);
  st.queue.forget(id);
  (void)st.engine->close_session(id);
  ++st.stats.sessions_closed;
  ++st.stats.evicted_sessions;
}

/// Lets retained sessions go until the pool has room for `rows` more rows
/// of `steps` steps (each may start a page: counted whole) or none is left.
void make_room(batcher_state& st, std::int64_t rows, std::size_t steps) {
  const std::int64_t need = rows + static_cast<std::int64_t>(steps) * st.engine->pool().page_tokens();
  while (!st.retained.empty() && st.engine->cache_tokens_left() < need) let_one_go(st, schedule::retention_limit::room);
}

/// The cache of `session` now holds its ids up to `start`, then `ids`.
/// (Ids not known up to `start`, after a failure: none are counted on.)
void record_ids(batcher_state& st, const std::string& session, std::int64_t start, const std::vector<std::int32_t>& ids) {
  auto& held = st.cached[session];
  if (static_cast<std::size_t>(start) > held.size()) {
    held.clear();
    return;
  }
  held.resize(static_cast<std::size_t>(start));
  held.insert(held.end(), ids.begin(), ids.end());
}

/// A step of `session` from `start` failed: the engine cut its cache back
/// to at most `start` (or left it), so no id from there on is counted on.
void forget_ids_from(batcher_state& st, const std::string& session, std::int64_t start) {
  auto& held = st.cached[session];
  held.resize(std::min(held.size(), static_cast<std::size_t>(start)));
}

/// Opens the generation `r` asked for: continuing a retained session,
/// on a session's pages, or on a session of its own
/// (schedule/prompt_reuse.hpp).
/// With `may_wait`, a generation that could share more once a running
/// generation's prompt is computed waits for that instead (resolve_waiting).
void open_generation(batcher_actor* self, open_request r, caf::response_promise rp, bool may_wait) {
  auto& st = self->state;
  using how = schedule::prompt_start::how;
  // Only sessions of its own cache domain: none of another's spares it
  // anything (or tells it anything of their prompts).
  const schedule::session_filter same_domain = schedule::same_domain(st.domains, r.domain);
  const schedule::prompt_start plan =
      schedule::plan_prompt_start(r.prompt, st.retained, st.cached, st.share_prefixes, same_domain);
  if (may_wait && st.share_prefixes)
    if (auto w = schedule::prompt_to_wait_for(r.prompt, st.prompts, st.cached, plan.tokens,
                                              st.engine->pool().page_tokens(), same_domain)) {
      ++st.stats.prefix_waits;
      st.waiting.push_back({std::move(r), std::move(rp), std::move(w->session), w->tokens});
      return;
    }
  if (plan.kind == how::continue_retained) {
    // (No queued step is of a retained session: none needs to run first.)
    st.retained.remove(plan.session);
    ++st.stats.reused_sessions;
    st.stats.reused_tokens += static_cast<std::uint64_t>(plan.tokens);
    st.prompts[plan.session] = std::move(r.prompt);
    st.queue.expect(plan.session);  // the next batch waits for its first step
    rp.deliver(open_reply{plan.session, plan.tokens});
    return;
  }
  // Every session may grow to the whole context: a retained one then
  // serves any later prompt (pages are taken as it grows, whatever the bound).
  if (auto o = st.engine->open_session(r.session, st.engine->config().max_positions, -1, -1, {}, r.adapter); !o) {
    rp.deliver(to_caf(o.error()));
    return;
  }
  ++st.stats.sessions_opened;
  st.domains[r.session] = r.domain;
  std::vector<std::int32_t>& held = st.cached[r.session];
  held.clear();
  std::int64_t cached = 0;
  if (plan.kind == how::share) {
    // A failure here only means computing those tokens after all.
    if (auto shared = st.engine->share_prefix(r.session, plan.session, plan.tokens); shared && *shared > 0) {
      cached = *shared;
      held.assign(r.prompt.begin(), r.prompt.begin() + cached);
      ++st.stats.shared_sessions;
      st.stats.shared_tokens += static_cast<std::uint64_t>(cached);
    }
  }
  st.prompts[r.session] = std::move(r.prompt);
  // The next batch waits, briefly, for its first step: a burst of requests
  // (the generations that waited for one prompt) starts in one batch.
  st.queue.expect(r.session);
  rp.deliver(open_reply{r.session, cached});
}

/// Opens the waiting generations whose running generation has computed
/// what they wait for, or has ended.
void resolve_waiting(batcher_actor* self) {
  auto& st = self->state;
  std::vector<waiting_open> ready;
  for (auto it = st.waiting.begin(); it != st.waiting.end();) {
    const auto held = st.cached.find(it->on);
    if (st.prompts.count(it->on) == 0 || held == st.cached.end() ||
        static_cast<std::int64_t>(held->second.size()) >= it->tokens) {
      ready.push_back(std::move(*it));
      it = st.waiting.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& w : ready) open_generation(self, std::move(w.request), std::move(w.promise), false);
}

/// Runs every queued step as one batch and answers each with the logits of
/// its last row.
void run_batch(batcher_actor* self) {
  auto& st = self->state;
  if (st.queue.empty()) return;
  std::vector<std::string> sessions;
  std::vector<queued_step> batch = st.queue.take(sessions);
  st.queued_rows = 0;
  // Domains begin with their adapter's name (length-prefixed): in their
  // order, each adapter's steps are adjacent.
  if (st.adapters) {
    const auto domain_of = [&st](const queued_step& q) -> const std::string& {
      static const std::string none;
      const auto it = st.domains.find(q.step.session);
      return it == st.domains.end() ? none : it->second;
    };
    std::stable_sort(batch.begin(), batch.end(),
                     [&](const queued_step& a, const queued_step& b) { return domain_of(a) < domain_of(b); });
  }
  const auto t0 = clock_type::now();
  std::int64_t rows = 0;
  std::vector<batch_step> steps;
  for (const auto& q : batch) {
    const auto n = static_cast<std::int64_t>(q.step.ids.size());
    steps.push_back({q.step.session, q.step.start, n});
    rows += n;
    if (n == 1) {
      ++st.stats.decode_steps;
    } else {
      ++st.stats.prefill_steps;
      st.stats.prefill_tokens += q.step.ids.size();
    }
  }
  try {
    make_room(st, rows, batch.size());
    const std::vector<span_expected<void>> prepared = st.engine->prepare_steps(steps);
    // The steps the engine took, their ids and positions together.
    std::vector<batch_step> taken;
    std::vector<std::int32_t> ids;
    std::vector<std::int64_t> positions;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!prepared[i]) continue;
      const step_request& r = batch[i].step;
      taken.push_back(steps[i]);
      ids.insert(ids.end(), r.ids.begin(), r.ids.end());
      for (std::size_t j = 0; j < r.ids.size(); ++j) positions.push_back(r.start + static_cast<std::int64_t>(j));
    }
    span_expected<Tensor> logits =
        taken.empty() ? span_expected<Tensor>(Tensor()) : compute_batch(st, taken, ids, positions);
    std::int64_t k = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!prepared[i] || !logits) {
        ++st.stats.step_errors;
        forget_ids_from(st, batch[i].step.session, batch[i].step.start);
        batch[i].promise.deliver(to_caf(!prepared[i] ? prepared[i].error() : logits.error()));
        continue;
      }
      record_ids(st, batch[i].step.session, batch[i].step.start, batch[i].step.ids);
      batch[i].promise.deliver(step_logits{logits->slice(k, k + 1)});
      ++k;
    }
  } catch (const std::exception& e) {
    // Every waiting generation gets an answer, whatever failed (out of
    // memory); what their caches hold from their steps on is not known.
    st.stats.step_errors += batch.size();
    for (auto& q : batch) {
      forget_ids_from(st, q.step.session, q.step.start);
      q.promise.deliver(error_from_wire("internal", std::string("the batch failed: ") + e.what()));
    }
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  ++st.stats.batches;
  st.stats.steps += batch.size();
  st.stats.max_batch = std::max<std::uint64_t>(st.stats.max_batch, batch.size());
  st.stats.batch_seconds += s;
  st.queue.ran(sessions, s);
  resolve_waiting(self);
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

/// Answers every queued step and waiting generation with `why` (the actor
/// is about to stop).
void fail_queued(batcher_actor* self, const std::string& why) {
  std::vector<std::string> sessions;
  for (auto& q : self->state.queue.take(sessions)) q.promise.deliver(make_error(errc::stopped, why));
  for (auto& w : std::exchange(self->state.waiting, {})) w.promise.deliver(make_error(errc::stopped, why));
}

caf::behavior batcher(batcher_actor* self, std::shared_ptr<span_engine> engine, std::shared_ptr<head> h,
                      decode_batcher_options options) {
  auto& st = self->state;
  // The actor owns both from now on (they are destroyed on its thread).
  st.engine = std::make_unique<span_engine>(std::move(*engine));
  st.h = std::make_unique<head>(std::move(*h));
  st.queue = step_queue<queued_step>(options.gathering);
  st.max_rows = std::max<std::int64_t>(options.max_batch_rows, 1);
  st.retain_limit = static_cast<std::size_t>(std::max(options.retained_sessions, 0));
  st.share_prefixes = options.share_prefixes;
  st.adapters = !st.engine->adapters().empty();
  st.rows = row_buffer(st.engine->config().hidden_size);
  st.logits = row_buffer(st.engine->config().vocab_size);
  // Whatever ends the actor, no generation waits for ever on a queued step
  // (requests still in the mailbox are answered by CAF).
  self->set_exit_handler([self](caf::exit_msg& m) {
    fail_queued(self, "the decode batcher stopped");
    self->quit(m.reason);
  });
  self->set_exception_handler([self](std::exception_ptr& e) -> caf::error {
    std::string what = "an unknown exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
    }
    fail_queued(self, "the decode batcher failed: " + what);
    return make_error(errc::stopped, "the decode batcher failed: " + what);
  });
  return {
      [self](open_atom, open_request& r) {
        open_generation(self, std::move(r), self->make_response_promise(), true);
      },
      [self](step_atom, step_request& r) { on_step(self, r); },
      [self](close_atom, const std::string& session) -> caf::result<bool> {
        auto& st = self->state;
        // (A generation closes after its last step was answered: none of
        // its steps is queued.)
        if (!st.engine->session_length(session)) return to_caf(st.engine->session_length(session).error());
        st.queue.forget(session);  // no batch waits for a generation that ended
        st.prompts.erase(session);
        // Then a queue that waited only for it runs now, not when its wait
        // runs out: after its pages are retained (evictable) or freed.
        const auto after_close = [self] {
          if (self->state.queue.complete()) run_batch(self);
          resolve_waiting(self);
        };
        if (st.retain_limit > 0) {
          // Kept for a later prompt that starts the same way.
          st.retained.push_front(session);
          while (st.retained.size() > st.retain_limit) let_one_go(st, schedule::retention_limit::count);
          after_close();
          return true;
        }
        st.cached.erase(session);
        st.domains.erase(session);
        auto r = st.engine->close_session(session);
        if (r) ++st.stats.sessions_closed;
        after_close();
        if (!r) return to_caf(r.error());
        return true;
      },
      [self](flush_atom, std::uint64_t seq) { on_flush(self, seq); },
      [self](stats_atom) {
        auto& st = self->state;
        decode_batcher_stats s = st.stats;
        s.kv_pages_in_use = st.engine->pool().pages_in_use();
        s.kv_pages_shared = st.engine->pool().shared_pages();
        return s;
      },
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
  if (code == "invalid_argument" || code == "bad_position" || code == "cache_full" || code == "unknown_adapter")
    throw model_error(message);
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
  prefill_chunk_ = std::max(options.prefill_chunk, 1);
  adapters_ = engine.adapters();
  actor_ = system_.spawn<caf::detached>(batcher, std::make_shared<span_engine>(std::move(engine)),
                                        std::make_shared<head>(std::move(h)), options);
}

decode_batcher::~decode_batcher() { stop(); }

void decode_batcher::stop() { caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown); }

batched_generation decode_batcher::generate(std::span<const std::int32_t> prompt, const generation_params& p,
                                            const token_callback& on_token, const std::string& cache_domain,
                                            const std::string& adapter) {
  if (!adapter.empty() && !std::binary_search(adapters_.begin(), adapters_.end(), adapter)) {
    std::string held;
    for (const auto& a : adapters_) held += (held.empty() ? "" : ", ") + a;
    throw model_error("no adapter '" + adapter + "' is served here" +
                      (held.empty() ? " (none is)" : " (these are: " + held + ")"));
  }
  // The session opens with the first step (after generate_tokens has
  // checked the request) and closes however generation ends.
  caf::scoped_actor self{system_};
  struct session_guard {
    caf::scoped_actor& self;
    const caf::actor& batcher;
    std::string id;  ///< empty until open
    ~session_guard() {
      if (id.empty()) return;
      try {
        ask<bool>(self, batcher, "close a session", close_atom::value, id);
      } catch (const std::exception&) {
        // Closing a session of a batcher that stopped: nothing is left to free.
      }
    }
  } guard{self, actor_, {}};
  std::int64_t cached = 0;  // prompt tokens a retained session's cache holds
  generation_params pieces = p;
  if (pieces.prefill_chunk == 0 || pieces.prefill_chunk > prefill_chunk_) pieces.prefill_chunk = prefill_chunk_;
  Tensor last;  // the logits returned to generate_tokens stay valid until the next step
  batched_generation out;
  out.result = generate_tokens(
      cfg_, prompt, pieces,
      [&](std::span<const std::int32_t> ids, std::int64_t start) {
        if (guard.id.empty()) {
          open_request o{"g" + std::to_string(next_session_.fetch_add(1)), {prompt.begin(), prompt.end()},
                         schedule::adapter_domain(cache_domain, adapter), adapter};
          const open_reply r = ask<open_reply>(self, actor_, "open a session", open_atom::value, std::move(o));
          guard.id = r.session;
          cached = r.cached;
        }
        // A piece of the prompt the cache already holds is not sent (the
        // last piece never is one: at least the last token is computed).
        const auto n = static_cast<std::int64_t>(ids.size());
        if (start + n <= cached) return std::span<const float>();
        if (start < cached) {
          ids = ids.subspan(static_cast<std::size_t>(cached - start));
          start = cached;
        }
        step_request r{guard.id, {ids.begin(), ids.end()}, start};
        last = ask<step_logits>(self, actor_, "run a step", step_atom::value, std::move(r)).row;
        return std::span<const float>(last.data<float>(), static_cast<std::size_t>(cfg_.vocab_size));
      },
      on_token);
  out.cached_prompt_tokens = static_cast<int>(cached);
  return out;
}

decode_batcher_stats decode_batcher::stats() const {
  caf::scoped_actor self{system_};
  return ask<decode_batcher_stats>(self, actor_, "report its counters", stats_atom::value);
}

}  // namespace corolla
