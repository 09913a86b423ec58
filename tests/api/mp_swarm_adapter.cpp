// The API's swarm engine with LoRA adapters the servers hold (`corolla api
// --swarm --adapter NAME ...`), over real `corolla serve` processes on
// 127.0.0.1: concurrent requests of two adapters and of the base model each
// answer what local generation with its adapter merged answers, and a
// request starts on a finished request's pages of its own adapter only.
#include <doctest/doctest.h>

#include <future>
#include <utility>
#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "api/completion_engine.hpp"
#include "api/openai_request.hpp"
#include "model/error.hpp"
#include "model/lora.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/random_lora.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm API requests name their adapters, and each answers what local generation with it merged answers") {
  swarm_model m(architecture::llama);
  const auto style = m.dir.path() / "style", other = m.dir.path() / "other";
  save_random_adapter(m, style);
  testing::random_lora(m.cfg, 8, 0.3f).save(other, m.dir.path().string());
  const std::vector<std::int32_t> want_style = merged_tokens(m, style), want_other = merged_tokens(m, other);
  REQUIRE(want_style != m.expected);
  REQUIRE(want_other != m.expected);
  REQUIRE(want_style != want_other);
  // "half" is held by the first server only: no route of it covers the model.
  const auto half = m.dir.path() / "half";
  testing::random_lora(m.cfg, 9, 0.3f).save(half, m.dir.path().string());
  swarm_processes sw;
  for (const auto& [name, first, last] : {std::tuple{"s-a", 0, 2}, std::tuple{"s-b", 2, 4}}) {
    std::vector<std::string> held{"--adapter", "style=" + style.string(), "--adapter", "other=" + other.string()};
    if (first == 0) held.insert(held.end(), {"--adapter", "half=" + half.string()});
    sw.start(m, name, first, last, held);
  }
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  auto engine = api::make_swarm_engine(*n, o, load_head(m), 4, weight_format::f32, true, {"style", "other"});
  CHECK(engine->adapters() == std::vector<std::string>{"other", "style"});
  const std::vector<std::string> which = {"style", "", "other", "style"};
  std::vector<std::future<api::engine_result>> running;
  for (const auto& adapter : which)
    running.push_back(std::async(std::launch::async, [&, adapter] {
      return engine->generate(m.prompt, m.params, {}, {}, adapter);
    }));
  for (std::size_t i = 0; i < which.size(); ++i) {
    CAPTURE(which[i]);
    CHECK(running[i].get().result.tokens ==
          (which[i] == "style" ? want_style : which[i] == "other" ? want_other : m.expected));
  }
  // One at a time, a prompt none of those began with: a request starts on
  // a finished one's pages of its own adapter only (the board's domains
  // keep them apart, before any server would refuse to share them).
  // (36 tokens: two whole pages of 16 to share.)
  std::vector<std::int32_t> fresh;
  for (int i = 0; i < 36; ++i) fresh.push_back(static_cast<std::int32_t>((7 * i + 2) % m.cfg.vocab_size));
  const api::engine_result first_style = engine->generate(fresh, m.params, {}, {}, "style");
  CHECK(first_style.cached_tokens == 0);
  const api::engine_result first_other = engine->generate(fresh, m.params, {}, {}, "other");
  CHECK(first_other.cached_tokens == 0);
  CHECK(first_other.result.tokens != first_style.result.tokens);
  const api::engine_result again = engine->generate(fresh, m.params, {}, {}, "style");
  CHECK(again.cached_tokens > 0);
  CHECK(again.result.tokens == first_style.result.tokens);
  CHECK(engine->generate(fresh, m.params, {}, {}, "").cached_tokens == 0);
  CHECK_THROWS_WITH_AS(engine->generate(m.prompt, m.params, {}, {}, "absent"),
                       "no adapter 'absent' is served here (these are: other, style)", model_error);

  // "*": any adapter the swarm holds over the whole model (not "half"),
  // each the same as when named.
  auto discovering = api::make_swarm_engine(*n, o, load_head(m), 2, weight_format::f32, true, {"*"});
  CHECK(discovering->discovers_adapters());
  CHECK_FALSE(engine->discovers_adapters());
  CHECK(discovering->adapters() == std::vector<std::string>{"other", "style"});
  CHECK(discovering->generate(m.prompt, m.params, {}, {}, "other").result.tokens == want_other);
  CHECK(discovering->generate(m.prompt, m.params, {}, {}, "style").result.tokens == want_style);
  CHECK(discovering->generate(m.prompt, m.params, {}, {}, "").result.tokens == m.expected);
  // (A name not held over the whole model: 404 naming nothing else, since
  // the list may hold names private to other tenants.)
  CHECK_THROWS_WITH_AS(discovering->generate(m.prompt, m.params, {}, {}, "half"),
                       "The model 'half' is not served now (GET /v1/models).", api::api_error);

  // An adapter no server holds: the request fails naming it (503 over HTTP).
  auto missing = api::make_swarm_engine(*n, o, load_head(m), 1, weight_format::f32, true, {"absent"});
  CHECK_THROWS_WITH_AS(missing->generate(m.prompt, m.params, {}, {}, "absent"),
                       "no server of the swarm serves adapter 'absent' now", api::api_error);
  // The engine's requests choose adapters: none set on the client.
  swarm_client_options fixed = o;
  fixed.adapter = "style";
  CHECK_THROWS_AS(api::make_swarm_engine(*n, fixed, load_head(m), 1, weight_format::f32, true),
                  std::invalid_argument);
  CHECK_THROWS_AS(api::make_swarm_engine(*n, o, load_head(m), 1, weight_format::f32, true, {"style", "style@0"}),
                  std::invalid_argument);
}

}  // namespace corolla

