// The API's swarm engine with requests that begin alike, over real `corolla
// serve` processes on 127.0.0.1: requests arriving while another runs start
// on its sessions' pages for the prompt they share (the servers compute it
// once), answer what local generation answers, and report the shared
// tokens as cached; with sharing off each computes its own. A finished
// request's sessions are parked on the servers: a chat's next turn starts
// on them and computes only the new tokens.
#include <doctest/doctest.h>

#include <future>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_wire.hpp"
#include "api/completion_engine.hpp"
#include "model/generator.hpp"
#include "tests/actors/swarm_fixtures.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm requests arriving during another with the same system prompt start on its pages and answer as local generation") {
  swarm_model m(architecture::llama);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int r = 0; r < 4; ++r) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < 32; ++i) p.push_back((i * 7 + 3) % m.opts.vocab);  // the system prompt: two pages
    for (int i = 0; i < 5 + r; ++i) p.push_back((i * 5 + 11 * r + 1) % m.opts.vocab);
    prompts.push_back(p);
  }
  transformer local = transformer::load(m.dir.path(), cpu_backend());
  generator gen(local);
  std::vector<std::vector<std::int32_t>> want;
  for (const auto& p : prompts) want.push_back(gen.generate(p, m.params).tokens);

  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  for (bool share : {true, false}) {
    CAPTURE(share);
    auto engine = api::make_swarm_engine(*n, o, load_head(m), 4, weight_format::f32, share);
    // The first request holds its first token until the others are done:
    // they all arrive while its session holds the system prompt.
    std::vector<api::engine_result> later(3);
    bool held = false;
    api::engine_result first = engine->generate(prompts[0], m.params, [&](std::int32_t) {
      if (held) return;
      held = true;
      std::vector<std::future<api::engine_result>> running;
      for (std::size_t r = 1; r < 4; ++r)
        running.push_back(std::async(std::launch::async, [&, r] { return engine->generate(prompts[r], m.params, {}, {}); }));
      for (std::size_t r = 0; r < 3; ++r) later[r] = running[r].get();
    }, {});
    CHECK(first.result.tokens == want[0]);
    CHECK(first.cached_tokens == 0);
    for (std::size_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(later[r].result.tokens == want[r + 1]);
      CHECK(later[r].cached_tokens == (share ? 32 : 0));
      CHECK(later[r].failovers == 0);
    }
    const auto stats = engine->prompt_sharing();
    REQUIRE(stats.has_value() == share);
    if (share) {
      CHECK(stats->shared_sessions == 3);
      CHECK(stats->shared_tokens == 96);
    }
  }
}

TEST_CASE("a chat's next turn over a swarm starts on the last turn's parked sessions and answers as local generation") {
  swarm_model m(architecture::llama);
  generation_params p = m.params;
  p.max_new_tokens = 12;
  std::vector<std::int32_t> turn1;
  for (int i = 0; i < 20; ++i) turn1.push_back((i * 7 + 3) % m.opts.vocab);
  transformer local = transformer::load(m.dir.path(), cpu_backend());
  generator gen(local);
  const auto reply1 = gen.generate(turn1, p).tokens;
  // The next turn's prompt: the conversation so far, then 4 new tokens.
  std::vector<std::int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), reply1.begin(), reply1.end());
  for (int i = 0; i < 4; ++i) turn2.push_back((i * 5 + 1) % m.opts.vocab);
  const auto reply2 = gen.generate(turn2, p).tokens;

  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  auto engine = api::make_swarm_engine(*n, o, load_head(m), 2);
  const api::engine_result first = engine->generate(turn1, p, {}, {});
  CHECK(first.result.tokens == reply1);
  CHECK(first.cached_tokens == 0);
  // Turn 1's sessions hold its prompt and 11 of its 12 tokens.
  const api::engine_result second = engine->generate(turn2, p, {}, {});
  CHECK(second.result.tokens == reply2);
  CHECK(second.cached_tokens == 20 + 11);
  const auto stats = engine->prompt_sharing();
  REQUIRE(stats);
  CHECK(stats->kept == 2);
  CHECK(stats->dropped == 1);  // turn 1, superseded by turn 2
  // The parked sessions are closed when the engine stops: on both servers
  // nothing is left open or parked.
  engine.reset();
  for (const auto& server : {"s-a", "s-b"}) {
    remote_message ask;
    ask.type = span_request::info;
    auto r = n->request(server, "span", std::move(ask), 5s);
    REQUIRE(r);
    auto info = decode_span_info(r->body);
    REQUIRE(info);
    CHECK(info->sessions == 0);
    CHECK(info->cache_tokens_left == info->cache_tokens);
  }
}

}  // namespace corolla
