// actors/swarm_session.cpp — a session through the swarm
// (actors/swarm_client.hpp): opening its route's hops, steps (servers
// pushing to each other, or the client carrying each hop), keeping every
// span's inputs, and on a failure replacing the lost span and replaying
// those inputs into the replacement. Spot checks are in swarm_spot_check.cpp.
#include "actors/swarm_client.hpp"
#include "actors/swarm_hop_state.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include <caf/scoped_actor.hpp>

#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "net/codec.hpp"

namespace corolla {

using swarm_detail::request_of;

namespace {

/// What a server receives for `x` sent as int8_block: the very wire
/// encoding and decoding. The client keeps this (not x) as the span's input,
/// so a replay rebuilds exactly the cache the lost server had.
Tensor int8_wire_roundtrip(const Tensor& x) {
  net::message m;
  m.kind = net::message_kind::oneway;
  m.tensors = {x};
  m.encodings = {net::tensor_encoding::int8_block};
  const auto frames = net::encode(m, false);
  std::vector<net::in_frame> in;
  for (const auto& f : frames) in.push_back({f.data, f.size, f.owner});
  auto back = net::decode(in);
  return back ? back->tensors.at(0) : x;
}

}  // namespace

Tensor swarm_detail::concat_rows(const std::vector<Tensor>& chunks, std::int64_t rows, std::int64_t width) {
  Tensor out = Tensor::empty({rows, width});
  std::int64_t r = 0;
  for (const Tensor& c : chunks) {
    if (r >= rows) break;
    const std::int64_t take = std::min(c.dim(0), rows - r);
    Tensor dst = out.slice(r, r + take);
    dst.copy_from(c.slice(0, take));
    r += take;
  }
  return out;
}

std::vector<Tensor> swarm_detail::first_rows(const std::vector<Tensor>& chunks, std::int64_t rows) {
  std::vector<Tensor> out;
  for (const Tensor& c : chunks) {
    if (rows <= 0) break;
    const std::int64_t take = std::min(c.dim(0), rows);
    out.push_back(take == c.dim(0) ? c : c.slice(0, take));
    rows -= take;
  }
  return out;
}

swarm_session::swarm_session(swarm_client& client, std::int64_t max_length, std::string id, Tensor deep_prompts)
    : client_(client), max_length_(max_length), id_(std::move(id)), deep_prompts_(std::move(deep_prompts)) {}

swarm_session::~swarm_session() { close(); }

const std::vector<swarm::route_hop>& swarm_session::hops() const {
  hop_view_.clear();
  for (const auto& h : hops_) hop_view_.push_back(h.hop);
  return hop_view_;
}

namespace {

/// Closes (with `keep`: parks) `session` on `server`, best effort: a server
/// whose link is down is skipped, a failure only logged.
void close_on(node& n, const std::string& server, const std::string& session, bool keep) {
  if (!n.peer_is_up(server)) return;
  auto r = n.request(server, "span", request_of(span_request::close, encode_close_body(session, keep)),
                     std::chrono::milliseconds(2000));
  if (!r) spdlog::debug("swarm: closing session {} on {}: {}", session, server, error_message(r.error()));
}

}  // namespace

void swarm_session::close(bool keep) {
  for (auto& h : hops_) close_on(client_.runtime(), h.hop.server, h.session, keep);
  hops_.clear();
}

caf::error swarm_session::open_hops(std::vector<swarm::route_hop> hops, std::size_t at, const swarm_prefix* share) {
  std::vector<hop_state> opened;
  std::int64_t shared = share ? share->tokens : 0;
  for (std::size_t j = 0; j < hops.size(); ++j) {
    hop_state h;
    h.hop = hops[j];
    h.session = id_ + "." + std::to_string(next_session_++);
    span_open o{h.session, max_length_, h.hop.start, h.hop.end, deep_prompts_.defined()};
    if (share) o.share_from = share->hops[j].session, o.share_tokens = share->tokens;
    o.adapter = client_.adapter_name();
    remote_message open = request_of(span_request::open, encode_body(o));
    if (deep_prompts_.defined()) open.tensors.push_back(deep_prompts_.slice(h.hop.start, h.hop.end).clone());
    auto r = client_.runtime().request(h.hop.server, "span", std::move(open), client_.options().request_timeout);
    if (r && share) {
      auto info = decode_span_info(r->body);
      shared = std::min(shared, info ? info->shared_tokens : 0);
    }
    if (!r) {
      for (auto& o : opened)  // best effort: do not leave half a route's sessions behind
        (void)client_.runtime().request(o.hop.server, "span", request_of(span_request::close, encode_close_body(o.session)),
                                        std::chrono::milliseconds(1000));
      return r.error();
    }
    opened.push_back(std::move(h));
  }
  if (share && shared > 0) {
    // Every hop holds the first `shared` positions (a server that shared
    // more rolls back at the first step); the replays of those positions
    // resend the other session's inputs.
    for (std::size_t j = 0; j < opened.size(); ++j) {
      opened[j].inputs = swarm_detail::first_rows(share->hops[j].inputs, shared);
      opened[j].rows = shared;
      opened[j].out_rows = -1;  // the answers for them are the other session's
    }
    length_ = shared;
  }
  hops_.insert(hops_.begin() + static_cast<std::ptrdiff_t>(at), std::make_move_iterator(opened.begin()),
               std::make_move_iterator(opened.end()));
  return {};
}

void close_parked(node& n, const swarm_prefix& parked) {
  for (const auto& h : parked.hops) close_on(n, h.hop.server, h.session, false);
}

swarm_prefix swarm_session::prefix() const {
  swarm_prefix p;
  if (deep_prompts_.defined() || length_ == 0) return p;
  for (const auto& h : hops_) {
    if (h.fresh || h.rows < length_) return {};
    p.hops.push_back({h.hop, h.session, h.inputs});
  }
  p.tokens = length_;
  return p;
}

caf::expected<Tensor> swarm_session::run_hop(std::size_t i, const Tensor& input, std::int64_t start) {
  hop_state& h = hops_[i];
  // A replay or a long prefill computes many rows: its time grows with them
  // (one more request timeout per 256 rows), so it is not abandoned and
  // recomputed over and over.
  const auto timeout = client_.options().request_timeout * (1 + input.dim(0) / 256);
  // Compression applies to ordinary steps; a replay rebuilds a cache and
  // goes exact, so the replacement holds what the lost server held.
  const bool compress = client_.options().compress && !h.fresh;
  remote_message m = request_of(span_request::step, encode_body(span_step{.session_id = h.session, .start = start, .step_id = step_id_, .compress_output = compress}), {input});
  if (compress) m.encodings = {net::tensor_encoding::int8_block};
  auto r = client_.runtime().request(h.hop.server, "span", std::move(m), timeout);
  if (!r) return r.error();
  if (r->tensors.size() != 1 || r->tensors[0].shape() != input.shape())
    return make_error(errc::bad_message, "server " + h.hop.server + " answered a step of " +
                                             std::to_string(input.dim(0)) + " rows with " +
                                             std::to_string(r->tensors.size()) + " tensors of another shape");
  return std::move(r->tensors[0]);
}

caf::error swarm_session::recover(std::size_t i, const caf::error& cause, std::set<std::string>& excluded, int attempt) {
  // Replace hops_[i] by a route over its blocks; the caller retries the step.
  route_pushes_ = false;  // the new route's pushes are not known to go through yet
  const swarm::route_hop lost = hops_[i].hop;
  excluded.insert(lost.server);
  client_.on_probation(lost.server);
  client_.event("server " + lost.server + " failed on blocks " + to_string(lost.span()) + ": " +
                error_message(cause));
  if (attempt > 0) {
    if (auto e = client_.back_off(attempt - 1)) return e;
    // A server that failed before may be back: exclude only the latest one.
    excluded = {lost.server};
  }
  auto r = client_.route(lost.start, lost.end, excluded, max_length_);
  if (!r) {
    // Nothing else holds these blocks: the failed server is the only hope
    // left (a restarted process, a transient error); try it again.
    excluded.clear();
    r = client_.route(lost.start, lost.end, excluded, max_length_);
    if (!r) return r.error();
  }
  // The replacement's sessions are opened now; their caches are rebuilt
  // with the stored inputs when the step is retried (pass()).
  hop_state old = std::move(hops_[i]);
  hops_.erase(hops_.begin() + static_cast<std::ptrdiff_t>(i));
  if (auto err = open_hops(r->hops, i)) {
    hops_.insert(hops_.begin() + static_cast<std::ptrdiff_t>(i), std::move(old));
    return err;
  }
  // The first new hop inherits the lost span's inputs; the others get theirs
  // from the replay.
  for (std::size_t k = i; k < i + r->hops.size(); ++k) {
    hops_[k].fresh = true;
    hops_[k].rows = -1;  // filled by the replay of the hop before it
  }
  hops_[i].inputs = std::move(old.inputs);
  hops_[i].rows = old.rows;
  ++failovers_;
  client_.event("replacing " + lost.server + " on " + to_string(lost.span()) + " with " +
                swarm::to_string(*r) + "; replaying " + std::to_string(hops_[i].rows) + " stored rows");
  if (client_.runtime().peer_is_up(lost.server))  // e.g. a full cache: free what it holds
    (void)client_.runtime().request(lost.server, "span", request_of(span_request::close, encode_close_body(old.session)),
                                    std::chrono::milliseconds(1000));
  return {};
}

void swarm_session::remember_input(hop_state& h, Tensor sent, std::int64_t start) {
  // Keep this span's inputs for a later replay (a rollback cuts them first).
  if (h.rows > start) {
    h.inputs = {swarm_detail::concat_rows(h.inputs, start, sent.dim(1))};
    h.rows = start;
  }
  h.rows = start + sent.dim(0);
  h.inputs.push_back(std::move(sent));
}

caf::expected<Tensor> swarm_session::pass(std::size_t i, const Tensor& x, std::int64_t start) {
  hop_state& h = hops_[i];
  const std::int64_t n = x.dim(0), D = x.dim(1);
  if (!h.fresh) {
    const Tensor sent = client_.options().compress ? int8_wire_roundtrip(x) : x;
    auto out = run_hop(i, sent, start);
    if (!out) return out;
    remember_input(h, sent.clone(), start);
    return out;
  }
  // A replacement: its cache is rebuilt from the span's stored inputs and
  // this step's rows in one prefill from position 0.
  if (h.rows < start)
    return make_error(errc::invalid_argument, "cannot replay span " + to_string(h.hop.span()) +
                                                  ": the client holds " + std::to_string(std::max<std::int64_t>(h.rows, 0)) +
                                                  " of its " + std::to_string(start) + " rows");
  Tensor all = Tensor::empty({start + n, D});
  if (start > 0) {
    Tensor stored = all.slice(0, start);
    stored.copy_from(swarm_detail::concat_rows(h.inputs, start, D));
  }
  Tensor rows = all.slice(start, start + n);
  rows.copy_from(client_.options().compress ? int8_wire_roundtrip(x) : x);
  auto out = run_hop(i, all, 0);
  if (!out) return out;
  h.fresh = false;
  h.inputs = {all};
  h.rows = start + n;
  // The next hop of the same replacement gets this span's outputs as its
  // inputs; the last hop keeps them as its answers' history.
  if (i + 1 < hops_.size() && hops_[i + 1].fresh && hops_[i + 1].rows < 0) {
    hops_[i + 1].inputs = {out->slice(0, start).clone()};
    hops_[i + 1].rows = start;
  }
  if (i + 1 == hops_.size()) {
    h.outputs = {out->slice(0, start).clone()};
    h.out_rows = start;
  }
  return out->slice(start, start + n).clone();
}

span_step swarm_session::pushed_step(std::size_t i, std::int64_t start, std::chrono::milliseconds timeout,
                                     bool posted) const {
  const std::size_t k = hops_.size();
  span_step st{.session_id = hops_[i].session,
               .start = start,
               .step_id = step_id_,
               .compress_output = client_.options().compress,
               .trail = posted};
  if (i > 0) {
    // Hop i waits for i hops' work before its input comes.
    st.await_push = true;
    st.push_from = hops_[i - 1].hop.server;
    st.wait_ms = static_cast<std::uint32_t>(
        std::min<std::int64_t>(timeout.count() * static_cast<std::int64_t>(i), std::numeric_limits<std::uint32_t>::max()));
  }
  if (i + 1 < k) {
    const known_server* next = client_.server(hops_[i + 1].hop.server);
    st.push_to = {hops_[i + 1].hop.server, next ? next->endpoint : "", next ? next->public_key : "", hops_[i + 1].session};
  }
  return st;
}

std::size_t swarm_session::push_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs) {
  // Once a route's pushes have gone through, its one-row steps are posted
  // (post_step); anything else, and the step after any trouble, goes by
  // request, every hop answering.
  if (route_pushes_ && x.dim(0) == 1 && client_.options().post_steps &&
      !client_.options().compress) {
    if (auto done = post_step(x, start, outs)) {
      route_pushes_ = *done == hops_.size();
      return *done;
    }
  }
  const std::size_t done = request_step(x, start, outs);
  route_pushes_ = done == hops_.size();
  return done;
}

