// The local decode batcher (actors/decode_batcher.hpp): generations on many
// threads at once get the tokens a generator gives each alone (f32, int8
// weights, a bf16 KV cache; llama and GPT-2; batches capped in rows), while
// their steps, prompts included, run as batches; a bad request fails alone, a full KV cache is a clear
// error, and every session is closed whatever happened.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/decode_batcher.hpp"
#include "kernels/backend.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/transformer.hpp"
#include "tests/support/batcher_start.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
namespace {

struct batcher_fixture {
  testing::temp_dir_guard dir{"decode-batcher"};
  transformer model;
  caf::actor_system_config config;
  caf::actor_system system{config};

  explicit batcher_fixture(architecture arch = architecture::llama) : model(load(dir.path(), arch)) {}

  static transformer load(const std::filesystem::path& dir, architecture arch) {
    testing::write_tiny_model(dir, testing::tiny_options_for(arch));
    return transformer::load(dir, cpu_backend());
  }

  /// An engine over every block with room for `cache_tokens` tokens.
  span_engine engine(std::int64_t cache_tokens, weight_format w = weight_format::f32, dtype kv = dtype::f32) {
    span_engine_options o;
    o.weights = w;
    o.kv_dtype = kv;
    o.cache_allocation = kv_allocation::lazy;
    return span_engine(model.decoding_stage(), cache_tokens, o);
  }
  head model_head(weight_format w = weight_format::f32) {
    head h(model.config(), model.head(), model.backend());
    h.use_inference_weights(w);
    return h;
  }
};

generation_params greedy(int n) {
  generation_params p;
  p.max_new_tokens = n;
  p.ignore_eos = true;
  return p;
}

/// A policy under which a batch waits for every generation of the last
/// batches that is still running (as long as it takes, within reason): the
/// test then sees batches whatever the machine's load.
swarm::gathering_policy patient() {
  swarm::gathering_policy g;
  g.wait_fraction = 1e6;
  g.max_wait = std::chrono::seconds(5);
  return g;
}

const std::vector<std::vector<std::int32_t>> kPrompts = {
    {1, 2, 3}, {7}, {10, 20, 30, 40, 50, 60, 7}, {5, 5, 5, 9, 33}};

}  // namespace

TEST_CASE("concurrent generations through the batcher equal a generator's, their steps batched") {
  struct variant {
    const char* name;
    architecture arch;
    weight_format weights;
    dtype kv;
    std::int64_t max_rows = 2048;
  };
  for (const variant v : {variant{"llama f32", architecture::llama, weight_format::f32, dtype::f32},
                          variant{"gpt2 f32", architecture::gpt2, weight_format::f32, dtype::f32},
                          variant{"llama int8, bf16 cache", architecture::llama, weight_format::int8, dtype::bf16},
                          // Batches of at most 4 rows: the 7-token prompt runs alone, the others share.
                          variant{"llama f32, 4 rows a batch", architecture::llama, weight_format::f32, dtype::f32, 4}}) {
    CAPTURE(v.name);
    batcher_fixture f(v.arch);
    constexpr int kNew = 20;
    std::vector<std::vector<std::int32_t>> alone;
    {
      generator gen(f.model, 0, v.weights, v.kv);
      for (const auto& p : kPrompts) alone.push_back(gen.generate(p, greedy(kNew)).tokens);
    }
    decode_batcher b(f.system, f.engine(4 * 64, v.weights, v.kv), f.model_head(v.weights), {patient(), v.max_rows});
    // Twice over: the second round starts with the first round's
    // generations forgotten (closed), so nothing waits for them.
    for (int round = 0; round < 2; ++round) {
      std::vector<std::future<generation_result>> runs;
      // The round's four generations decode together (max_batch below).
      const token_callback hold = testing::hold_until_opened(b, 4 * (round + 1));
      for (const auto& p : kPrompts)
        runs.push_back(std::async(std::launch::async, [&b, &p, hold] { return b.generate(p, greedy(kNew), hold).result; }));
      for (std::size_t i = 0; i < runs.size(); ++i) {
        CAPTURE(i);
        const generation_result r = runs[i].get();
        CHECK(r.tokens == alone[i]);
        CHECK(r.decode_steps == kNew - 1);
        CHECK(r.prompt_tokens == static_cast<int>(kPrompts[i].size()));
      }
    }
    const decode_batcher_stats s = b.stats();
    CHECK(s.sessions_opened == 8);
    CHECK(s.sessions_closed == 8);
    CHECK(s.steps == 8 * kNew);
    CHECK(s.prefill_steps + s.decode_steps == s.steps);  // a one-token prompt is a decode step
    CHECK(s.prefill_steps == 6);
    CHECK(s.prefill_tokens == 2 * (3 + 7 + 5));
    CHECK(s.step_errors == 0);
    // Steps ran together: fewer batches than steps, and some held all four.
    CHECK(s.batches < s.steps);
    CHECK(s.max_batch == 4);
    CHECK(s.mean_batch() > 1.5);
  }
}

