// Prompt tuning through `corolla serve` processes on 127.0.0.1: the swarm
// run's losses and prompts equal the local run's (blocks in this process),
// also when a server is killed inside a step; `corolla finetune --swarm`
// prints the losses `--local` prints.
#include <doctest/doctest.h>

#include <signal.h>

#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/node_control.hpp"
#include "actors/swarm_finetune.hpp"
#include "actors/swarm_generate.hpp"
#include "model/prompt_tuning.hpp"
#include "model/span_engine.hpp"
#include "tests/actors/finetune_fixtures.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/numeric_checks.hpp"

namespace corolla {
using namespace swarm_test;

namespace {

constexpr int batch = 2, seq = 6, steps = 6;

prompt_tuning_options tuning() {
  prompt_tuning_options o;
  o.prompt_len = 3;
  o.optimizer.lr = 0.05f;
  o.seed = 7;
  return o;
}

/// Losses and final prompts of `steps` steps through `runner`;
/// `before_step(s)` runs before step s.
std::pair<std::vector<float>, Tensor> tune(const swarm_model& m, span_runner& runner, const tuning_batches& data,
                                           const std::function<void(int)>& before_step = {}) {
  head h = load_head(m);
  prompt_tuner tuner(h, runner, tuning());
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(s);
    losses.push_back(tuner.step(data.ids[s], data.targets[s], batch, seq));
  }
  return {losses, tuner.prompts().clone()};
}

void check_same_run(const std::pair<std::vector<float>, Tensor>& got,
                    const std::pair<std::vector<float>, Tensor>& want) {
  REQUIRE(got.first.size() == want.first.size());
  // The servers compute on the GPU where one is visible (--device auto) and
  // the reference on the cpu: summation orders differ across devices too.
  const double eps = cuda_device_count() > 0 ? 1e-4 : 1e-5;
  for (std::size_t s = 0; s < got.first.size(); ++s) CHECK(got.first[s] == doctest::Approx(want.first[s]).epsilon(eps));
  CHECK(testing::max_rel_diff(got.second, want.second) < 1e-4);
}

}  // namespace

TEST_CASE("prompt tuning through the swarm equals prompt tuning with local blocks, also across a killed server") {
  swarm_model m(architecture::llama);
  const tuning_batches data(m.cfg.vocab_size, steps, batch, seq, 42);
  span_engine local_blocks =
      span_engine::load(checkpoint::open(m.dir.path()), m.cfg, 0, m.cfg.n_layers, cpu_backend(), 16);
  local_span_runner local(local_blocks);
  const auto want = tune(m, local, data);

  // Overlapping spans: routes differ from step to step (and by seed).
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  sw.start(m, "s-c", 0, 3);
  sw.start(m, "s-d", 1, 4);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  std::vector<std::string> events;
  o.on_event = [&](const std::string& e) { events.push_back(e); };
  {
    swarm_client client(*n, o);
    swarm_span_runner remote(client, 1);
    check_same_run(tune(m, remote, data), want);
    CHECK(remote.failovers() == 0);
  }
  // The last hop's server dies between step 3's forward and its backward:
  // the backward reroutes its blocks, recomputes the new hops' inputs and
  // goes on; later routes leave the dead server out.
  swarm_client client(*n, o);
  swarm_span_runner remote(client, 2);
  int forwards = 0;
  std::string victim;
  hooked_runner killer(remote, [&] {
    if (++forwards != 4) return;
    victim = remote.route().back().server;
    sw.procs.at(victim).signal(SIGKILL);
  });
  const auto got = tune(m, killer, data);
  check_same_run(got, want);
  CHECK(remote.failovers() >= 1);
  for (const auto& hop : remote.route()) CHECK(hop.server != victim);
  // The seeded routes make the victim's blocks go to two servers, so the
  // backward recomputed the first one's forward to give the second its input.
  bool two_hop_replacement = false;
  for (const auto& e : events)
    if (e.find("fine-tuning: blocks") == 0 && e.find(" -> ") != std::string::npos) two_hop_replacement = true;
  CHECK(two_hop_replacement);
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE(remote.failovers() << " failover(s):" << log);
}

TEST_CASE("prompt tuning catches a server whose gradients turn wrong and equals prompt tuning with local blocks") {
  swarm_model m(architecture::llama);
  const tuning_batches data(m.cfg.vocab_size, steps, batch, seq, 42);
  span_engine local_blocks =
      span_engine::load(checkpoint::open(m.dir.path()), m.cfg, 0, m.cfg.n_layers, cpu_backend(), 16);
  local_span_runner local(local_blocks);
  const auto want = tune(m, local, data);

  ::setenv("COROLLA_CONTROL_TOKEN", "finetune-spot-check", 1);
  swarm_processes sw;
  for (const char* id : {"s-a", "s-b", "s-c"}) sw.start(m, id, 0, 4);
  ::unsetenv("COROLLA_CONTROL_TOKEN");
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  o.spot_checks.fraction = 1.0;  // every forward and backward
  o.spot_check_seed = 3;
  std::vector<std::string> events;
  o.on_event = [&](const std::string& e) { events.push_back(e); };
  swarm_client client(*n, o);
  swarm_span_runner remote(client, 5);
  // Between step 3's forward and its backward the server of the route
  // starts answering wrong: the backward's check catches it.
  int forwards = 0;
  std::string victim;
  hooked_runner runner(remote, [&] {
    if (++forwards != 3) return;
    victim = remote.route().front().server;
    REQUIRE_FALSE(request_corrupt(*n, victim, "finetune-spot-check", "span", true));
  });
  const auto got = tune(m, runner, data);
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE("events:" << log);
  check_same_run(got, want);
  REQUIRE(client.spot_checks().wrong.size() == 1);
  CHECK(client.spot_checks().wrong[0].server == victim);
  CHECK(client.distrusted(victim));
  CHECK(remote.failovers() == 1);
  for (const auto& hop : remote.route()) CHECK(hop.server != victim);
  CHECK(client.spot_checks().checks >= 2 * steps);
}

