// A LoRA adapter trained through `corolla serve` processes on 127.0.0.1
// (the client holds the adapter and its AdamW state; each stateless request
// carries its blocks' factors and a backward answers their gradients): the
// swarm run equals the run with local blocks, also when a server is killed
// inside a step or answers wrong gradients; `corolla finetune --swarm
// --lora-rank` prints what `corolla train --lora-rank` (one process) prints,
// and the adapter it saves is served by `corolla serve --adapter`.
#include <doctest/doctest.h>

#include <signal.h>

#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "actors/node_control.hpp"
#include "actors/swarm_finetune.hpp"
#include "model/lora.hpp"
#include "model/prompt_tuning.hpp"
#include "model/span_engine.hpp"
#include "tests/actors/finetune_fixtures.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/numeric_checks.hpp"

namespace corolla {
using namespace swarm_test;

namespace {

constexpr int batch = 2, seq = 6, steps = 6;

struct lora_run {
  std::vector<float> losses;
  std::vector<Tensor> adapter;  ///< every block's values, after the last step
};

/// `steps` steps of an all-linear rank-4 adapter through `runner`;
/// `before_step(s)` runs before step s.
lora_run tune(const swarm_model& m, span_runner& runner, const tuning_batches& data,
              const std::function<void(int)>& before_step = {}) {
  head h = load_head(m);
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  c.targets = {"all-linear"};
  lora_adapter a = lora_adapter::init(m.cfg, c, 11, cpu_backend());
  prompt_tuning_options o;
  o.prompt_len = 0;
  o.optimizer.lr = 0.02f;
  prompt_tuner tuner(h, runner, o, &a);
  lora_run r;
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(s);
    r.losses.push_back(tuner.step(data.ids[s], data.targets[s], batch, seq));
  }
  for (int i = 0; i < a.n_layers(); ++i) r.adapter.push_back(a.block(i).flat().clone());
  return r;
}

void check_same_run(const lora_run& got, const lora_run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  const double eps = cuda_device_count() > 0 ? 1e-4 : 1e-5;
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(got.losses[s] == doctest::Approx(want.losses[s]).epsilon(eps));
  REQUIRE(got.adapter.size() == want.adapter.size());
  for (std::size_t i = 0; i < got.adapter.size(); ++i)
    CHECK(testing::max_rel_diff(got.adapter[i], want.adapter[i]) < 1e-4);
}

lora_run local_run(const swarm_model& m, const tuning_batches& data) {
  span_engine blocks = span_engine::load(checkpoint::open(m.dir.path()), m.cfg, 0, m.cfg.n_layers, cpu_backend(), 16);
  local_span_runner local(blocks);
  return tune(m, local, data);
}

}  // namespace

TEST_CASE("a LoRA adapter trained through the swarm equals one trained with local blocks, also across a killed server") {
  swarm_model m(architecture::llama);
  const tuning_batches data(m.cfg.vocab_size, steps, batch, seq, 43);
  const lora_run want = local_run(m, data);
  CHECK(want.losses.back() < want.losses.front());

  // Overlapping spans: each step's route splits the adapter differently.
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
  // The last hop's server dies between step 4's forward and its backward:
  // its replacement gets the same factors with the recomputed input.
  swarm_client client(*n, o);
  swarm_span_runner remote(client, 2);
  int forwards = 0;
  std::string victim;
  hooked_runner killer(remote, [&] {
    if (++forwards != 4) return;
    victim = remote.route().back().server;
    sw.procs.at(victim).signal(SIGKILL);
  });
  check_same_run(tune(m, killer, data), want);
  CHECK(remote.failovers() >= 1);
  for (const auto& hop : remote.route()) CHECK(hop.server != victim);
  std::string log;
  for (const auto& e : events) log += "\n  " + e;
  MESSAGE(remote.failovers() << " failover(s):" << log);
}

TEST_CASE("LoRA through the swarm catches a server whose adapter gradients turn wrong") {
  swarm_model m(architecture::gpt2);
  const tuning_batches data(m.cfg.vocab_size, steps, batch, seq, 43);
  const lora_run want = local_run(m, data);

  ::setenv("COROLLA_CONTROL_TOKEN", "lora-spot-check", 1);
  swarm_processes sw;
  for (const char* id : {"s-a", "s-b", "s-c"}) sw.start(m, id, 0, 4);
  ::unsetenv("COROLLA_CONTROL_TOKEN");
  auto n = client_node();
  swarm_client_options o;
  o.servers = sw.list();
  o.spot_checks.fraction = 1.0;  // every forward and backward
  o.spot_check_seed = 3;
  swarm_client client(*n, o);
  swarm_span_runner remote(client, 5);
  int forwards = 0;
  std::string victim;
  hooked_runner runner(remote, [&] {
    if (++forwards != 3) return;
    victim = remote.route().front().server;
    REQUIRE_FALSE(request_corrupt(*n, victim, "lora-spot-check", "span", true));
  });
  check_same_run(tune(m, runner, data), want);
  REQUIRE(client.spot_checks().wrong.size() == 1);
  CHECK(client.spot_checks().wrong[0].server == victim);
  CHECK(client.distrusted(victim));
  for (const auto& hop : remote.route()) CHECK(hop.server != victim);
}

