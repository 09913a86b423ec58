// span.open with shareFrom: a server starts a new session on the KV pages of
// another session of the same node (span_engine::share_prefix), answers how
// many tokens it holds, and the new session's steps equal those of a session
// that computed the prefix itself, bit for bit, while the other session goes
// on unchanged. Another node's session, an unknown one, or one over other
// blocks shares nothing (and tells nothing about it). A session closed with
// `keep` is parked: no more steps, but later sessions start on its pages
// until the server needs them.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>

#include "actors/corolla.hpp"
#include "actors/span_server.hpp"
#include "actors/swarm_wire.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "tests/actors/span_test_util.hpp"
#include "tests/support/tiny_model.hpp"

using namespace std::chrono_literals;

namespace corolla {

using testing::random_rows;
using testing::same_bits;
using testing::start_node;

namespace {

/// A span server over blocks [0, 4) on node `server`, a client node, and a
/// reference engine over the same blocks.
struct share_fixture {
  testing::temp_dir_guard dir{"span-share"};
  model_config cfg;
  std::unique_ptr<span_engine> ref;
  std::unique_ptr<node> server, client;
  std::string server_id;
  caf::actor actor;  ///< the span server
  std::int64_t D = 0;

  explicit share_fixture(std::int64_t cache_tokens = 256) {
    testing::tiny_model_options o;
    o.layers = 4;
    testing::write_tiny_model(dir.path(), o);
    const checkpoint ck = checkpoint::open(dir.path());
    cfg = load_config(dir.path());
    D = cfg.hidden_size;
    auto load = [&] { return std::make_unique<span_engine>(span_engine::load(ck, cfg, 0, 4, cpu_backend(), cache_tokens)); };
    ref = load();
    server = start_node();
    auto started = start_span_server(*server, std::shared_ptr<span_engine>(load()), {.model = "m"});
    REQUIRE(started);
    actor = *started;
    client = start_node();
    auto p = client->connect(server->endpoint());
    REQUIRE(p);
    server_id = *p;
  }

  std::map<node*, std::string> peers;  ///< the server's id as each other node knows it

