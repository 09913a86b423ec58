// Servers' weight dtypes with real `corolla serve` processes on 127.0.0.1:
// a server announces the linear weights its decode reads (span.info), a
// client that requires one (swarm_client_options::weights, --swarm-weights)
// routes only through such servers, and a chain of int8 (or nf4) servers
// generates what local int8 (nf4) decode generates.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "model/generator.hpp"
#include "model/transformer.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("a client that requires int8 or nf4 weights routes only through such servers and gets local decode's tokens") {
  swarm_model m(architecture::llama);
  transformer local = transformer::load(m.dir.path(), cpu_backend());
  for (const weight_format f : {weight_format::int8, weight_format::nf4}) {
    const std::string name = weight_format_name(f), flag = name == "i8" ? "int8" : name;
    CAPTURE(name);
    // The tokens local decode from these weights generates.
    generator gen(local, 0, f);
    const std::vector<std::int32_t> want = gen.generate(m.prompt, m.params).tokens;

    swarm_processes sw;
    sw.start(m, "s-f32", 0, 4);
    sw.start(m, "s-a-" + name, 0, 2, {"--weights", flag});
    sw.start(m, "s-b-" + name, 2, 4, {"--weights", flag});
    auto n = client_node();
    swarm_client_options o;
    o.servers = sw.list();
    o.weights = name;
    swarm_client client(*n, o);
    head h = load_head(m);
    h.use_inference_weights(f);  // the client's LM head, as local decode's
    const swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
    CHECK(g.result.tokens == want);
    REQUIRE(g.route.size() == 2u);
    CHECK(g.route[0].server == "s-a-" + name);
    CHECK(g.route[1].server == "s-b-" + name);

    // Requiring bf16, which nobody serves, is an error naming what they hold.
    swarm_client_options bf = o;
    bf.weights = "bf16";
    swarm_client none(*n, bf);
    CHECK_THROWS_WITH(swarm_generate(none, h, m.prompt, m.params), doctest::Contains("weights, not bf16"));
  }
}

TEST_CASE("a bad --swarm-weights value is one clear error") {
  swarm_model m(architecture::llama);
  const auto r = testing::run_corolla({"generate", "--model", m.dir.path().string(), "--prompt-ids", "1,2",
                                       "--swarm", "127.0.0.1:1", "--swarm-weights", "int4"});
  CHECK(r.exit_code != 0);
  CHECK(r.err.find("--swarm-weights must be f32, bf16, int8 or nf4, got 'int4'") != std::string::npos);
}

}  // namespace corolla
