// Server-to-server push (span.step with pushTo / awaitPush, span.push): a
// server pushes its output to the next server of the route, which runs it
// for the client's waiting request; pushes from anyone but the expected
// server, or computed for another node's step, are dropped, a missing push
// times out with a clear error, and the client sending the input itself
// supersedes the wait. Posted routes (trail): only the last hop answers,
// with every hop's output, and a failure upstream reaches it at once.
#include <doctest/doctest.h>

#include <memory>
#include <thread>

#include <caf/send.hpp>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "actors/swarm_wire.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "tests/actors/span_test_util.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/tiny_model.hpp"

using namespace std::chrono_literals;

namespace corolla {

using testing::random_rows;
using testing::same_bits;
using testing::start_node;

namespace {

/// Two span servers (blocks [0, 2) on node a, [2, 4) on node b), a client
/// node connected to both, and reference engines for the same blocks.
struct push_fixture {
  testing::temp_dir_guard dir{"span-push"};
  model_config cfg;
  std::unique_ptr<span_engine> ref_a, ref_b;
  std::unique_ptr<node> a, b, client;
  std::string a_id, b_id;
  std::int64_t D = 0;

  push_fixture() {
    testing::tiny_model_options o;
    o.layers = 4;
    testing::write_tiny_model(dir.path(), o);
    const checkpoint ck = checkpoint::open(dir.path());
    cfg = load_config(dir.path());
    D = cfg.hidden_size;
    auto load = [&](int first, int last) {
      return std::make_unique<span_engine>(span_engine::load(ck, cfg, first, last, cpu_backend(), 256));
    };
    ref_a = load(0, 2);
    ref_b = load(2, 4);
    a = start_node();
    b = start_node();
    REQUIRE(start_span_server(*a, std::shared_ptr<span_engine>(load(0, 2)), {.model = "m"}));
    REQUIRE(start_span_server(*b, std::shared_ptr<span_engine>(load(2, 4)), {.model = "m"}));
    client = start_node();
    auto pa = client->connect(a->endpoint());
    auto pb = client->connect(b->endpoint());
    REQUIRE(pa);
    REQUIRE(pb);
    a_id = *pa;
    b_id = *pb;
  }

  caf::expected<remote_message> call(const std::string& peer, const char* type, std::vector<std::uint8_t> body,
                                     std::vector<Tensor> tensors = {}) {
    return testing::span_call(*client, peer, type, std::move(body), std::move(tensors));
  }

  void open(const std::string& session) {
    REQUIRE(call(a_id, span_request::open, encode_body(span_open{session, 16})));
    REQUIRE(call(b_id, span_request::open, encode_body(span_open{session, 16})));
    REQUIRE(ref_a->open_session(session, 16));
    REQUIRE(ref_b->open_session(session, 16));
  }