std::optional<std::size_t> swarm_session::post_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs) {
  // Every hop but the last gets its step one-way, straight to the
  // transport from this thread; the last hop's answer brings the outputs
  // of the hops before it (the inputs it and they were pushed), so no other
  // server answers. A failure anywhere fails the last hop's step (the
  // servers tell the next hop, or their link goes down), and the client
  // then carries the step from hop 0, whose server repeats its stored
  // answer when it had computed it (same step id).
  node& n = client_.runtime();
  const std::size_t k = hops_.size();
  const auto timeout = client_.options().request_timeout;
  auto last = n.remote_actor(hops_[k - 1].hop.server, "span");
  if (!last) return std::nullopt;
  for (std::size_t i = 0; i + 1 < k; ++i) {
    remote_message m = request_of(span_request::step, encode_body(pushed_step(i, start, timeout, true)),
                                  i == 0 ? std::vector<Tensor>{x} : std::vector<Tensor>{});
    if (auto err = n.post(hops_[i].hop.server, "span", std::move(m), "swarm")) {
      spdlog::debug("swarm: could not post the step to {} ({}): {}", hops_[i].hop.server, error_message(err),
                    i == 0 ? "it goes by request" : "the client carries it");
      if (i == 0) return std::nullopt;  // nothing went out
      return 0;
    }
  }
  caf::scoped_actor self{n.system()};
  caf::expected<remote_message> r{make_error(errc::peer_down, "no answer")};
  self->request(*last, timeout * static_cast<long>(k),
                request_of(span_request::step, encode_body(pushed_step(k - 1, start, timeout, true))))
      .receive([&](remote_message& m) { r = std::move(m); }, [&](caf::error& e) { r = std::move(e); });
  const bool whole = r && r->tensors.size() == k &&
                     std::all_of(r->tensors.begin(), r->tensors.end(), [&](const Tensor& t) { return t.shape() == x.shape(); });
  if (!whole) {
    spdlog::debug("swarm: posted step through {} hops ({}): the client carries it from hop 0", k,
                  r ? "an answer of another shape" : error_message(r.error()));
    return 0;
  }
  outs[k - 1] = std::move(r->tensors[0]);
  remember_input(hops_[0], x.clone(), start);
  for (std::size_t i = 1; i < k; ++i) {
    outs[i - 1] = std::move(r->tensors[i]);
    remember_input(hops_[i], outs[i - 1], start);
    ++pushed_hops_;
  }
  ++posted_steps_;
  return k;
}

