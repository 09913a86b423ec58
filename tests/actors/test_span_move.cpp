// A span server that moves to other blocks (swap_span_engine) keeps serving
// the sessions opened before the move on the old blocks, bit-exact, while
// new sessions open on the new ones; the old blocks go when the last old
// session ends.
#include <doctest/doctest.h>

#include <memory>

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

TEST_CASE("a span server that moves keeps its open sessions on the old blocks and opens new ones on the new") {
  testing::temp_dir_guard dir("span-move");
  testing::tiny_model_options o;
  o.layers = 4;
  testing::write_tiny_model(dir.path(), o);
  const checkpoint ck = checkpoint::open(dir.path());
  const model_config cfg = load_config(dir.path());
  auto load = [&](int first, int last) {
    return std::make_shared<span_engine>(span_engine::load(ck, cfg, first, last, cpu_backend(), 256));
  };
  span_engine reference = span_engine::load(ck, cfg, 0, 4, cpu_backend(), 256);

  auto server_node = start_node();
  auto server = start_span_server(*server_node, load(0, 4), {.model = "m"});
  REQUIRE(server);
  auto client = start_node();
  auto peer = client->connect(server_node->endpoint());
  REQUIRE(peer);
  auto call = [&](const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    remote_message m;
    m.type = type;
    m.body = std::move(body);
    m.tensors = std::move(tensors);
    return client->request(*peer, "span", std::move(m), 10s);
  };
  const std::int64_t D = cfg.hidden_size;

  REQUIRE(call(span_request::open, encode_body(span_open{"old", 16})));
  REQUIRE(reference.open_session("old", 16));
  const Tensor prompt = random_rows(3, D, 1);
  auto first = call(span_request::step, encode_body(span_step{"old", 0}), {prompt});
  REQUIRE_MESSAGE(first, error_message(first));
  auto want_first = reference.inference_step("old", prompt, 0);
  REQUIRE(want_first);
  CHECK(same_bits(first->tensors.at(0), *want_first));

  // The server moves to blocks [2, 4).
  REQUIRE_FALSE(swap_span_engine(server_node->system(), *server, load(2, 4)));
  auto info = call(span_request::info, {});
  REQUIRE(info);
  auto i = decode_span_info(info->body);
  REQUIRE(i);
  CHECK(i->first == 2);
  CHECK(i->last == 4);

  // The old session goes on through all four old blocks, bit-exact.
  for (int t = 3; t < 6; ++t) {
    const Tensor row = random_rows(1, D, 10 + static_cast<std::uint32_t>(t));
    auto got = call(span_request::step, encode_body(span_step{"old", t}), {row});
    REQUIRE_MESSAGE(got, error_message(got));
    auto want = reference.inference_step("old", row, t);
    REQUIRE(want);
    CHECK(same_bits(got->tensors.at(0), *want));
  }
  // A new session opens on the new blocks and runs two of them.
  REQUIRE(call(span_request::open, encode_body(span_open{"new", 16})));
  span_engine new_reference = span_engine::load(ck, cfg, 2, 4, cpu_backend(), 256);
  REQUIRE(new_reference.open_session("new", 16));
  const Tensor x = random_rows(2, D, 99);
  auto got = call(span_request::step, encode_body(span_step{"new", 0}), {x});
  REQUIRE_MESSAGE(got, error_message(got));
  auto want = new_reference.inference_step("new", x, 0);
  REQUIRE(want);
  CHECK(same_bits(got->tensors.at(0), *want));
  // Closing the last old session releases the old blocks; the old session
  // is gone then, the new one goes on.
  REQUIRE(call(span_request::close, encode_close_body("old")));
  auto gone = call(span_request::step, encode_body(span_step{"old", 6}), {random_rows(1, D, 5)});
  REQUIRE_FALSE(gone);
  CHECK(error_code(gone.error()) == "unknown_session");
  CHECK(call(span_request::step, encode_body(span_step{"new", 2}), {random_rows(1, D, 6)}));
}

}  // namespace corolla
