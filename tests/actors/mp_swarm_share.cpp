// Swarm sessions of one client node sharing a prompt prefix, with real
// `corolla serve` processes on 127.0.0.1: a generation that starts on a
// running one's servers' pages (swarm_prompt_sharing) generates what local
// generation does, computing only its own tokens; when a server both hold
// dies, each replays its stored inputs (the shared ones included) into the
// replacement and both still equal local generation. Another node's client
// naming the same session shares nothing.
#include <doctest/doctest.h>

#include <signal.h>

#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "model/generator.hpp"
#include "tests/actors/swarm_fixtures.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace swarm_test;

TEST_CASE("a swarm generation started on another's prompt pages equals local generation, through a server both lose") {
  swarm_model m(architecture::llama);
  // 32 tokens in common (two pages), then each prompt its own.
  std::vector<std::int32_t> common;
  for (int i = 0; i < 32; ++i) common.push_back((i * 7 + 3) % m.opts.vocab);
  std::vector<std::int32_t> first = common, second = common;
  for (int i = 0; i < 8; ++i) first.push_back((i * 5 + 1) % m.opts.vocab);
  for (int i = 0; i < 6; ++i) second.push_back((i * 11 + 2) % m.opts.vocab);
  transformer local = transformer::load(m.dir.path(), cpu_backend());
  generator gen(local);
  const auto want_first = gen.generate(first, m.params).tokens;
  const auto want_second = gen.generate(second, m.params).tokens;

  swarm_processes sw;
  for (const auto& [id, a, b] : std::vector<std::tuple<std::string, int, int>>{
           {"s-a", 0, 2}, {"s-e", 0, 2}, {"s-b", 2, 4}})
    sw.start(m, id, a, b);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  swarm_client c1(*n, o), c2(*n, o);
  head h1 = load_head(m), h2 = load_head(m);

  swarm_prefix held;
  int offers = 0;
  swarm_prompt_sharing s1;
  s1.on_prompt = [&](swarm_prefix p) {
    ++offers;
    if (!p.empty()) held = std::move(p);
  };
  swarm_generation g2, stranger;
  std::string victim;
  int produced = 0;
  swarm_generation g1 = swarm_generate(c1, h1, first, m.params, [&](std::int32_t) {
    if (++produced != 3) return;
    // The first generation is running and holds its prompt.
    REQUIRE(held.tokens == static_cast<std::int64_t>(first.size()));
    REQUIRE(held.hops.size() == 2u);
    swarm_prompt_sharing s2;
    s2.start = held;
    s2.start.tokens = 32;  // what the prompts have in common
    // Another node's client names the same sessions: it shares nothing.
    auto other = client_node();
    swarm_client c3(*other, o);
    head h3 = load_head(m);
    stranger = swarm_generate(c3, h3, second, m.params, {}, {}, &s2);
    // The same node's: the servers start it on the first one's pages, and a
    // server both use dies in the middle of it.
    victim = held.hops[0].hop.server;
    int second_produced = 0;
    g2 = swarm_generate(c2, h2, second, m.params, [&](std::int32_t) {
      if (++second_produced == 4) sw.procs.at(victim).signal(SIGKILL);
    }, {}, &s2);
  }, {}, &s1);

  CHECK(stranger.shared_prompt_tokens == 0);
  CHECK(stranger.share_missed);  // it routed anew
  CHECK_FALSE(g2.share_missed);
  CHECK(stranger.result.tokens == want_second);
  CHECK(g2.shared_prompt_tokens == 32);
  CHECK(g2.result.tokens == want_second);
  CHECK(g2.failovers == 1);
  CHECK(g1.result.tokens == want_first);
  CHECK(g1.failovers == 1);
  for (const auto& hop : g2.route) CHECK(hop.server != victim);
  CHECK(offers == 1);  // once the prompt is computed
  CHECK(held.hops[0].hop.server == victim);
}

}  // namespace corolla