  /// Waits (at most 5 s) until b has `n` steps waiting for a push.
  void wait_awaiting(std::uint32_t n) {
    for (int tries = 0; tries < 500; ++tries) {
      auto r = call(b_id, span_request::info, {});
      REQUIRE(r);
      auto info = decode_span_info(r->body);
      REQUIRE(info);
      if (info->awaiting_pushes == n) return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL("b never had " << n << " waiting step(s)");
  }

  /// The step for node a that pushes to b's `session`.
  span_step pushing(const std::string& session, std::int64_t start, std::uint64_t step_id) const {
    span_step s{.session_id = session, .start = start, .step_id = step_id};
    s.push_to = {b_id, b->endpoint(), "", session};
    return s;
  }
  /// The step for node b that waits for a's push.
  span_step awaiting(const std::string& session, std::int64_t start, std::uint64_t step_id,
                     std::uint32_t wait_ms = 5000) const {
    span_step s{.session_id = session, .start = start, .step_id = step_id};
    s.await_push = true;
    s.push_from = a_id;
    s.wait_ms = wait_ms;
    return s;
  }
};

/// Runs one pushed step: b's waiting request goes out first, then a's step.
/// Returns (a's answer, b's answer).
std::pair<caf::expected<remote_message>, caf::expected<remote_message>> pushed_step(push_fixture& f,
                                                                                 const std::string& session,
                                                                                 const Tensor& x, std::int64_t start,
                                                                                 std::uint64_t step_id) {
  caf::expected<remote_message> from_b{make_error(errc::peer_down, "no answer")};
  std::thread waiter([&] { from_b = f.call(f.b_id, span_request::step, encode_body(f.awaiting(session, start, step_id))); });
  f.wait_awaiting(1);  // b's request is waiting before the push comes
  auto from_a = f.call(f.a_id, span_request::step, encode_body(f.pushing(session, start, step_id)), {x});
  waiter.join();
  return {std::move(from_a), std::move(from_b)};
}

}  // namespace

TEST_CASE("a server pushes its output to the next server, which answers the client's waiting request") {
  push_fixture f;
  f.open("s");
  // The first step finds no link from a to b: a dials b and says so, and
  // the client carries that step to b itself.
  const Tensor x0 = random_rows(3, f.D, 1);
  auto first = f.call(f.a_id, span_request::step, encode_body(f.pushing("s", 0, 1)), {x0});
  REQUIRE_MESSAGE(first, error_message(first));
  auto done = decode_span_step_done(first->body);
  REQUIRE(done);
  CHECK_FALSE(done->pushed);
  CHECK(done->push_problem.find("no link") != std::string::npos);
  auto want_a = f.ref_a->inference_step("s", x0, 0, 1);
  REQUIRE(want_a);
  CHECK(same_bits(first->tensors.at(0), *want_a));
  auto carried = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "s", .start = 0, .step_id = 1}),
                        {first->tensors.at(0)});
  REQUIRE(carried);
  auto want_b = f.ref_b->inference_step("s", *want_a, 0, 1);
  REQUIRE(want_b);
  CHECK(same_bits(carried->tensors.at(0), *want_b));

  // Once a's link to b is up, the steps go a -> b directly, bit-exact.
  REQUIRE(testing::eventually([&] { return f.a->peer_is_up(f.b->id()); }, 20s));
  for (std::int64_t t = 3; t < 6; ++t) {
    const Tensor row = random_rows(1, f.D, 10 + static_cast<std::uint32_t>(t));
    const auto step_id = static_cast<std::uint64_t>(t);
    auto [from_a, from_b] = pushed_step(f, "s", row, t, step_id);
    REQUIRE_MESSAGE(from_a, error_message(from_a));
    REQUIRE_MESSAGE(from_b, error_message(from_b));
    auto d = decode_span_step_done(from_a->body);
    REQUIRE(d);
    CHECK_MESSAGE(d->pushed, d->push_problem);
    auto ra = f.ref_a->inference_step("s", row, t, step_id);
    REQUIRE(ra);
    auto rb = f.ref_b->inference_step("s", *ra, t, step_id);
    REQUIRE(rb);
    CHECK(same_bits(from_a->tensors.at(0), *ra));
    CHECK(same_bits(from_b->tensors.at(0), *rb));
  }

  // A push that arrives before the client's request waits for it.
  const Tensor row = random_rows(1, f.D, 77);
  auto early = f.call(f.a_id, span_request::step, encode_body(f.pushing("s", 6, 6)), {row});
  REQUIRE(early);
  std::this_thread::sleep_for(100ms);
  auto late = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 6, 6)));
  REQUIRE_MESSAGE(late, error_message(late));
  auto rb = f.ref_b->inference_step("s", *f.ref_a->inference_step("s", row, 6, 6), 6, 6);
  REQUIRE(rb);
  CHECK(same_bits(late->tensors.at(0), *rb));
}