std::size_t swarm_session::request_step(const Tensor& x, std::int64_t start, std::vector<Tensor>& outs) {
  // Every hop's request goes out at once: the first carries the input, the
  // others wait for their predecessor's push. The answers (each hop's
  // output, the next hop's input) are read in route order and remembered
  // for replays. At the first hop that fails, or whose predecessor could
  // not push, the client carries the step from there itself (step()).
  node& n = client_.runtime();
  const std::size_t k = hops_.size();
  const auto timeout = client_.options().request_timeout * (1 + x.dim(0) / 256);
  const bool compress = client_.options().compress;
  caf::scoped_actor self{n.system()};
  using handle = decltype(self->request(caf::actor{}, timeout, remote_message{}));
  std::vector<handle> answers;
  answers.reserve(k);
  // Every hop must be reachable before anything goes out (else the client
  // carries the whole step, and no server computes it twice).
  std::vector<caf::actor> targets;
  for (const auto& h : hops_) {
    auto target = n.remote_actor(h.hop.server, "span");
    if (!target) return 0;
    targets.push_back(std::move(*target));
  }
  Tensor sent = compress ? int8_wire_roundtrip(x) : x;
  for (std::size_t i = 0; i < k; ++i) {
    remote_message m = request_of(span_request::step, encode_body(pushed_step(i, start, timeout, false)),
                                  i == 0 ? std::vector<Tensor>{sent} : std::vector<Tensor>{});
    if (i == 0 && compress) m.encodings = {net::tensor_encoding::int8_block};
    answers.push_back(self->request(targets[i], timeout * static_cast<long>(i + 1), std::move(m)));
  }
  for (std::size_t i = 0; i < k; ++i) {
    caf::expected<remote_message> r{make_error(errc::peer_down, "no answer")};
    answers[i].receive([&](remote_message& m) { r = std::move(m); }, [&](caf::error& e) { r = std::move(e); });
    if (!r || r->tensors.size() != 1 || r->tensors[0].shape() != x.shape()) {
      spdlog::debug("swarm: push step at hop {} ({}): the client carries it from here", i,
                    r ? "an answer of another shape" : error_message(r.error()));
      return i;
    }
    remember_input(hops_[i], i == 0 ? sent.clone() : outs[i - 1], start);
    if (i > 0) ++pushed_hops_;
    outs[i] = std::move(r->tensors[0]);
    if (i + 1 == k) break;
    auto done = decode_span_step_done(r->body);
    if (!done || !done->pushed) {
      spdlog::debug("swarm: {} did not push to {} ({}): the client carries the step from there", hops_[i].hop.server,
                    hops_[i + 1].hop.server, done ? done->push_problem : error_message(done.error()));
      return i + 1;
    }
  }
  return k;
}

