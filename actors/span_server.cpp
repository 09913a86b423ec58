#include "actors/span_server.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/exit_reason.hpp>
#include <caf/response_promise.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/fault_corruption.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/span_push.hpp"
#include "actors/span_sessions.hpp"
#include "actors/span_server_state.hpp"
#include "actors/swarm_wire.hpp"

// The engine travels only between actors of this process (swap_span_engine).
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<corolla::span_engine>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(corolla::span_server_stats)

namespace corolla {
namespace {

using namespace span_detail;

using flush_atom = caf::atom_constant<caf::atom("spflush")>;
using expire_atom = caf::atom_constant<caf::atom("spexpire")>;
using swap_atom = caf::atom_constant<caf::atom("spswap")>;
using push_timeout_atom = caf::atom_constant<caf::atom("sppushto")>;
using rtts_atom = caf::atom_constant<caf::atom("sprtts")>;
using drain_atom = caf::atom_constant<caf::atom("spdrain")>;
using span_stats_atom = caf::atom_constant<caf::atom("spstats")>;

using span_server_actor = caf::stateful_actor<span_server_state>;

/// Answers a step: pushes the output on first when the step names a next
/// hop (that is the critical path), then returns it to the client,
/// int8-compressed on the wire when asked. On a posted route both carry the
/// trail after the output: `trail` (what came with the push) and `input`
/// (the pushed rows) when the step's input was pushed.
void finish_step(span_server_state& st, const span_step& step, caf::response_promise& rp, span_expected<Tensor> out,
                 const Tensor& input, std::vector<Tensor> trail) {
  if (!out) return fail_step(st, step, rp, to_caf(out.error()));
  if (st.corrupt) *out = corrupted_copy(*out, step.step_id);
  if (!step.trail)
    trail.clear();
  else if (step.await_push)
    trail.push_back(input);
  remote_message r = with_trail(span_request::step, {}, std::move(*out), trail, step.compress_output);
  if (!step.push_to.node.empty()) r.body = encode_body(push_on(st, step, r.tensors[0], trail));
  rp.deliver(std::move(r));
}

/// Runs `batch` (one-row steps of sessions on `engine`) as one batch and
/// answers each.
void run_on(span_server_state& st, span_engine& engine, std::vector<queued_step> batch) {
  std::vector<decode_item> items;
  items.reserve(batch.size());
  for (auto& q : batch) items.push_back(q.item);
  const auto t0 = clock_type::now();
  // One session alone takes the single-sequence path (matrix-vector
  // products split across the thread pool), which is faster than a batch of one.
  std::vector<span_expected<Tensor>> results;
  try {
    if (items.size() == 1)
      results.push_back(
          engine.inference_step(items[0].session_id, items[0].hidden, items[0].start_position, items[0].step_id));
    else
      results = engine.decode_batch(items);
  } catch (const std::exception& e) {
    // Every waiting requester gets an answer, whatever failed (out of memory).
    for (auto& q : batch) fail_step(st, q.step, q.promise, error_from_wire("internal", std::string("span server failed: ") + e.what()));
    st.stats.step_errors += batch.size();
    return;
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  ++st.stats.decode_batches;
  for (const auto& r : results) {
    ++st.stats.decode_steps;
    st.stats.decode_seconds.observe(s);  // each step waited for its whole batch
    if (!r) ++st.stats.step_errors;
  }
  const double per_block = s / engine.size();
  st.step_s_per_block = st.step_s_per_block == 0 ? per_block : 0.8 * st.step_s_per_block + 0.2 * per_block;
  for (std::size_t i = 0; i < batch.size(); ++i)
    finish_step(st, batch[i].step, batch[i].promise, std::move(results[i]), batch[i].item.hidden,
                std::move(batch[i].trail));
}

/// Runs every queued one-row step and answers each: steps of sessions still
/// on the retiring engine as a batch of their own there, first, then the
/// rest as one batch on the current engine.
void run_batch(span_server_actor* self) {
  auto& st = self->state;
  if (st.queue.empty()) return;
  std::vector<std::string> sessions;
  std::vector<queued_step> current, retiring;
  for (auto& q : st.queue.take(sessions))
    (st.retiring && st.retiring->session_length(q.item.session_id) ? retiring : current).push_back(std::move(q));
  const auto t0 = clock_type::now();
  if (!retiring.empty()) run_on(st, *st.retiring, std::move(retiring));
  if (!current.empty()) {
    // Room for a row of each step of an open session (steps of ids nobody
    // opened fail anyway and take back nothing).
    const auto open = static_cast<std::int64_t>(std::count_if(current.begin(), current.end(), [&](const queued_step& q) {
      return st.engine->session_length(q.item.session_id).has_value();
    }));
    make_room(st, open, static_cast<std::size_t>(open));
    run_on(st, *st.engine, std::move(current));
  }
  st.queue.ran(sessions, std::chrono::duration<double>(clock_type::now() - t0).count());
}

/// The flush of queue `seq`: runs it, or waits for the sessions of the last
/// batches (actors/step_queue.hpp).
void on_flush(span_server_actor* self, std::uint64_t seq) {
  auto& st = self->state;
  const auto d = st.queue.on_flush(seq);
  if (d.run) return run_batch(self);
  if (d.wait.count() == 0) return;  // stale
  if (d.first_wait) ++st.stats.decode_waits;
  self->delayed_send(self, d.wait, flush_atom::value, seq);
}

/// Runs one step of `step.session_id` on `hidden` (from the request or
/// from the previous server's push, with a posted route's trail) and
/// answers `rp`.
void run_step(span_server_actor* self, const span_step& step, const Tensor& hidden, caf::response_promise& rp,
              std::vector<Tensor> trail = {}) {
  auto& st = self->state;
  span_engine& engine = engine_of(st, step.session_id);
  if (engine.session_length(step.session_id)) st.last_used[step.session_id] = clock_type::now();
  if (hidden.shape().size() == 2 && hidden.dim(0) == 1) {
    // Steps of other sessions already waiting in the mailbox join this one:
    // the flush message is queued behind them.
    decode_item item{step.session_id, hidden, step.start, step.step_id};
    // A session appears once per batch: a second step of it runs the batch first.
    if (st.queue.holds(item.session_id)) run_batch(self);
    if (st.queue.push(step.session_id, {std::move(item), rp, step, std::move(trail)}))
      self->send(self, flush_atom::value, st.queue.seq());
    // The flush waits for the sessions of the last batches: the last of them runs it.
    if (st.queue.complete()) run_batch(self);
    return;
  }
  run_batch(self);  // steps that arrived earlier run first
  const auto t0 = clock_type::now();
  auto out = engine.inference_step(step.session_id, hidden, step.start, step.step_id);
  // A step the pool cannot hold takes parked sessions' pages back, oldest
  // first, and is tried again (it changed nothing: the engine reserves
  // before it computes, and has checked everything else by then).
  while (!out && out.error().code == span_errc::cache_full && &engine == st.engine.get() && close_oldest_parked(st))
    out = engine.inference_step(step.session_id, hidden, step.start, step.step_id);
  ++st.stats.prefill_steps;
  st.stats.prefill_tokens += hidden.shape().empty() ? 0 : static_cast<std::uint64_t>(hidden.dim(0));
  st.stats.prefill_seconds.observe(std::chrono::duration<double>(clock_type::now() - t0).count());
  if (!out) ++st.stats.step_errors;
  finish_step(st, step, rp, std::move(out), hidden, std::move(trail));
}

/// A push for `step` (the client's waiting request): runs it when it is
/// the one expected, fails the step when the push says it failed upstream.
void take_push(span_server_actor* self, awaited_step& a, early_push p) {
  auto& st = self->state;
  if (!p.problem.empty())
    return fail_step(st, a.step, a.promise,
                     error_from_wire("upstream_failed",
                                     "the previous server " + a.step.push_from + " could not compute it: " + p.problem));
  if (p.start != a.step.start)
    return fail_step(st, a.step, a.promise,
                     error_from_wire("bad_position", "the previous server pushed positions from " +
                                                         std::to_string(p.start) + " but the step starts at " +
                                                         std::to_string(a.step.start)));
  run_step(self, a.step, p.hidden, a.promise, std::move(p.trail));
}

void on_step(span_server_actor* self, remote_message& m, caf::response_promise& rp) {
  auto& st = self->state;
  auto step = decode_span_step(m.body);
  if (!step) return rp.deliver(step.error());
  const std::string session = step->session_id;
  if (auto err = check_owner(st, session, m.from_node)) return rp.deliver(std::move(err));
  // Whose step this is, for the next hop's check of the push (and of a
  // failure notice): never what the sender says.
  step->owner = m.from_node.empty() ? st.runtime->id() : m.from_node;
  if (is_parked(st, session))
    return fail_step(st, *step, rp,
                     error_from_wire("unknown_session", "session '" + session +
                                                            "' was closed (kept only for span.open shareFrom)"));
  if (step->await_push) {
    if (!m.tensors.empty() || step->step_id == 0)
      return fail_step(st, *step, rp,
                       make_error(errc::bad_message, "a span.step awaiting a push carries no tensor and a step id"));
    // What can be checked without the rows is checked now, not after a wait.
    const auto length = engine_of(st, session).session_length(session);
    if (!length) return fail_step(st, *step, rp, error_from_wire("unknown_session", "no open session '" + session + "'"));
    if (step->start < 0 || step->start > *length)
      return fail_step(st, *step, rp,
                       error_from_wire("bad_position", "step starts at position " + std::to_string(step->start) +
                                                           " but the session holds " + std::to_string(*length) +
                                                           " tokens"));
    // On a posted route the previous server cannot tell the client that it
    // had no link to push on: the step fails now, not after waitMs.
    if (step->trail && !st.runtime->peer_is_up(step->push_from))
      return fail_step(st, *step, rp,
                       error_from_wire("push_source_down", "no link from the previous server " + step->push_from +
                                                               ": its push cannot come"));
    // One wait per session: an older one (a step the client gave up on)
    // ends now, and no late push for it can run after this step.
    end_wait(st, session, "superseded", "a newer step of this session arrived");
    drop_early(st, session, step->step_id - 1);
    if (auto p = take_early(st, early_key{session, step->step_id, step->push_from, step->owner})) {
      awaited_step a{std::move(*step), rp};
      return take_push(self, a, std::move(*p));
    }
    const std::uint32_t wait_ms = std::clamp<std::uint32_t>(step->wait_ms, 1, max_push_wait_ms);
    const std::uint64_t seq = st.next_wait_seq++;
    st.awaited.insert_or_assign(session, awaited_step{std::move(*step), rp, seq});
    self->delayed_send(self, std::chrono::milliseconds(wait_ms), push_timeout_atom::value, session, seq);
    return;
  }
  if (m.tensors.size() != 1)
    return fail_step(st, *step, rp,
                     make_error(errc::bad_message, "span.step carries one tensor (hidden states), got " +
                                                       std::to_string(m.tensors.size())));
  // The client carries this step itself (a failure or an unpushed output
  // upstream): a request still waiting for a push is superseded, and pushes
  // for this or older steps are not needed any more.
  end_wait(st, session, "superseded", "the client sent this step's input itself");
  drop_early(st, session, step->step_id);
  run_step(self, *step, m.tensors[0], rp);
}

/// span.push from the previous server of a route: one-way, so problems are
/// logged (rate-limited by the runtime) and the push dropped; the client's
/// waiting request then times out and the client carries the step. A push
/// is taken only from the server the step names and for a step of the node
/// that owns it (a push computed for a stranger's step never feeds it).
void on_push(span_server_actor* self, remote_message& m) {
  auto& st = self->state;
  auto step = decode_span_step(m.body);
  const bool notice = step && !step->upstream_problem.empty();
  if (!step || (notice ? !m.tensors.empty() : m.tensors.empty())) {
    spdlog::warn("span server: dropped a malformed span.push from {}: {}", m.from_node,
                 step ? "it carries " + std::to_string(m.tensors.size()) + " tensors" + (notice ? " with a failure notice" : "")
                      : error_message(step.error()));
    return;
  }
  early_push p;
  p.start = step->start;
  p.problem = step->upstream_problem;
  p.at = clock_type::now();
  if (!notice) {
    p.hidden = m.tensors[0];
    p.trail.assign(m.tensors.begin() + 1, m.tensors.end());
  }
  const std::string session = step->session_id;
  if (auto a = st.awaited.find(session); a != st.awaited.end()) {
    const span_step& want = a->second.step;
    if (step->step_id < want.step_id) return;  // for a step the client has moved on from
    if (step->step_id == want.step_id) {
      if (m.from_node != want.push_from || step->owner != want.owner) {
        spdlog::warn("span server: dropped a push for {} from {} for {}'s step; the step is {}'s and expects it from {}",
                     session, m.from_node, step->owner, want.owner, want.push_from);
        return;
      }
      awaited_step taken = std::move(a->second);
      st.awaited.erase(a);
      return take_push(self, taken, std::move(p));
    }
  }
  // The client's request is still on its way: keep the push for it.
  keep_early(st, early_key{session, step->step_id, m.from_node, step->owner}, std::move(p));
}

void on_stateless(span_server_actor* self, remote_message& m, caf::response_promise& rp, bool backward) {
  auto& st = self->state;
  auto b = decode_span_batch(m.body);
  if (!b) return rp.deliver(b.error());
  // hidden (and for a backward the output gradient), the prompts, then a
  // carried adapter's values (the engine checks them against its blocks).
  const std::size_t want = (backward ? 2 : 1) + (b->with_prompts ? 1 : 0) + (b->lora ? 1 : 0);
  if (m.tensors.size() != want)
    return rp.deliver(make_error(errc::bad_message, std::string(backward ? "span.backward" : "span.forward") +
                                                        " expects " + std::to_string(want) + " tensors, got " +
                                                        std::to_string(m.tensors.size())));
  const std::size_t prompts_at = backward ? 2 : 1;
  const Tensor prompts = b->with_prompts ? m.tensors[prompts_at] : Tensor();
  std::optional<lora_span_values> carried;
  if (b->lora) carried = lora_span_values{*b->lora, m.tensors.back()};
  const lora_span_values* lora = carried ? &*carried : nullptr;
  const auto t0 = clock_type::now();
  auto took = [&] { return std::chrono::duration<double>(clock_type::now() - t0).count(); };
  if (!backward) {
    std::vector<float> margins;
    auto out = st.engine->forward(m.tensors[0], b->batch, b->seq, prompts, b->first, b->last,
                                  b->with_margins ? &margins : nullptr, b->adapter, lora);
    ++st.stats.forward_passes;
    st.stats.forward_seconds.observe(took());
    if (!out) {
      ++st.stats.step_errors;
      return rp.deliver(to_caf(out.error()));
    }
    if (st.corrupt) *out = corrupted_copy(*out, st.stats.forward_passes);
    std::vector<Tensor> tensors{std::move(*out)};
    if (b->with_margins) tensors.push_back(Tensor::from_f32(margins, {static_cast<std::int64_t>(margins.size())}));
    return rp.deliver(answer(span_request::forward, {}, std::move(tensors)));
  }
  auto g = st.engine->backward(m.tensors[0], m.tensors[1], b->batch, b->seq, prompts, b->first, b->last, b->adapter,
                               lora);
  ++st.stats.backward_passes;
  st.stats.backward_seconds.observe(took());
  if (!g) {
    ++st.stats.step_errors;
    return rp.deliver(to_caf(g.error()));
  }
  if (st.corrupt) {  // wrong gradients too (faultlab's corrupt)
    const auto corrupt_rows = [&](Tensor& t) {
      const shape_t shape = t.shape();
      const std::int64_t width = shape.back();
      t = corrupted_copy(t.view({t.numel() / width, width}), st.stats.backward_passes).view(shape);
    };
    g->grad_input = corrupted_copy(g->grad_input, st.stats.backward_passes);
    if (g->grad_prompts.defined()) corrupt_rows(g->grad_prompts);
    if (g->grad_lora.defined()) corrupt_rows(g->grad_lora);
  }
  std::vector<Tensor> tensors{std::move(g->grad_input)};
  if (g->grad_prompts.defined()) tensors.push_back(std::move(g->grad_prompts));
  if (g->grad_lora.defined()) tensors.push_back(std::move(g->grad_lora));
  rp.deliver(answer(span_request::backward, {}, std::move(tensors)));
}

caf::behavior span_server(span_server_actor* self, node* runtime, std::shared_ptr<span_engine> engine,
                          span_server_options options) {
  self->state.runtime = runtime;
  self->state.engine = std::move(engine);
  self->state.options = std::move(options);
  self->state.queue = step_queue<queued_step>(self->state.options.gathering);
  self->set_default_handler(caf::drop);
  const auto expire_every = std::max(std::chrono::milliseconds(50), self->state.options.session_idle_timeout / 4);
  self->delayed_send(self, expire_every, expire_atom::value);
  return {
      [self](remote_message& m) {
        auto rp = self->make_response_promise();
        auto& st = self->state;
        if (m.type == span_request::step) return on_step(self, m, rp);
        if (m.type == span_request::push) return on_push(self, m);
        // Anything else first lets the waiting decode steps run, in order.
        run_batch(self);
        if (m.type == span_request::info) return rp.deliver(answer(span_request::info, encode_body(info_of(st))));
        if (m.type == span_request::open) return on_open(st, m, rp);
        if (m.type == span_request::close) return on_close(st, m, rp);
        if (m.type == span_request::forward) return on_stateless(self, m, rp, false);
        if (m.type == span_request::backward) return on_stateless(self, m, rp, true);
        rp.deliver(make_error(errc::bad_message, "the span server answers span.info, span.open, span.step, "
                                                 "span.close, span.forward and span.backward, not '" + m.type + "'"));
      },
      [self](flush_atom, std::uint64_t seq) { on_flush(self, seq); },
      [self](corrupt_atom, bool on) { self->state.corrupt = on; },
      [self](span_stats_atom) -> span_server_stats {
        auto& st = self->state;
        span_server_stats out = st.stats;
        out.sessions_open =
            st.engine->session_count() - st.parked.size() + (st.retiring ? st.retiring->session_count() : 0);
        out.sessions_parked_now = st.parked.size();
        out.cache_tokens = st.engine->cache_tokens();
        out.cache_tokens_left = tokens_left(st);
        out.step_s_per_block = st.step_s_per_block;
        out.first = st.engine->first();
        out.last = st.engine->last();
        out.draining = st.draining;
        return out;
      },
      // A server whose push a step waits for went down (or its link to us
      // broke): the push will not come, so the client carries the step now
      // instead of after waitMs.
      [self](peer_down& d) {
        auto& st = self->state;
        for (auto a = st.awaited.begin(); a != st.awaited.end();) {
          if (a->second.step.push_from != d.peer) {
            ++a;
            continue;
          }
          fail_step(st, a->second.step, a->second.promise,
                    error_from_wire("push_source_down", "the previous server " + d.peer + " is down (" + d.reason +
                                                            "): its push will not come"));
          a = st.awaited.erase(a);
        }
      },
      [](peer_up&) {},
      [self](rtts_atom, std::map<std::string, double>& rtts) { self->state.next_rtt_ms = std::move(rtts); },
      [self](drain_atom) -> std::uint64_t {
        auto& st = self->state;
        run_batch(self);
        if (!st.draining) spdlog::info("span server: draining: no new sessions");
        st.draining = true;
        close_parked(st);
        release_retiring(st);
        return st.engine->session_count() + (st.retiring ? st.retiring->session_count() : 0);
      },
      [self](push_timeout_atom, const std::string& session, std::uint64_t seq) {
        auto& st = self->state;
        auto a = st.awaited.find(session);
        if (a == st.awaited.end() || a->second.seq != seq) return;
        ++st.stats.push_timeouts;
        fail_step(st, a->second.step, a->second.promise,
                  error_from_wire("push_timeout", "no input for session " + session + " from the previous server " +
                                                      a->second.step.push_from + " within " +
                                                      std::to_string(a->second.step.wait_ms) + " ms"));
        st.awaited.erase(a);
      },
      [self](swap_atom, std::shared_ptr<span_engine>& next) -> bool {
        run_batch(self);
        auto& st = self->state;
        close_parked(st);  // their pages are of the blocks being left
        // Sessions opened before the move finish on the old blocks (kept
        // loaded until the last one closes or expires); new sessions open on
        // the new ones. A second move while an older one still drains ends
        // the oldest sessions (their clients fail over).
        if (st.retiring) {
          spdlog::warn("span server: moving again; {} session(s) still on blocks [{}, {}) end now",
                       st.retiring->session_count(), st.retiring->first(), st.retiring->last());
          for (auto it = st.last_used.begin(); it != st.last_used.end();)
            it = st.retiring->session_length(it->first) ? st.last_used.erase(it) : std::next(it);
        }
        spdlog::info("span server: now serving blocks [{}, {}) (was [{}, {}); its {} session(s) finish there)",
                     next->first(), next->last(), st.engine->first(), st.engine->last(), st.engine->session_count());
        st.retiring = st.engine->session_count() > 0 ? std::move(st.engine) : nullptr;
        st.engine = std::move(next);
        st.step_s_per_block = 0;
        return true;
      },
      [self, expire_every](expire_atom) {
        expire_idle(self->state);
        // A queue that waited only for expired sessions runs now.
        if (self->state.queue.complete()) run_batch(self);
        self->delayed_send(self, expire_every, expire_atom::value);
      },
  };
}

}  // namespace

void set_next_rtts(const caf::actor& server, std::map<std::string, double> rtt_ms) {
  caf::anon_send(server, rtts_atom::value, std::move(rtt_ms));
}

caf::expected<std::size_t> drain_span_server(caf::actor_system& system, const caf::actor& server,
                                             std::chrono::milliseconds timeout) {
  caf::scoped_actor self{system};
  caf::expected<std::size_t> result{std::size_t{0}};
  self->request(server, timeout, drain_atom::value)
      .receive([&](std::uint64_t open) { result = static_cast<std::size_t>(open); },
               [&](caf::error& e) { result = std::move(e); });
  return result;
}

caf::expected<span_server_stats> span_server_stats_of(caf::actor_system& system, const caf::actor& server,
                                                      std::chrono::milliseconds timeout) {
  caf::scoped_actor self{system};
  caf::expected<span_server_stats> result{span_server_stats{}};
  self->request(server, timeout, span_stats_atom::value)
      .receive([&](span_server_stats& s) { result = std::move(s); }, [&](caf::error& e) { result = std::move(e); });
  return result;
}

caf::error swap_span_engine(caf::actor_system& system, const caf::actor& server, std::shared_ptr<span_engine> engine,
                            std::chrono::milliseconds timeout) {
  caf::scoped_actor self{system};
  caf::error result;
  self->request(server, timeout, swap_atom::value, std::move(engine))
      .receive([](bool) {}, [&](caf::error& e) { result = std::move(e); });
  return result;
}

caf::expected<caf::actor> start_span_server(node& n, std::shared_ptr<span_engine> engine,
                                            span_server_options options) {
  caf::actor a = n.system().spawn<caf::detached>(span_server, &n, std::move(engine), std::move(options));
  n.monitor_peer("", a);  // peer_down ends waits for pushes from that peer
  if (auto err = n.publish("span", a)) {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return err;
  }
  return a;
}

}  // namespace corolla