TEST_CASE("corolla finetune --swarm --lora-rank prints what corolla train --lora-rank prints, and serve serves its adapter") {
  swarm_model m(architecture::llama);
  const auto data = m.dir.path() / "tokens.bin";
  {
    std::ofstream f(data, std::ios::binary);
    std::mt19937 rng(5);
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
  const std::vector<std::string> shape{"--model", m.dir.path().string(), "--data", data.string(), "--steps", "5",
                                       "--batch", "2", "--seq", "8", "--lr", "0.05", "--seed", "4",
                                       "--lora-rank", "4", "--lora-targets", "all-linear", "--json"};
  auto run = [&](const std::string& command, std::vector<std::string> extra) {
    std::vector<std::string> args{command};
    args.insert(args.end(), shape.begin(), shape.end());
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = testing::run_corolla(args, 60s);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return r;
  };
  const auto adapter_dir = m.dir.path() / "tuned";
  const auto swarm_run = nlohmann::json::parse(run("finetune", {"--swarm", list, "--save-adapter", adapter_dir.string()})
                                                   .out_lines()
                                                   .back());
  // The references compute on the cpu, as the servers here do.
  const auto local_run = nlohmann::json::parse(run("finetune", {"--local", "--device", "cpu"}).out_lines().back());
  // One process, the whole model in it: a line per step, then a summary.
  std::vector<double> trained;
  for (const std::string& line : run("train", {"--device", "cpu"}).out_lines()) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) trained.push_back(j["loss"].get<double>());
  }
  MESSAGE("swarm " << swarm_run.dump() << "\nlocal " << local_run.dump());
  REQUIRE(swarm_run["losses"].size() == 5u);
  REQUIRE(local_run["losses"].size() == 5u);
  REQUIRE(trained.size() == 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(swarm_run["losses"][i].get<double>() == doctest::Approx(local_run["losses"][i].get<double>()).epsilon(1e-5));
    CHECK(swarm_run["losses"][i].get<double>() == doctest::Approx(trained[i]).epsilon(1e-5));
  }
  CHECK(swarm_run["tuning"] == "none");
  CHECK(swarm_run["adapter"]["rank"] == 4);
  CHECK(swarm_run["adapter"]["saved"] == adapter_dir.string());

  // Deep prompts beside the adapter: each request carries both, a backward
  // answers both gradients, and the swarm still equals local.
  const std::vector<std::string> both{"--tuning", "deep", "--prompt-len", "2"};
  auto with_prompts = both;
  with_prompts.insert(with_prompts.end(), {"--swarm", list});
  const auto swarm_both = nlohmann::json::parse(run("finetune", with_prompts).out_lines().back());
  with_prompts = both;
  with_prompts.insert(with_prompts.end(), {"--local", "--device", "cpu"});
  const auto local_both = nlohmann::json::parse(run("finetune", with_prompts).out_lines().back());
  REQUIRE(swarm_both["losses"].size() == 5u);
  REQUIRE(local_both["losses"].size() == 5u);
  for (std::size_t i = 0; i < 5; ++i)
    CHECK(swarm_both["losses"][i].get<double>() == doctest::Approx(local_both["losses"][i].get<double>()).epsilon(1e-5));
  CHECK(swarm_both["losses"][4].get<double>() != doctest::Approx(swarm_run["losses"][4].get<double>()).epsilon(1e-3));

  // The saved adapter, served by a server of the whole model beside the
  // others, generates through the swarm what it generates merged locally.
  const auto merged = printed_ids(generate_cli(m, {"--adapter", adapter_dir.string()}));
  CHECK(merged.size() == static_cast<std::size_t>(m.params.max_new_tokens));
  CHECK(merged != m.expected);  // the trained adapter changes the output: the test can tell
  sw.start(m, "s-c", 0, 4, {"--adapter", "tuned=" + adapter_dir.string()});
  const auto served = generate_cli(m, {"--swarm", sw.endpoints.at("s-c") + "," + list, "--adapter", "tuned"});
  INFO("stderr: " << served.err);
  CHECK(served.exit_code == 0);
  CHECK(printed_ids(served) == merged);
}

}  // namespace corolla