TEST_CASE("a push from an unexpected node is dropped, a missing push times out, the client's own input supersedes the wait") {
  push_fixture f;
  f.open("s");
  const Tensor x = random_rows(2, f.D, 3);

  // A stranger pushes for b's session: dropped; the request times out.
  auto stranger = start_node();
  auto sb = stranger->connect(f.b->endpoint());
  REQUIRE(sb);
  {
    caf::expected<remote_message> r{make_error(errc::peer_down, "no answer")};
    std::thread waiter([&] { r = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 0, 1, 2000))); });
    f.wait_awaiting(1);
    auto target = stranger->remote_actor(*sb, "span");
    REQUIRE(target);
    remote_message push;
    push.type = span_request::push;
    push.body = encode_body(span_step{.session_id = "s", .start = 0, .step_id = 1});
    push.tensors = {x};
    caf::anon_send(*target, std::move(push));
    waiter.join();
    REQUIRE_FALSE(r);
    CHECK(error_code(r.error()) == "push_timeout");
    CHECK(error_message(r.error()).find(f.a_id) != std::string::npos);
  }
  // The client gives up waiting and sends the input itself.
  {
    caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
    std::thread waiter([&] { waiting = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 0, 2, 8000))); });
    f.wait_awaiting(1);
    auto direct = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "s", .start = 0, .step_id = 2}), {x});
    waiter.join();
    REQUIRE_MESSAGE(direct, error_message(direct));
    auto want = f.ref_b->inference_step("s", x, 0, 2);
    REQUIRE(want);
    CHECK(same_bits(direct->tensors.at(0), *want));
    REQUIRE_FALSE(waiting);
    CHECK(error_code(waiting.error()) == "superseded");
  }
  // Malformed waits are refused, and the session still serves.
  auto with_tensor = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 2, 3)), {x});
  REQUIRE_FALSE(with_tensor);
  CHECK(error_code(with_tensor.error()) == "bad_message");
  span_step no_source{.session_id = "s", .start = 2, .step_id = 4};
  no_source.await_push = true;
  auto nobody = f.call(f.b_id, span_request::step, encode_body(no_source));
  REQUIRE_FALSE(nobody);
  CHECK(error_code(nobody.error()) == "bad_message");
  auto more = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "s", .start = 2, .step_id = 5}),
                     {random_rows(1, f.D, 4)});
  CHECK_MESSAGE(more, error_message(more));
  // Closing the session ends a wait on it at once.
  caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
  std::thread waiter([&] { waiting = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 3, 6, 8000))); });
  f.wait_awaiting(1);
  REQUIRE(f.call(f.b_id, span_request::close, encode_close_body("s")));
  waiter.join();
  REQUIRE_FALSE(waiting);
  CHECK(error_code(waiting.error()) == "unknown_session");
  // A wait for a session that does not exist, or past its length, is
  // refused at once.
  auto unknown = f.call(f.b_id, span_request::step, encode_body(f.awaiting("nobody", 0, 1, 8000)));
  REQUIRE_FALSE(unknown);
  CHECK(error_code(unknown.error()) == "unknown_session");
}

TEST_CASE("a wait for a push from a server that goes down ends at once, not after waitMs") {
  push_fixture f;
  f.open("s");
  REQUIRE(f.a->connect(f.b->endpoint()));  // a is b's peer: its departure is seen
  caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] { waiting = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 0, 1, 20000))); });
  f.wait_awaiting(1);
  f.a->stop();  // a says goodbye to b: its push will never come
  waiter.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(waiting);
  CHECK(error_code(waiting.error()) == "push_source_down");
  CHECK(took < 15.0);  // not the 20 s wait
  // The client then carries the step itself.
  const Tensor x = testing::random_rows(1, f.D, 5);
  auto direct = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "s", .start = 0, .step_id = 1}), {x});
  REQUIRE_MESSAGE(direct, error_message(direct));
  auto want = f.ref_b->inference_step("s", x, 0, 1);
  REQUIRE(want);
  CHECK(same_bits(direct->tensors.at(0), *want));
}

TEST_CASE("a newer step of a session ends its older wait, and a late push for the older step is dropped") {
  push_fixture f;
  f.open("s");
  caf::expected<remote_message> old_wait{make_error(errc::peer_down, "no answer")};
  std::thread first([&] { old_wait = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 0, 1, 8000))); });
  f.wait_awaiting(1);
  // The client gave up on step 1 and waits for step 2 at the same position.
  caf::expected<remote_message> new_wait{make_error(errc::peer_down, "no answer")};
  std::thread second([&] { new_wait = f.call(f.b_id, span_request::step, encode_body(f.awaiting("s", 0, 2, 8000))); });
  first.join();
  REQUIRE_FALSE(old_wait);
  CHECK(error_code(old_wait.error()) == "superseded");
  f.wait_awaiting(1);
  // A late push for step 1 arrives first, then step 2's: only step 2 runs.
  auto to_b = f.a->remote_actor(f.b->id(), "span");
  for (int tries = 0; tries < 100 && !to_b; ++tries) {
    (void)f.a->connect(f.b->endpoint());
    to_b = f.a->remote_actor(f.b->id(), "span");
  }
  REQUIRE(to_b);
  const Tensor stale = testing::random_rows(2, f.D, 8), rows = testing::random_rows(2, f.D, 9);
  for (const auto& [id, x] : {std::pair<std::uint64_t, Tensor>{1, stale}, {2, rows}}) {
    remote_message push;
    push.type = span_request::push;
    push.body = encode_body(span_step{.session_id = "s", .start = 0, .step_id = id, .owner = f.client->id()});
    push.tensors = {x};
    caf::anon_send(*to_b, std::move(push));
  }
  second.join();
  REQUIRE_MESSAGE(new_wait, error_message(new_wait));
  auto want = f.ref_b->inference_step("s", rows, 0, 2);
  REQUIRE(want);
  CHECK(same_bits(new_wait->tensors.at(0), *want));
}


