// Per-session LoRA adapters on swarm servers, with real `corolla serve`
// processes on 127.0.0.1 (Petals' servers' --adapters): servers announce the
// adapters they hold (span.info), a client that asks for one routes only
// through them and generates what local generation with the adapter merged
// generates, also when a server dies mid-generation (the replacement opens
// the session with the adapter and replays); the same servers serve the base
// model to sessions without one; an adapter nobody holds is a clear error.
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "model/transformer.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("servers holding an adapter generate what the merged model does, across a killed server too, others left out") {
  swarm_model m(architecture::llama);
  const auto dir = m.dir.path() / "style";
  save_random_adapter(m, dir);
  const std::vector<std::int32_t> expected = merged_tokens(m, dir);
  REQUIRE(expected != m.expected);  // the adapter changes the tokens: the test can tell

  swarm_processes sw;
  sw.start(m, "s-plain", 0, 4);  // holds no adapter: never on an adapted route
  sw.start(m, "s-a", 0, 2, {"--adapter", "style=" + dir.string()});
  sw.start(m, "s-b", 2, 4, {"--adapter", dir.string()});  // named "style" by its directory
  sw.start(m, "s-c", 2, 4, {"--adapter", "style=" + dir.string()});
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  o.adapter = "style";
  std::string route;
  o.on_event = [&](const std::string& e) {
    if (e.rfind("route ", 0) == 0) route = e;
  };
  head h = load_head(m);

  SUBCASE("no failure; the same servers serve the base model to a client without the adapter") {
    swarm_client client(*n, o);
    const swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
    CHECK(g.result.tokens == expected);
    for (const auto& hop : g.route) CHECK(hop.server != "s-plain");

    swarm_client_options plain = o;
    plain.adapter = "";
    plain.on_event = {};
    swarm_client base(*n, plain);
    CHECK(swarm_generate(base, h, m.prompt, m.params).result.tokens == m.expected);

    swarm_client_options absent = plain;
    absent.adapter = "absent";
    swarm_client none(*n, absent);
    CHECK_THROWS_WITH(swarm_generate(none, h, m.prompt, m.params), doctest::Contains("holds no adapter 'absent'"));
  }
  SUBCASE("the [2, 4) server killed after 4 tokens: its replacement opens with the adapter and replays") {
    swarm_client client(*n, o);
    int produced = 0;
    std::string victim;
    const swarm_generation g = swarm_generate(client, h, m.prompt, m.params, [&](std::int32_t) {
      if (++produced != 4) return;
      victim = route.find("s-b") != std::string::npos ? "s-b" : "s-c";
      sw.procs.at(victim).signal(SIGKILL);
    });
    CHECK(g.result.tokens == expected);
    CHECK(g.failovers == 1);
    for (const auto& hop : g.route) CHECK((hop.server != victim && hop.server != "s-plain"));
  }
}

TEST_CASE("corolla generate --swarm --adapter NAME prints what corolla generate --adapter DIR prints locally") {
  swarm_model m(architecture::gpt2);
  const auto dir = m.dir.path() / "style", impostor = m.dir.path() / "impostor";
  save_random_adapter(m, dir);
  testing::random_lora(m.cfg, 8, 0.3f).save(impostor);
  const std::string digest = lora_adapter::load(dir, m.cfg, cpu_backend()).digest();
  CHECK(digest != lora_adapter::load(impostor, m.cfg, cpu_backend()).digest());
  swarm_processes sw;
  // A server holding another adapter under the same name, and the
  // adapter's own servers: NAME@DIGEST routes around the first.
  sw.start(m, "s-0-impostor", 0, 4, {"--adapter", "style=" + impostor.string()});
  sw.start(m, "s-a", 0, 3, {"--adapter", "style=" + dir.string()});
  sw.start(m, "s-b", 3, 4, {"--adapter", "style=" + dir.string()});
  std::string list;
  for (const std::string& e : sw.list()) list += (list.empty() ? "" : ",") + e;
  const std::vector<std::int32_t> local = printed_ids(generate_cli(m, {"--adapter", dir.string()}));
  REQUIRE(local.size() == static_cast<std::size_t>(m.params.max_new_tokens));
  CHECK(local != m.expected);
  CHECK(printed_ids(generate_cli(m, {"--swarm", list, "--adapter", "style@" + digest})) == local);
  const auto r = generate_cli(m, {"--swarm", list, "--adapter", "other"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("holds no adapter 'other'") != std::string::npos);
}

}  // namespace corolla