  caf::expected<remote_message> call(node& from, const char* type, std::vector<std::uint8_t> body,
                                     std::vector<Tensor> tensors = {}) {
    if (&from == client.get()) return testing::span_call(from, server_id, type, std::move(body), std::move(tensors));
    if (!peers.count(&from)) {
      auto p = from.connect(server->endpoint());
      REQUIRE(p);
      peers[&from] = *p;
    }
    return testing::span_call(from, peers[&from], type, std::move(body), std::move(tensors));
  }
  /// Opens `session` from `from`, sharing `tokens` of `share_from` ("" =
  /// none); returns the tokens the server says it holds.
  std::int64_t open(node& from, const std::string& session, const std::string& share_from = "",
                    std::int64_t tokens = 0) {
    span_open o{session, 48};
    o.share_from = share_from;
    o.share_tokens = tokens;
    auto r = call(from, span_request::open, encode_body(o));
    REQUIRE_MESSAGE(r, error_message(r));
    auto info = decode_span_info(r->body);
    REQUIRE(info);
    return info->shared_tokens;
  }
  Tensor step(node& from, const std::string& session, const Tensor& x, std::int64_t start, std::uint64_t id) {
    auto r = call(from, span_request::step, encode_body(span_step{.session_id = session, .start = start, .step_id = id}), {x});
    REQUIRE_MESSAGE(r, error_message(r));
    return r->tensors.at(0);
  }
  caf::expected<remote_message> close(const std::string& session, bool keep) {
    return call(*client, span_request::close, encode_close_body(session, keep));
  }
  span_info info() {
    auto r = call(*client, span_request::info, {});
    REQUIRE(r);
    auto i = decode_span_info(r->body);
    REQUIRE(i);
    return *i;
  }
  span_server_stats stats() {
    auto s = span_server_stats_of(server->system(), actor);
    REQUIRE(s);
    return *s;
  }
  Tensor ref_step(const std::string& session, const Tensor& x, std::int64_t start) {
    auto r = ref->inference_step(session, x, start);
    REQUIRE(r);
    return *r;
  }
};

}  // namespace

TEST_CASE("a session opened on another's first tokens steps as one that computed them, and the other goes on unchanged") {
  share_fixture f;
  const Tensor prefix = random_rows(20, f.D, 1), a_more = random_rows(3, f.D, 2), b_more = random_rows(4, f.D, 3);
  // a: the prefix (20 tokens: a whole page and 4 in the next), then 3 more.
  CHECK(f.open(*f.client, "a") == 0);
  f.step(*f.client, "a", prefix, 0, 1);
  f.step(*f.client, "a", a_more, 20, 2);
  // b starts on a's first 20 tokens: the server says so, and b's next
  // step is what a session that computed them gives.
  CHECK(f.open(*f.client, "b", "a", 20) == 20);
  REQUIRE(f.ref->open_session("twin", 48));
  f.ref_step("twin", prefix, 0);
  CHECK(same_bits(f.step(*f.client, "b", b_more, 20, 3), f.ref_step("twin", b_more, 20)));
  // a's own tokens 20-22 were not overwritten by b's: its next step is its
  // reference's.
  REQUIRE(f.ref->open_session("a-twin", 48));
  f.ref_step("a-twin", prefix, 0);
  f.ref_step("a-twin", a_more, 20);
  const Tensor next = random_rows(1, f.D, 4);
  CHECK(same_bits(f.step(*f.client, "a", next, 23, 4), f.ref_step("a-twin", next, 23)));
  // A request for more than a holds gets what it holds; the server counts both.
  CHECK(f.open(*f.client, "c", "a", 1000) == 24);
  auto info = f.call(*f.client, span_request::info, {});
  REQUIRE(info);
  auto i = decode_span_info(info->body);
  REQUIRE(i);
  CHECK(i->sessions == 3);
  auto stats = span_server_stats_of(f.server->system(), f.actor);
  REQUIRE(stats);
  CHECK(stats->sessions_shared == 2);
  CHECK(stats->shared_tokens == 20 + 24);
  // b rolls back into the page it shares with a and c: b writes its own
  // copy, as its twin rolling back over its own page does, and a's next
  // answer stays its reference's.
  REQUIRE(f.ref->open_session("b-twin", 48));
  f.ref_step("b-twin", prefix, 0);
  const Tensor redo = b_more.slice(0, 2);
  CHECK(same_bits(f.step(*f.client, "b", redo, 10, 5), f.ref_step("b-twin", redo, 10)));
  const Tensor after = random_rows(1, f.D, 6);
  CHECK(same_bits(f.step(*f.client, "a", after, 24, 6), f.ref_step("a-twin", after, 24)));
}

TEST_CASE("a server shares no session of another node, none it does not know, and none over other blocks") {
  share_fixture f;
  const Tensor prefix = random_rows(20, f.D, 1);
  CHECK(f.open(*f.client, "mine") == 0);
  f.step(*f.client, "mine", prefix, 0, 1);
  // A stranger naming the client's session: opened, nothing shared, and
  // the same answer as for a session that does not exist.
  auto stranger = start_node();
  CHECK(f.open(*stranger, "theirs", "mine", 20) == 0);
  CHECK(f.open(*stranger, "theirs-2", "nobody", 20) == 0);
  // Its session computes from position 0 as any other.
  REQUIRE(f.ref->open_session("twin", 48));
  CHECK(same_bits(f.step(*stranger, "theirs", prefix, 0, 2), f.ref_step("twin", prefix, 0)));
  // The owner's session over other blocks than the new one's: nothing.
  span_open other{"part", 48, 0, 2};
  other.share_from = "mine";
  other.share_tokens = 20;
  auto r = f.call(*f.client, span_request::open, encode_body(other));
  REQUIRE(r);
  CHECK(decode_span_info(r->body)->shared_tokens == 0);
  // A share count without a session to share from is a malformed request.
  span_open bad{"bad", 48};
  bad.share_tokens = 5;
  auto refused = f.call(*f.client, span_request::open, encode_body(bad));
  REQUIRE_FALSE(refused);
  CHECK(error_message(refused.error()).find("without a session to share from") != std::string::npos);
}

TEST_CASE("a parked session takes no steps, serves shareFrom, and is the first memory the server takes back") {
  share_fixture f(128);  // 8 pages a block
  const Tensor prompt = random_rows(40, f.D, 1), more = random_rows(3, f.D, 2);
  CHECK(f.open(*f.client, "turn-1") == 0);
  f.step(*f.client, "turn-1", prompt, 0, 1);
  REQUIRE(f.close("turn-1", true));
  // Parked: not an open session any more, no steps; its owner's next
  // session starts on it, and steps as one that computed the 40 tokens.
  CHECK(f.info().sessions == 0);
  auto refused = f.call(*f.client, span_request::step,
                        encode_body(span_step{.session_id = "turn-1", .start = 40, .step_id = 2}), {more});
  REQUIRE_FALSE(refused);
  CHECK(error_code(refused.error()) == "unknown_session");
  // Its pages count as free for a new session (taken back when needed).
  CHECK(f.info().cache_tokens_left == 128);
  CHECK(f.open(*f.client, "turn-2", "turn-1", 40) == 40);
  REQUIRE(f.ref->open_session("twin", 48));
  f.ref_step("twin", prompt, 0);
  CHECK(same_bits(f.step(*f.client, "turn-2", more, 40, 3), f.ref_step("twin", more, 40)));
  // Now turn-2 holds turn-1's two whole pages too: only turn-1's copied
  // last page would come back (turn-2's copy of it holds 43 tokens).
  CHECK(f.info().cache_tokens_left == 128 - 48);
  CHECK(f.stats().sessions_parked == 1);
  CHECK(f.stats().sessions_parked_now == 1);
  REQUIRE(f.close("turn-2", false));

  // A step that needs the parked pages takes them back: turn-1 holds 48
  // of the 128 tokens (3 pages a block); "big" takes 48 more, then "big-2"
  // needs 40 rows and a page more than the 32 left.
  CHECK(f.open(*f.client, "big") == 0);
  f.step(*f.client, "big", random_rows(48, f.D, 3), 0, 4);
  CHECK(f.stats().parked_closed == 0);
  CHECK(f.open(*f.client, "big-2") == 0);
  REQUIRE(f.ref->open_session("big-twin", 48));
  const Tensor rows = random_rows(40, f.D, 4);
  CHECK(same_bits(f.step(*f.client, "big-2", rows, 0, 5), f.ref_step("big-twin", rows, 0)));
  CHECK(f.stats().parked_closed == 1);
  CHECK(f.stats().sessions_parked_now == 0);
  CHECK(f.open(*f.client, "late", "turn-1", 40) == 0);  // gone: nothing to start on

  // Parked sessions hold at most half the budget: parking a second one of
  // 3 pages closes the first at once.
  REQUIRE(f.close("big", true));
  CHECK(f.stats().sessions_parked_now == 1);
  REQUIRE(f.close("big-2", true));
  CHECK(f.stats().parked_closed == 2);
  CHECK(f.stats().sessions_parked_now == 1);
  CHECK(f.open(*f.client, "after", "big-2", 40) == 40);
  // A step nobody could run (an id never opened, however long) takes
  // nothing back.
  auto stranger_first = start_node();
  auto sp = stranger_first->connect(f.server->endpoint());
  REQUIRE(sp);
  auto bogus = testing::span_call(*stranger_first, *sp, span_request::step,
                                  encode_body(span_step{.session_id = "nobody", .start = 0, .step_id = 1}),
                                  {random_rows(200, f.D, 5)});
  REQUIRE_FALSE(bogus);
  CHECK(f.stats().sessions_parked_now == 1);
  // An empty session is closed, not parked (nothing could start on it);
  // closing a parked one counts once.
  const auto closed = f.stats().sessions_closed;
  CHECK(f.open(*f.client, "empty") == 0);
  REQUIRE(f.close("empty", true));
  CHECK(f.stats().sessions_parked_now == 1);
  CHECK(f.stats().sessions_closed == closed + 1);
  REQUIRE(f.close("big-2", false));
  CHECK(f.stats().sessions_parked_now == 0);
  CHECK(f.stats().sessions_closed == closed + 1);
  CHECK(f.open(*f.client, "after-2", "big-2", 40) == 0);
  // Another node cannot park (or close) the client's session.
  auto stranger = start_node();
  auto p = stranger->connect(f.server->endpoint());
  REQUIRE(p);
  auto theirs = testing::span_call(*stranger, *p, span_request::close, encode_close_body("after", true));
  REQUIRE_FALSE(theirs);
  CHECK(error_code(theirs.error()) == "not_owner");
}

}  // namespace corolla