TEST_CASE("a session belongs to the node that opened it: another node's step and close are refused") {
  push_fixture f;
  f.open("owned");
  // Server a learns b's session id from every pushing step; here a plain
  // node plays a peer that learnt it and tries to use the session.
  auto stranger = start_node();
  auto to_b = stranger->connect(f.b->endpoint());
  REQUIRE(to_b);
  auto stranger_call = [&](const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    remote_message m;
    m.type = type;
    m.body = std::move(body);
    m.tensors = std::move(tensors);
    return stranger->request(*to_b, "span", std::move(m), 10s);
  };
  auto refused = [](const caf::expected<remote_message>& r) {
    REQUIRE_FALSE(r);
    CHECK(error_code(r.error()) == "not_owner");
    CHECK(error_message(r.error()).find("owned") != std::string::npos);
  };
  const Tensor x = random_rows(2, f.D, 5);
  refused(stranger_call(span_request::step, encode_body(span_step{.session_id = "owned", .start = 0, .step_id = 1}), {x}));
  span_step wait = f.awaiting("owned", 0, 1, 100);
  refused(stranger_call(span_request::step, encode_body(wait)));
  refused(stranger_call(span_request::close, encode_close_body("owned")));

  // The owner's session is untouched: empty, open, and its steps equal the reference's.
  auto info = f.call(f.b_id, span_request::info, {});
  REQUIRE(info);
  auto i = decode_span_info(info->body);
  REQUIRE(i);
  CHECK(i->sessions == 1);
  auto mine = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "owned", .start = 0, .step_id = 1}), {x});
  REQUIRE_MESSAGE(mine, error_message(mine));
  auto want = f.ref_b->inference_step("owned", x, 0, 1);
  REQUIRE(want);
  CHECK(same_bits(mine->tensors.at(0), *want));
  // A session id nobody opened still gets the usual answer, and the owner may close.
  auto none = stranger_call(span_request::step, encode_body(span_step{.session_id = "nobody", .start = 0, .step_id = 1}), {x});
  REQUIRE_FALSE(none);
  CHECK(error_code(none.error()) == "unknown_session");
  REQUIRE(f.call(f.b_id, span_request::close, encode_close_body("owned")));
  // Once closed, the id is free again, for anyone.
  REQUIRE(stranger_call(span_request::open, encode_body(span_open{"owned", 16})));
}

namespace {

/// span.step for a, posted (one-way, with the trail), as a client does.
void post_to_a(push_fixture& f, const std::string& session, const Tensor& x, std::int64_t start, std::uint64_t step_id) {
  span_step st = f.pushing(session, start, step_id);
  st.trail = true;
  remote_message m;
  m.type = span_request::step;
  m.body = encode_body(st);
  m.tensors = {x};
  REQUIRE_FALSE(f.client->post(f.a_id, "span", std::move(m)));
}

span_step trailing(span_step s) {
  s.trail = true;
  return s;
}

}  // namespace

TEST_CASE("a posted route: a answers nothing, b answers its output and its input, bit-exact") {
  push_fixture f;
  f.open("s");
  // Without a link from a, b refuses a posted wait at once: a could not
  // push, and on a posted route it could not tell the client either.
  auto no_link = f.call(f.b_id, span_request::step, encode_body(trailing(f.awaiting("s", 0, 1, 20000))));
  REQUIRE_FALSE(no_link);
  CHECK(error_code(no_link.error()) == "push_source_down");
  REQUIRE(f.a->connect(f.b->endpoint()));
  for (std::int64_t t = 0; t < 4; ++t) {
    const Tensor row = random_rows(1, f.D, 20 + static_cast<std::uint32_t>(t));
    const auto step_id = static_cast<std::uint64_t>(t + 2);
    caf::expected<remote_message> from_b{make_error(errc::peer_down, "no answer")};
    if (t % 2 == 0) {  // the push waits for b's request
      post_to_a(f, "s", row, t, step_id);
      from_b = f.call(f.b_id, span_request::step, encode_body(trailing(f.awaiting("s", t, step_id))));
    } else {  // b's request waits for the push
      std::thread waiter(
          [&] { from_b = f.call(f.b_id, span_request::step, encode_body(trailing(f.awaiting("s", t, step_id)))); });
      f.wait_awaiting(1);
      post_to_a(f, "s", row, t, step_id);
      waiter.join();
    }
    REQUIRE_MESSAGE(from_b, error_message(from_b));
    auto ra = f.ref_a->inference_step("s", row, t, step_id);
    REQUIRE(ra);
    auto rb = f.ref_b->inference_step("s", *ra, t, step_id);
    REQUIRE(rb);
    REQUIRE(from_b->tensors.size() == 2);
    CHECK(same_bits(from_b->tensors[0], *rb));
    CHECK(same_bits(from_b->tensors[1], *ra));  // what a pushed: b's input
    // The client's fallback after a posted step: a repeats its stored
    // answer for the same step, without computing it again.
    if (t == 3) {
      auto again = f.call(f.a_id, span_request::step, encode_body(span_step{.session_id = "s", .start = t, .step_id = step_id}),
                          {row});
      REQUIRE_MESSAGE(again, error_message(again));
      REQUIRE(again->tensors.size() == 1);
      CHECK(same_bits(again->tensors[0], *ra));
    }
  }
}