TEST_CASE("a bad request or a full cache fails alone, and its session is closed") {
  batcher_fixture f;
  // One page of 16 tokens per block: room for one short generation.
  decode_batcher b(f.system, f.engine(16), f.model_head());
  CHECK_THROWS_WITH_AS(b.generate({{1, 64}}, greedy(4)), doctest::Contains("outside the vocabulary"), model_error);
  CHECK_THROWS_WITH_AS(b.generate({}, greedy(4)), doctest::Contains("empty"), model_error);
  // 20 tokens of prompt do not fit in 16.
  std::vector<std::int32_t> long_prompt(20, 3);
  CHECK_THROWS_WITH_AS(b.generate(long_prompt, greedy(4)), doctest::Contains("KV cache full"), model_error);
  // Generation runs into the full cache after a few tokens: the tokens so
  // far are lost with the error, the cache is not.
  CHECK_THROWS_WITH_AS(b.generate({{1, 2, 3}}, greedy(30)), doctest::Contains("KV cache full"), model_error);
  // Nothing is held: a generation that fits runs, as a generator's.
  generator gen(f.model);
  CHECK(b.generate({{1, 2, 3}}, greedy(10)).result.tokens == gen.generate({{1, 2, 3}}, greedy(10)).tokens);
  const decode_batcher_stats s = b.stats();
  CHECK(s.sessions_opened == 3);  // the first two never opened one
  CHECK(s.sessions_closed == 3);
  CHECK(s.step_errors == 2);
}

/// The longest common prefix of `a` and `b`.
std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

