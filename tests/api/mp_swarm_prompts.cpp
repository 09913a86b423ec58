// The API's swarm engine with requests that begin alike, over real `corolla
// serve` processes on 127.0.0.1: requests arriving while another runs start
// on its sessions' pages for the prompt they share (the servers compute it
// once), answer what local generation answers, and report the shared
// tokens as cached; with sharing off each computes its own.
#include <doctest/doctest.h>

#include <future>
#include <vector>

#include "actors/corolla.hpp"
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
        running.push_back(std::async(std::launch::async, [&, r] { return engine->generate(prompts[r], m.params, {}); }));
      for (std::size_t r = 0; r < 3; ++r) later[r] = running[r].get();
    });
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

}  // namespace corolla