caf::error swarm_session::run_hops(std::size_t from, const Tensor& x, std::int64_t start, std::vector<Tensor>& outs) {
  // Servers push to each other while every hop is an ordinary one; a
  // replacement still being rebuilt (replay) is carried by the client.
  outs.resize(hops_.size());
  std::size_t i = from;
  // Servers behind NAT take no pushes (nobody dials them): the client
  // carries steps through routes that have one.
  if (from == 0 && client_.options().server_push && hops_.size() > 1 &&
      std::none_of(hops_.begin(), hops_.end(), [this](const hop_state& h) {
        const known_server* s = client_.server(h.hop.server);
        return h.fresh || (s && s->relayed);
      }))
    i = push_step(x, start, outs);
  for (; i < hops_.size(); ++i) {
    const Tensor in = i == from ? x : outs[i - 1];  // a handle: recover() may resize outs
    std::set<std::string> excluded;
    for (int attempt = 0;; ++attempt) {
      auto out = pass(i, in, start);
      if (out) {
        outs[i] = std::move(*out);
        break;
      }
      if (!is_recoverable(out.error())) return out.error();
      if (attempt + 1 >= client_.options().max_failovers)
        return make_error(errc::peer_down, "gave up on blocks " + to_string(hops_[i].hop.span()) + " after " +
                                               std::to_string(attempt + 1) + " attempts: " + error_message(out.error()));
      if (auto err = recover(i, out.error(), excluded, attempt); err && !is_recoverable(err)) return err;
      outs.resize(hops_.size());  // a replacement may be several hops
    }
  }
  return {};
}