TEST_CASE("a prompt that starts as a finished generation did continues from its cache") {
  batcher_fixture f;
  decode_batcher_options o;
  o.retained_sessions = 2;
  o.prefill_chunk = 8;  // the prompts arrive in pieces, some wholly cached
  decode_batcher b(f.system, f.engine(4 * 64), f.model_head(), o);
  generator gen(f.model);
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const batched_generation first = b.generate(a, greedy(6));
  CHECK(first.cached_prompt_tokens == 0);
  CHECK(first.result.tokens == gen.generate(a, greedy(6)).tokens);
  // The same prompt: all of it but its last token comes from the retained
  // cache, which holds more (the reply) and stays as it is: the new
  // generation starts on its pages (the first shared, the second copied).
  const batched_generation again = b.generate(a, greedy(6));
  CHECK(again.cached_prompt_tokens == 19);
  CHECK(again.result.tokens == first.result.tokens);
  // A follow-up turn: the prompt, the reply, more tokens. The cache holds
  // the prompt and the reply but its last token (never fed): all of it
  // begins the turn, so the generation continues it.
  std::vector<std::int32_t> turn = a;
  turn.insert(turn.end(), first.result.tokens.begin(), first.result.tokens.end());
  turn.insert(turn.end(), {33, 34, 35});
  std::vector<std::int32_t> held = a;
  held.insert(held.end(), first.result.tokens.begin(), first.result.tokens.end() - 1);
  const batched_generation next = b.generate(turn, greedy(6));
  CHECK(next.cached_prompt_tokens == static_cast<int>(common_prefix(held, turn)));
  CHECK(next.cached_prompt_tokens >= 25);
  CHECK(next.result.tokens == gen.generate(turn, greedy(6)).tokens);
  // A prompt sharing a few tokens: starts on a copy of them.
  const std::vector<std::int32_t> other = {1, 2, 3, 40, 41, 42};
  const batched_generation branch = b.generate(other, greedy(6));
  CHECK(branch.cached_prompt_tokens == 3);
  CHECK(branch.result.tokens == gen.generate(other, greedy(6)).tokens);
  // The turn again: the turn's cache (which the branch left as it was)
  // holds all of it but its last token.
  const batched_generation turn_again = b.generate(turn, greedy(6));
  CHECK(turn_again.cached_prompt_tokens == static_cast<int>(turn.size()) - 1);
  CHECK(turn_again.result.tokens == next.result.tokens);
  // Nothing in common: a session of its own; two are kept, the oldest goes.
  const std::vector<std::int32_t> fresh = {50, 51};
  CHECK(b.generate(fresh, greedy(4)).cached_prompt_tokens == 0);
  CHECK(b.generate({{60, 61}}, greedy(4)).cached_prompt_tokens == 0);
  const decode_batcher_stats s = b.stats();
  CHECK(s.shared_sessions == 3);  // again, branch, the turn again
  CHECK(s.shared_tokens == 19 + 3 + turn.size() - 1);
  CHECK(s.reused_sessions == 1);  // next
  CHECK(s.reused_tokens == static_cast<std::uint64_t>(next.cached_prompt_tokens));
  CHECK(s.sessions_opened == 6);
  CHECK(s.evicted_sessions == 4);
  CHECK(s.sessions_closed == 4);
}

TEST_CASE("generations of different cache domains never start on each other's caches, running or retained") {
  batcher_fixture f;
  decode_batcher_options o;
  o.retained_sessions = 4;
  decode_batcher b(f.system, f.engine(4 * 64), f.model_head(), o);
  generator gen(f.model);
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  const auto want = gen.generate(a, greedy(6)).tokens;
  const batched_generation alice = b.generate(a, greedy(6), {}, "alice");
  CHECK(alice.cached_prompt_tokens == 0);
  // The same prompt in another domain, and in the default one: computed
  // whole (alice's retained cache holds all of it), with the same text.
  const batched_generation mallory = b.generate(a, greedy(6), {}, "mallory");
  CHECK(mallory.cached_prompt_tokens == 0);
  CHECK(mallory.result.tokens == want);
  const batched_generation plain = b.generate(a, greedy(6));
  CHECK(plain.cached_prompt_tokens == 0);
  // In its own domain, a later request starts on the domain's cache.
  const batched_generation again = b.generate(a, greedy(6), {}, "alice");
  CHECK(again.cached_prompt_tokens == 19);
  CHECK(again.result.tokens == want);
  CHECK(b.generate(a, greedy(6), {}, "mallory").cached_prompt_tokens == 19);
  CHECK(b.generate(a, greedy(6)).cached_prompt_tokens == 19);
  // And while another domain's generation runs: a prompt held at its first
  // token starts on nothing of it.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> holding{false};
  std::future<batched_generation> held;  // destroyed after let_go: waits for a released generation
  // Released however the checks end (a failed REQUIRE throws).
  struct releaser {
    std::promise<void>& p;
    bool done = false;
    void now() {
      if (!done) p.set_value(), done = true;
    }
    ~releaser() { now(); }
  } let_go{release};
  held = std::async(std::launch::async, [&] {
    return b.generate(a, greedy(3), [&](std::int32_t) {
      if (!holding.exchange(true)) released.wait();
    }, "carol");
  });
  REQUIRE(testing::eventually([&] { return holding.load(); }, std::chrono::seconds(60)));
  CHECK(b.generate(a, greedy(3), {}, "dave").cached_prompt_tokens == 0);
  let_go.now();
  CHECK(held.get().result.tokens == gen.generate(a, greedy(3)).tokens);
  CHECK(b.generate(a, greedy(3), {}, "carol").cached_prompt_tokens == 19);
}

