// Swarm serving of every Llama-family member with real `corolla serve`
// processes on 127.0.0.1: Qwen2 (q/k/v biases, tied embeddings) and Qwen3
// (per-head q/k norms, its own head_dim) with scaled RoPE (yarn, llama3)
// generate through a two-server chain as they do locally; so do the
// mixtures of experts Mixtral, Qwen3-MoE and Qwen2-MoE (each server
// routes its blocks' rows to their experts; Qwen2-MoE's shared expert runs
// beside them).
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "model/generator.hpp"
#include "tests/actors/swarm_fixtures.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
using namespace swarm_test;

TEST_CASE("swarm greedy generation equals local generation for Qwen2 and Qwen3 models with scaled RoPE") {
  const std::vector<std::function<void(testing::tiny_model_options&)>> families = {
      [](auto& o) {
        o.family = "Qwen2ForCausalLM";
        o.tied = true;
        o.rope_scaling = R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})";
      },
      [](auto& o) {
        o.family = "Qwen3ForCausalLM";
        o.head_dim = 16;
        o.init_std = 0.6f;
        o.rope_scaling = R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})";
      }};
  for (const auto& family : families) {
    swarm_model m(architecture::llama, family);
    CAPTURE(m.opts.family);
    swarm_processes sw;
    sw.start(m, "s-a", 0, 2);
    sw.start(m, "s-b", 2, 4);
    auto n = client_node();
    swarm_client_options o;
    o.servers = sw.list();
    swarm_client client(*n, o);
    head h = load_head(m);
    const swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
    CHECK(g.result.tokens == m.expected);
    CHECK(g.route.size() == 2u);
  }
}

TEST_CASE("swarm greedy generation equals local generation for Mixtral, Qwen3-MoE and Qwen2-MoE models") {
  const std::vector<std::function<void(testing::tiny_model_options&)>> families = {
      [](auto& o) {
        o.family = "MixtralForCausalLM";
        o.init_std = 0.6f;
      },
      [](auto& o) {
        o.family = "Qwen3MoeForCausalLM";
        o.head_dim = 16;
        o.experts = 6;
        o.experts_per_token = 3;
        o.norm_topk_prob = false;
        o.init_std = 0.6f;
      },
      [](auto& o) {
        o.family = "Qwen2MoeForCausalLM";  // and its gated shared expert, on every server
        o.init_std = 0.6f;
      }};
  for (const auto& family : families) {
    swarm_model m(architecture::llama, family);
    CAPTURE(m.opts.family);
    REQUIRE(m.cfg.is_moe());
    swarm_processes sw;
    sw.start(m, "s-a", 0, 2);
    sw.start(m, "s-b", 2, 4);
    auto n = client_node();
    swarm_client_options o;
    o.servers = sw.list();
    swarm_client client(*n, o);
    head h = load_head(m);
    const swarm_generation g = swarm_generate(client, h, m.prompt, m.params);
    CHECK(g.result.tokens == m.expected);
    CHECK(g.route.size() == 2u);
  }
}

}  // namespace corolla
