// The API's swarm engine with a LoRA adapter the servers hold (`corolla api
// --swarm --adapter NAME`), over real `corolla serve` processes on
// 127.0.0.1: concurrent requests, sharing their prompt's pages among
// themselves, answer what local generation with the adapter merged answers.
#include <doctest/doctest.h>

#include <future>
#include <vector>

#include "actors/corolla.hpp"
#include "api/completion_engine.hpp"
#include "tests/actors/swarm_fixtures.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm API requests with an adapter answer what local generation with it merged answers") {
  swarm_model m(architecture::llama);
  const auto dir = m.dir.path() / "style";
  save_random_adapter(m, dir);
  const std::vector<std::int32_t> want = merged_tokens(m, dir);
  REQUIRE(want != m.expected);
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2, {"--adapter", "style=" + dir.string()});
  sw.start(m, "s-b", 2, 4, {"--adapter", "style=" + dir.string()});
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  o.adapter = "style";
  auto engine = api::make_swarm_engine(*n, o, load_head(m), 3, weight_format::f32, true);
  std::vector<std::future<api::engine_result>> running;
  for (int r = 0; r < 3; ++r)
    running.push_back(std::async(std::launch::async, [&] { return engine->generate(m.prompt, m.params, {}, {}); }));
  for (auto& f : running) CHECK(f.get().result.tokens == want);
}

}  // namespace corolla