TEST_CASE("a burst of one cache domain's generations lets its own retained caches go, not another domain's") {
  batcher_fixture f;
  decode_batcher_options o;
  o.retained_sessions = 3;
  decode_batcher b(f.system, f.engine(4 * 64), f.model_head(), o);
  generator gen(f.model);
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  CHECK(b.generate(a, greedy(6), {}, "alice").cached_prompt_tokens == 0);
  // Mallory's burst: three generations of their own after Alice's, one
  // more than the batcher keeps. Least-recently-finished would let
  // Alice's cache go; Mallory's domain holds the most and gives up its own.
  for (std::int32_t first : {30, 40, 50}) {
    std::vector<std::int32_t> prompt;
    for (std::int32_t i = 0; i < 20; ++i) prompt.push_back(first + i % 9);
    CHECK(b.generate(prompt, greedy(6), {}, "mallory").cached_prompt_tokens == 0);
  }
  CHECK(b.stats().evicted_sessions == 1);
  const batched_generation again = b.generate(a, greedy(6), {}, "alice");
  CHECK(again.cached_prompt_tokens == 19);
  CHECK(again.result.tokens == gen.generate(a, greedy(6)).tokens);
  // Mallory's first prompt was the one let go: computed again.
  std::vector<std::int32_t> first_prompt;
  for (std::int32_t i = 0; i < 20; ++i) first_prompt.push_back(30 + i % 9);
  CHECK(b.generate(first_prompt, greedy(6), {}, "mallory").cached_prompt_tokens == 0);
}

/// `prefix` followed by `own`.
std::vector<std::int32_t> after(std::vector<std::int32_t> prefix, const std::vector<std::int32_t>& own) {
  prefix.insert(prefix.end(), own.begin(), own.end());
  return prefix;
}

/// A 40-token system prompt: two whole pages of 16 tokens and 8 more.
std::vector<std::int32_t> system_prompt() {
  std::vector<std::int32_t> ids;
  for (std::int32_t i = 0; i < 40; ++i) ids.push_back(3 + (i * 7) % 50);
  return ids;
}

TEST_CASE("generations after one system prompt hold its pages once and compute it once") {
  batcher_fixture f;
  decode_batcher_options o;
  o.gathering = patient();
  o.retained_sessions = 4;  // every cache stays: the pages can be counted after
  decode_batcher b(f.system, f.engine(16 * 64), f.model_head(), o);
  const std::vector<std::int32_t> sys = system_prompt();
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t i = 0; i < 4; ++i) prompts.push_back(after(sys, {60 + i, 61, 62 - i}));
  std::vector<std::vector<std::int32_t>> alone;
  {
    generator gen(f.model);
    for (const auto& p : prompts) alone.push_back(gen.generate(p, greedy(8)).tokens);
  }
  // All four at once: the first to open computes the system prompt; the
  // others wait for it (or, arriving later, find it computed) and start on
  // its pages (two whole pages held, the third copied).
  std::vector<std::future<batched_generation>> runs;
  for (const auto& p : prompts)
    runs.push_back(std::async(std::launch::async, [&b, &p] { return b.generate(p, greedy(8)); }));
  int shared = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    const batched_generation r = runs[i].get();
    CHECK(r.result.tokens == alone[i]);
    CHECK((r.cached_prompt_tokens == 0 || r.cached_prompt_tokens == 40));
    shared += r.cached_prompt_tokens == 40;
  }
  CHECK(shared == 3);
  const decode_batcher_stats s = b.stats();
  CHECK(s.shared_sessions == 3);
  CHECK(s.shared_tokens == 3 * 40);
  CHECK(s.prefill_tokens == 43 + 3 * 3);  // the system prompt once
  CHECK(s.sessions_opened == 4);
  CHECK(s.step_errors == 0);
  // Four caches of 50 tokens (4 pages a layer each) in 10 pages a layer:
  // the first's 4 and 2 of each other's (the copy and the last); the
  // first 2 held by all four.
  const auto layers = static_cast<std::int64_t>(f.model.config().n_layers);
  CHECK(s.kv_pages_in_use == 10 * layers);
  CHECK(s.kv_pages_shared == 2 * layers);
}

