// The span server's decode batches (actors/span_server.cpp with
// schedule/decode_gathering.hpp): a queue of one-row steps waits for the
// sessions of the last batches whose next step is still on its way and runs
// as one batch as soon as the last of them is queued; it gives up after the
// policy's wait, stops waiting for sessions that stopped stepping, and never
// waits for a closed session. Answers equal the engine's own steps.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

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
namespace {

using testing::random_rows;
using testing::start_node;

/// A span server over the tiny model's 2 blocks with gathering `policy`, a
/// client node, and a reference engine.
struct batching_fixture {
  testing::temp_dir_guard dir{"span-batching"};
  model_config cfg;
  std::unique_ptr<span_engine> reference;
  std::mutex reference_mu;
  std::unique_ptr<node> server_node, client;
  caf::actor server;
  std::string peer;

  explicit batching_fixture(swarm::gathering_policy policy) {
    testing::write_tiny_model(dir.path(), {});
    const checkpoint ck = checkpoint::open(dir.path());
    cfg = load_config(dir.path());
    reference = std::make_unique<span_engine>(span_engine::load(ck, cfg, 0, cfg.n_layers, cpu_backend(), 256));
    server_node = start_node();
    auto s = start_span_server(*server_node,
                               std::make_shared<span_engine>(span_engine::load(ck, cfg, 0, cfg.n_layers, cpu_backend(), 256)),
                               {.model = "m", .gathering = policy});
    REQUIRE(s);
    server = *s;
    client = start_node();
    auto p = client->connect(server_node->endpoint());
    REQUIRE(p);
    peer = *p;
  }

  caf::expected<remote_message> call(const char* type, std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {}) {
    return testing::span_call(*client, peer, type, std::move(body), std::move(tensors), 20s);
  }

  /// Opens `id` here and on the reference, and prefills 2 rows.
  void open(const std::string& id) {
    REQUIRE(call(span_request::open, encode_body(span_open{id, 32})));
    REQUIRE(reference->open_session(id, 32));
    const Tensor rows = random_rows(2, cfg.hidden_size, 7);
    REQUIRE(call(span_request::step, encode_body(span_step{id, 0}), {rows}));
    REQUIRE(reference->inference_step(id, rows, 0));
  }

  /// A one-row step of `id` at `start`, checked against the reference.
  void step(const std::string& id, std::int64_t start, std::uint32_t seed) {
    const Tensor row = random_rows(1, cfg.hidden_size, seed);
    auto got = call(span_request::step, encode_body(span_step{id, start}), {row});
    REQUIRE_MESSAGE(got, error_message(got));
    // The reference engine is not thread-safe: step_both's two threads take turns.
    std::unique_lock lock(reference_mu);
    auto want = reference->inference_step(id, row, start);
    lock.unlock();
    REQUIRE(want);
    const Tensor& out = got->tensors.at(0);
    REQUIRE(out.shape() == want->shape());
    for (std::int64_t i = 0; i < out.numel(); ++i)
      REQUIRE(std::abs(out.data<float>()[i] - want->data<float>()[i]) <= 1e-4f * (1 + std::abs(want->data<float>()[i])));
  }

  /// Sessions a and b step at position 2 at the same time.
  void step_both() {
    auto b = std::async(std::launch::async, [&] { step("b", 2, 21); });
    step("a", 2, 11);
    b.get();
  }

  span_server_stats stats() {
    auto s = span_server_stats_of(server_node->system(), server, 10s);
    REQUIRE(s);
    return *s;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a decode batch waits for the last batch's other session and runs when its step comes") {
  // Waits bounded by the cap only (a tiny model's batch takes microseconds).
  batching_fixture f({.wait_fraction = 1e9, .max_wait = 5s, .remember_batches = 2});
  f.open("a");
  f.open("b");
  // Both sessions step together once: a batch with a and b in it, or two
  // (then the second waited up to the cap for the first one's session,
  // whose next step does not come here).
  f.step_both();
  const span_server_stats before = f.stats();
  // a steps alone; b's step comes 300 ms after the server began waiting
  // for it (not after a fixed time: on a busy machine a's request may take
  // that long to arrive): a's waited for it, and both ran as one batch.
  const auto t0 = std::chrono::steady_clock::now();
  auto a = std::async(std::launch::async, [&] {
    f.step("a", 3, 12);
    return seconds_since(t0);
  });
  for (int tries = 0; f.stats().decode_waits == before.decode_waits; ++tries) {
    REQUIRE_MESSAGE(tries < 400, "the server never began waiting for b");  // 4 s, within the 5 s cap
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(300ms);
  f.step("b", 3, 22);
  CHECK(a.get() >= 0.29);
  const span_server_stats after = f.stats();
  CHECK(after.decode_steps - before.decode_steps == 2);
  CHECK(after.decode_batches - before.decode_batches == 1);
  CHECK(after.decode_waits - before.decode_waits == 1);
  // Closed, b is not waited for: a's steps run alone, at once.
  REQUIRE(f.call(span_request::close, encode_close_body("b")));
  f.step("a", 4, 13);
  f.step("a", 5, 14);
  CHECK(f.stats().decode_waits == after.decode_waits);
  CHECK(f.stats().decode_batches - after.decode_batches == 2);
}

TEST_CASE("a decode batch gives up after the policy's wait, and stops waiting for a session that stopped") {
  batching_fixture f({.wait_fraction = 1e9, .max_wait = 200ms, .remember_batches = 2});
  f.open("a");
  f.open("b");
  f.step_both();
  // step_both may run as one batch or two, in either order (a busy machine
  // decides); b then steps alone (waiting the cap for a), so the last batch
  // remembered is b's whatever step_both did.
  f.step("b", 3, 22);
  const std::uint64_t waits = f.stats().decode_waits;
  // b never steps again: a's next steps wait for it until it drops out of
  // the two batches remembered, each wait the cap.
  for (int t = 0; t < 4; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    f.step("a", 3 + t, 12 + static_cast<std::uint32_t>(t));
    const double took = seconds_since(t0);
    const std::uint64_t now = f.stats().decode_waits;
    MESSAGE("step " << t << ": " << took << " s, waits " << now - waits);
    if (t == 0) CHECK(took >= 0.19);
  }
  // The first two steps waited (b was in one of the two batches
  // remembered), none after b dropped out.
  CHECK(f.stats().decode_waits - waits == 2);
}

}  // namespace corolla