caf::expected<Tensor> swarm_session::step(const Tensor& hidden, std::int64_t start) {
  const int D = client_.hidden_size();
  if (hidden.shape().size() != 2 || hidden.dim(1) != D || hidden.dim(0) < 1)
    return make_error(errc::invalid_argument, "hidden states must be [n, " + std::to_string(D) + "] with n >= 1");
  if (start < 0 || start > length_)
    return make_error(errc::invalid_argument, "step starts at position " + std::to_string(start) +
                                                  " but the session holds " + std::to_string(length_) + " tokens");
  if (start + hidden.dim(0) > max_length_)
    return make_error(errc::invalid_argument, "step ends at position " + std::to_string(start + hidden.dim(0)) +
                                                  ", beyond the session's " + std::to_string(max_length_) + " tokens");
  const Tensor x = hidden.type() == dtype::f32 ? hidden : hidden.to(dtype::f32);
  // A failure part-way leaves the hops before it one step ahead: the
  // session then counts only what every hop holds, and the next step from
  // there rolls those hops back.
  const auto fail = [&](caf::error e) {
    length_ = std::min(length_, start);
    return e;
  };
  std::vector<Tensor> outs;  // each hop's output of this step
  std::size_t from = 0;
  for (int redo = 0;; ++redo) {
    // Every round gets its own step id: a server repeats its stored answer
    // only for a retry within one round, never for rows it must compute
    // again (new rows at a position it has seen, or a redo after a wrong
    // answer upstream).
    step_id_ = next_step_++;
    const Tensor in = from == 0 ? x : outs[from - 1];  // a handle: run_hops may resize outs
    if (auto err = run_hops(from, in, start, outs)) return fail(err);
    const std::size_t wrong = check_hops(from, outs, start, hidden.dim(0));
    if (wrong == hops_.size()) break;
    // A spot check's majority found hop `wrong` answering wrong: it is
    // replaced (the server is not routed through again) and the step is
    // redone from there; the hops after it roll back to `start`.
    const std::string server = hops_[wrong].hop.server;
    if (redo + 1 >= client_.options().max_failovers)
      return fail(make_error(errc::peer_down, "gave up after " + std::to_string(redo + 1) +
                                                  " wrong answers in one step (last from " + server + ")"));
    std::set<std::string> excluded;
    auto cause = error_from_wire("wrong_output", "a spot check's majority disagrees with its output");
    if (auto err = recover(wrong, cause, excluded, 0)) return fail(err);
    from = wrong;
  }
  length_ = start + hidden.dim(0);
  return outs.back();
}

}  // namespace corolla