/// A generation held after its third token, so that every batch after it
/// waits for its next step (patient gathering): what is queued meanwhile
/// stays queued until release().
struct held_generation {
  std::promise<void> released_promise;
  std::shared_future<void> released = released_promise.get_future().share();
  std::atomic<int> tokens{0};
  std::future<batched_generation> run;

  held_generation(decode_batcher& b, std::vector<std::int32_t> prompt) {
    run = std::async(std::launch::async, [this, &b, prompt] {
      return b.generate(prompt, greedy(6), [this](std::int32_t) {
        if (++tokens == 3) released.wait();
      });
    });
    while (tokens < 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  void release() {
    if (!was_released.exchange(true)) released_promise.set_value();
  }
  /// A test that stopped early still lets the generation end.
  ~held_generation() { release(); }
  std::atomic<bool> was_released{false};
};

/// Waits until `done(b.stats())` (for at most a minute).
template <class F>
bool wait_for_stats(const decode_batcher& b, F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done(b.stats())) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// While a held generation holds every batch back: starts `first` (it
/// opens; its prompt's step waits in the queue), then `second`, which finds
/// the prefix they share not computed yet and waits for it. Their runs (4
/// greedy tokens each).
std::pair<std::future<batched_generation>, std::future<batched_generation>> first_and_waiting(
    decode_batcher& b, const std::vector<std::int32_t>& first, const std::vector<std::int32_t>& second) {
  auto a = std::async(std::launch::async, [&b, first] { return b.generate(first, greedy(4)); });
  REQUIRE(wait_for_stats(b, [](const decode_batcher_stats& s) { return s.sessions_opened == 2; }));
  auto c = std::async(std::launch::async, [&b, second] { return b.generate(second, greedy(4)); });
  REQUIRE(wait_for_stats(b, [](const decode_batcher_stats& s) { return s.prefix_waits == 1; }));
  return {std::move(a), std::move(c)};
}

swarm::gathering_policy very_patient() {
  swarm::gathering_policy g;
  g.wait_fraction = 1e6;
  g.max_wait = std::chrono::seconds(60);
  return g;
}

TEST_CASE("a generation whose prompt another is still computing waits for it, then holds its pages") {
  batcher_fixture f;
  decode_batcher_options o;
  o.gathering = very_patient();
  decode_batcher b(f.system, f.engine(8 * 64), f.model_head(), o);
  const std::vector<std::int32_t> sys = system_prompt();
  const auto first = after(sys, {60}), second = after(sys, {61, 62});
  generator gen(f.model);
  const auto first_alone = gen.generate(first, greedy(4)).tokens;
  const auto second_alone = gen.generate(second, greedy(4)).tokens;

  held_generation x(b, {1, 2, 3});
  auto [a, c] = first_and_waiting(b, first, second);
  CHECK(b.stats().sessions_opened == 2);
  const auto released = std::chrono::steady_clock::now();
  x.release();
  const batched_generation ra = a.get(), rc = c.get();
  CHECK(ra.cached_prompt_tokens == 0);
  CHECK(ra.result.tokens == first_alone);
  CHECK(rc.cached_prompt_tokens == 40);
  CHECK(rc.result.tokens == second_alone);
  x.run.get();
  // x's last steps, queued while the other two were still expected back,
  // run when those close, not when the patient gathering's minute runs out
  // (they did).
  CHECK(std::chrono::steady_clock::now() - released < std::chrono::seconds(30));
  const decode_batcher_stats s = b.stats();
  CHECK(s.shared_sessions == 1);
  CHECK(s.prefill_tokens == 3 + 41 + 2);
  CHECK(s.step_errors == 0);
  CHECK(s.kv_pages_in_use == 0);  // nothing retained: every page went back
}

TEST_CASE("a generation waiting for another's prompt opens on its own when that one fails") {
  batcher_fixture f;
  decode_batcher_options o;
  o.gathering = very_patient();
  // Four pages of 16 tokens a block: x holds one, the first's 52 tokens do
  // not fit in the other three, the second's 42 (and 3 generated) do.
  decode_batcher b(f.system, f.engine(64), f.model_head(), o);
  const std::vector<std::int32_t> sys = system_prompt();
  const auto first = after(sys, std::vector<std::int32_t>(12, 9)), second = after(sys, {61, 62});
  generator gen(f.model);
  const auto second_alone = gen.generate(second, greedy(4)).tokens;

  held_generation x(b, {1, 2, 3});
  auto [a, c] = first_and_waiting(b, first, second);
  x.release();
  CHECK_THROWS_WITH_AS(a.get(), doctest::Contains("KV cache full"), model_error);
  const batched_generation rc = c.get();
  CHECK(rc.cached_prompt_tokens == 0);
  CHECK(rc.result.tokens == second_alone);
  x.run.get();
  CHECK(b.stats().shared_sessions == 0);
}

TEST_CASE("retained caches make room for running generations") {
  batcher_fixture f;
  decode_batcher_options o;
  o.retained_sessions = 4;
  // Three pages of 16 tokens per block: one retained generation of 20
  // tokens holds two of them.
  decode_batcher b(f.system, f.engine(48), f.model_head(), o);
  generator gen(f.model);
  for (std::int32_t first : {1, 11, 21, 31}) {
    CAPTURE(first);
    std::vector<std::int32_t> prompt;
    for (std::int32_t i = 0; i < 18; ++i) prompt.push_back(first + i % 7);
    const batched_generation r = b.generate(prompt, greedy(3));
    CHECK(r.cached_prompt_tokens == 0);
    CHECK(r.result.tokens == gen.generate(prompt, greedy(3)).tokens);
  }
  const decode_batcher_stats s = b.stats();
  CHECK(s.step_errors == 0);
  CHECK(s.evicted_sessions == 3);  // each new generation needed the last one's pages
}

TEST_CASE("stopping the batcher fails the generations waiting for it, a queued step's too") {
  batcher_fixture f;
  // Batches wait for every generation of the last ones: the second
  // generation's step waits in the queue while the first is held.
  swarm::gathering_policy wait_long;
  wait_long.wait_fraction = 1e6;
  wait_long.max_wait = std::chrono::seconds(60);
  decode_batcher b(f.system, f.engine(4 * 64), f.model_head(), {wait_long});
  std::promise<void> release;
  const std::shared_future<void> released = release.get_future().share();
  std::atomic<int> held_tokens{0}, other_tokens{0};
  const auto error_of = [&](std::vector<std::int32_t> prompt, std::atomic<int>& count, bool hold) {
    try {
      b.generate(prompt, greedy(20), [&](std::int32_t) {
        if (++count == 3 && hold) released.wait();
      });
      return std::string("no error");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
  };
  auto held = std::async(std::launch::async, error_of, std::vector<std::int32_t>{1, 2, 3}, std::ref(held_tokens), true);
  auto other = std::async(std::launch::async, error_of, std::vector<std::int32_t>{4, 5, 6}, std::ref(other_tokens), false);
  // (The other's next step then waits for the held one, up to the minute.)
  while (held_tokens < 3 || other_tokens < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b.stop();
  // Answered at once, not after the gathering's minute.
  REQUIRE(other.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(other.get().find("the decode batcher") != std::string::npos);
  release.set_value();
  CHECK(held.get().find("the decode batcher failed to") != std::string::npos);
  CHECK_THROWS_AS(b.generate({{7, 8}}, greedy(2)), std::runtime_error);
}

TEST_CASE("a batcher needs every block and a head of the same model on the same backend") {
  batcher_fixture f;
  span_engine part(stage(f.model.config(), 0, {f.model.blocks()[0]}, f.model.backend()), 64);
  CHECK_THROWS_WITH_AS(decode_batcher(f.system, std::move(part), f.model_head()),
                       doctest::Contains("it must hold all of them"), std::invalid_argument);
  batcher_fixture other(architecture::gpt2);
  CHECK_THROWS_WITH_AS(decode_batcher(f.system, f.engine(64), head(other.model.config(), cpu_backend())),
                       doctest::Contains("another model"), std::invalid_argument);
}

}  // namespace corolla