TEST_CASE("generation after deep prompts through the swarm equals local generation, also across a killed server") {
  swarm_model m(architecture::llama);
  const std::int64_t P = 3;
  const Tensor prompts = testing::random_tensor({m.cfg.n_layers, P, m.cfg.hidden_size}, 41, 0.5f);
  transformer local = transformer::load(m.dir.path(), cpu_backend());
  generator gen(local);
  gen.set_deep_prompts(prompts);
  const auto expected = gen.generate(m.prompt, m.params).tokens;
  CHECK(expected != m.expected);  // the prompts change the output: the test can tell

  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  sw.start(m, "s-c", 2, 4);
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  std::string route;
  o.on_event = [&](const std::string& e) {
    if (e.rfind("route ", 0) == 0) route = e;
  };
  swarm_client client(*n, o);
  head h = load_head(m);
  SUBCASE("no failure") {
    CHECK(swarm_generate(client, h, m.prompt, m.params, {}, prompts).result.tokens == expected);
  }
  SUBCASE("the [2, 4) server killed after 4 tokens: its replacement gets the prompts and replays the prefix") {
    int produced = 0;
    std::string victim;
    swarm_generation g = swarm_generate(
        client, h, m.prompt, m.params,
        [&](std::int32_t) {
          if (++produced != 4) return;
          victim = route.find("s-b") != std::string::npos ? "s-b" : "s-c";
          sw.procs.at(victim).signal(SIGKILL);
        },
        prompts);
    CHECK(g.result.tokens == expected);
    CHECK(g.failovers == 1);
    for (const auto& hop : g.route) CHECK(hop.server != victim);
  }
}

TEST_CASE("corolla finetune --swarm prints the losses corolla finetune --local prints") {
  swarm_model m(architecture::llama);
  // Raw uint16 token ids: no tokenizer needed.
  const auto data = m.dir.path() / "tokens.bin";
  {
    std::ofstream f(data, std::ios::binary);
    std::mt19937 rng(3);
    for (int i = 0; i < 400; ++i) {
      const auto id = static_cast<std::uint16_t>(rng() % static_cast<unsigned>(m.cfg.vocab_size));
      f.write(reinterpret_cast<const char*>(&id), sizeof id);
    }
  }
  swarm_processes sw;
  sw.start(m, "s-a", 0, 2);
  sw.start(m, "s-b", 2, 4);
  std::string list;
  for (const auto& e : sw.list()) list += (list.empty() ? "" : ",") + e;
  const std::vector<std::string> common{"finetune", "--model", m.dir.path().string(), "--data", data.string(),
                                        "--steps", "4", "--batch", "2", "--seq", "8", "--prompt-len", "2", "--json"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = testing::run_corolla(args, 60s);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    REQUIRE_FALSE(r.out_lines().empty());
    return nlohmann::json::parse(r.out_lines().back());
  };
  const auto local = run({"--local"});
  const auto saved = m.dir.path() / "prompts.safetensors";
  const auto remote = run({"--swarm", list, "--save", saved.string()});
  MESSAGE("local " << local.dump() << "\nswarm " << remote.dump());
  REQUIRE(local["losses"].size() == 4u);
  REQUIRE(remote["losses"].size() == 4u);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(remote["losses"][i].get<double>() == doctest::Approx(local["losses"][i].get<double>()).epsilon(1e-5));
  CHECK(remote["blocks"] == "swarm");
  CHECK(std::filesystem::exists(saved));

  // The trained prompts generate through the swarm what they generate locally.
  const auto local_ids = printed_ids(generate_cli(m, {"--prompts", saved.string()}));
  const auto swarm_run = generate_cli(m, {"--prompts", saved.string(), "--swarm", list});
  INFO("stderr: " << swarm_run.err);
  CHECK(swarm_run.exit_code == 0);
  CHECK(local_ids.size() == static_cast<std::size_t>(m.params.max_new_tokens));
  CHECK(printed_ids(swarm_run) == local_ids);

  // Bad input: one clear error line each.
  auto both = testing::run_corolla({"finetune", "--model", m.dir.path().string(), "--data", data.string(), "--local",
                                    "--swarm", list},
                                   60s);
  CHECK(both.exit_code == 1);
  CHECK(both.err.find("exactly one of") != std::string::npos);
  auto missing = testing::run_corolla({"finetune", "--model", m.dir.path().string(), "--data", "/nonexistent.bin",
                                       "--local"},
                                      60s);
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("does not exist") != std::string::npos);
}

}  // namespace corolla