TEST_CASE("a step that fails upstream on a posted route fails the next hop's waiting step at once") {
  push_fixture f;
  f.open("s");
  REQUIRE(f.a->connect(f.b->endpoint()));
  caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter(
      [&] { waiting = f.call(f.b_id, span_request::step, encode_body(trailing(f.awaiting("s", 0, 1, 20000)))); });
  f.wait_awaiting(1);
  // a's session holds no tokens: a step from position 5 is refused there,
  // and a tells b, whose wait ends now, not after 20 s.
  post_to_a(f, "s", random_rows(1, f.D, 3), 5, 1);
  waiter.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(waiting);
  CHECK(error_code(waiting.error()) == "upstream_failed");
  CHECK(error_message(waiting.error()).find(f.a_id) != std::string::npos);
  CHECK(took < 10.0);
  // The session at b is untouched: the client carries the step.
  const Tensor x = random_rows(1, f.D, 4);
  auto direct = f.call(f.b_id, span_request::step, encode_body(span_step{.session_id = "s", .start = 0, .step_id = 1}), {x});
  REQUIRE_MESSAGE(direct, error_message(direct));
  auto want = f.ref_b->inference_step("s", x, 0, 1);
  REQUIRE(want);
  CHECK(same_bits(direct->tensors.at(0), *want));
}

TEST_CASE("a push computed for another node's step never feeds it") {
  push_fixture f;
  f.open("s");
  REQUIRE(f.a->connect(f.b->endpoint()));
  // A stranger with a session of its own on a names the owner's session on
  // b as its push target, with the step id the owner's step waits for.
  auto stranger = start_node();
  auto to_a = stranger->connect(f.a->endpoint());
  REQUIRE(to_a);
  auto stranger_call = [&](const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    remote_message m;
    m.type = type;
    m.body = std::move(body);
    m.tensors = std::move(tensors);
    return stranger->request(*to_a, "span", std::move(m), 10s);
  };
  REQUIRE(stranger_call(span_request::open, encode_body(span_open{"mine", 16})));
  for (const bool posted : {false, true}) {
    CAPTURE(posted);
    const std::uint64_t step_id = posted ? 2 : 1;
    caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
    std::thread waiter([&] {
      span_step w = f.awaiting("s", 0, step_id, 2000);
      w.trail = posted;
      waiting = f.call(f.b_id, span_request::step, encode_body(w));
    });
    f.wait_awaiting(1);
    span_step st = f.pushing("s", 0, step_id);
    st.session_id = "mine";
    st.trail = posted;
    auto pushed = stranger_call(span_request::step, encode_body(st), {random_rows(1, f.D, 9)});
    REQUIRE_MESSAGE(pushed, error_message(pushed));
    auto d = decode_span_step_done(pushed->body);
    REQUIRE(d);
    CHECK(d->pushed);  // a pushed it, for the stranger's step ...
    waiter.join();
    REQUIRE_FALSE(waiting);  // ... and b did not take it for the owner's
    CHECK(error_code(waiting.error()) == "push_timeout");
  }
  // A failure notice for the stranger's step does not end the owner's wait either.
  caf::expected<remote_message> waiting{make_error(errc::peer_down, "no answer")};
  std::thread waiter([&] { waiting = f.call(f.b_id, span_request::step, encode_body(trailing(f.awaiting("s", 0, 3, 2000)))); });
  f.wait_awaiting(1);
  span_step bad = trailing(f.pushing("s", 7, 3));
  bad.session_id = "mine";
  auto refused = stranger_call(span_request::step, encode_body(bad), {random_rows(1, f.D, 9)});
  REQUIRE_FALSE(refused);
  waiter.join();
  REQUIRE_FALSE(waiting);
  CHECK(error_code(waiting.error()) == "push_timeout");
}

}  // namespace corolla