namespace corolla {
using namespace swarm_test;

TEST_CASE("the swarm API engine keeps an adapter's requests on servers holding the adapter it names, digest and all") {
  // Two servers of the whole model, each holding an adapter named "style",
  // but not the same one: named with its digest, every request computes
  // with that one (past the server listed first); named alone, with the
  // first server's, for every slot.
  swarm_model m(architecture::llama);
  const auto one = m.dir.path() / "one", two = m.dir.path() / "two";
  save_random_adapter(m, one);
  testing::random_lora(m.cfg, 21, 0.3f).save(two, m.dir.path().string());
  const std::vector<std::int32_t> want_one = merged_tokens(m, one), want_two = merged_tokens(m, two);
  REQUIRE(want_one != want_two);
  const std::string digest_two = lora_adapter::load(two, m.cfg, cpu_backend()).digest();
  swarm_processes sw;
  sw.start(m, "s-one", 0, 4, {"--adapter", "style=" + one.string()});
  sw.start(m, "s-two", 0, 4, {"--adapter", "style=" + two.string()});
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  for (const auto& [spec, want] : {std::pair{"style@" + digest_two, want_two}, std::pair{std::string("style"), want_one}}) {
    CAPTURE(spec);
    auto engine = api::make_swarm_engine(*n, o, load_head(m), 3, weight_format::f32, true, {spec});
    CHECK(engine->adapters() == std::vector<std::string>{"style"});
    std::vector<std::future<api::engine_result>> running;
    for (int r = 0; r < 3; ++r)
      running.push_back(std::async(std::launch::async, [&] {
        return engine->generate(m.prompt, m.params, {}, {}, "style");
      }));
    for (auto& f : running) CHECK(f.get().result.tokens == want);
  }
  // Found by asking ('*'): one name for both digests, pinned to the first
  // server's as a name given alone is.
  auto discovering = api::make_swarm_engine(*n, o, load_head(m), 1, weight_format::f32, true, {"*"});
  CHECK(discovering->adapters() == std::vector<std::string>{"style"});
  CHECK(discovering->generate(m.prompt, m.params, {}, {}, "style").result.tokens == want_one);
}

}  // namespace corolla
