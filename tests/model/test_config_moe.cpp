// Tests for model/config's mixture-of-experts configs: Mixtral, Qwen3-MoE
// and Qwen1.5-MoE (experts, top-k, renormalisation, shared experts, the
// real models' parameter counts), the features refused, and the
// to_hf_json round trip.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/error.hpp"
#include "tests/model/hf_config_json.hpp"

using namespace corolla;
using namespace corolla::config_test;

TEST_CASE("mixtral and qwen3-moe configs: experts, top-k, renormalisation, and the real models' parameter counts") {
  model_config c = parse_config(mixtral_json());
  CHECK(c.arch == architecture::llama);
  CHECK(c.hf_architecture == "MixtralForCausalLM");
  CHECK(c.is_moe());
  CHECK(c.n_experts == 8);
  CHECK(c.experts_per_token == 2);
  CHECK(c.norm_topk_prob);  // Mixtral always renormalises the top-k weights
  CHECK(c.intermediate_size == 14336);
  CHECK(c.n_kv_heads == 8);
  CHECK(c.max_positions == 32768);  // sliding_window null: no cap
  CHECK_FALSE(c.qkv_bias);
  CHECK_FALSE(c.o_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK_FALSE(c.tie_embeddings);
  // Mixtral-8x7B: 46,702,792,704 parameters (8 experts and a router per layer).
  CHECK(c.parameter_count() == 46702792704LL);
  // norm_topk_prob means nothing to Mixtral: it renormalises regardless.
  json j = mixtral_json();
  j["norm_topk_prob"] = false;
  CHECK(parse_config(j).norm_topk_prob);
  // model_type alone names the family.
  j = mixtral_json();
  j.erase("architectures");
  CHECK(parse_config(j).hf_architecture == "MixtralForCausalLM");

  c = parse_config(qwen3_moe_json());
  CHECK(c.hf_architecture == "Qwen3MoeForCausalLM");
  CHECK(c.is_moe());
  CHECK(c.n_experts == 128);
  CHECK(c.experts_per_token == 8);
  CHECK(c.norm_topk_prob);
  CHECK(c.intermediate_size == 768);  // each expert's: moe_intermediate_size, not intermediate_size
  CHECK(c.head_dim == 128);
  CHECK(c.qk_norm);  // Qwen3's attention
  CHECK_FALSE(c.qkv_bias);
  CHECK(c.norm_eps == doctest::Approx(1e-6));
  // Qwen3-30B-A3B: 30,532,122,624 parameters.
  CHECK(c.parameter_count() == 30532122624LL);
  j = qwen3_moe_json();
  j.erase("norm_topk_prob");  // HF's default: false
  CHECK_FALSE(parse_config(j).norm_topk_prob);
  j.erase("architectures");
  CHECK(parse_config(j).hf_architecture == "Qwen3MoeForCausalLM");
  // Qwen3-MoE's attention_bias puts biases on q, k, v and o, as Qwen3's does.
  j = qwen3_moe_json();
  j["attention_bias"] = true;
  c = parse_config(j);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  // Neutral values of the refused features parse.
  j = qwen3_moe_json();
  j["router_jitter_noise"] = 0.0;
  j["mlp_only_layers"] = json::array();
  j["decoder_sparse_step"] = 1;
  j["shared_expert_intermediate_size"] = 0;
  CHECK(parse_config(j).n_experts == 128);
  j.erase("mlp_only_layers");
  j.erase("decoder_sparse_step");
  CHECK(parse_config(j).n_experts == 128);
  CHECK_FALSE(parse_config(j).has_shared_expert());
  // A dense config has no experts.
  CHECK_FALSE(parse_config(llama_json()).is_moe());
  CHECK(parse_config(llama_json()).n_experts == 0);
}

TEST_CASE("qwen2-moe configs: experts of moe_intermediate_size, a shared expert, q/k/v biases, the real model's size") {
  model_config c = parse_config(qwen2_moe_json());
  CHECK(c.hf_architecture == "Qwen2MoeForCausalLM");
  CHECK(c.is_moe());
  CHECK(c.n_experts == 60);
  CHECK(c.experts_per_token == 4);
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.intermediate_size == 1408);  // each expert's: moe_intermediate_size
  CHECK(c.has_shared_expert());
  CHECK(c.shared_expert_size == 5632);
  CHECK(c.qkv_bias);  // Qwen2's attention: biases on q, k and v, none on o, no q/k norms
  CHECK_FALSE(c.o_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK(c.max_positions == 8192);  // use_sliding_window false: the window does not cap the context
  // Qwen1.5-MoE-A2.7B: 14,315,784,192 parameters (60 experts, a router, a
  // shared expert and its gate per layer).
  CHECK(c.parameter_count() == 14315784192LL);
  // What to_hf_json writes reads back the same.
  const model_config back = parse_config(to_hf_json(c));
  CHECK(back.hf_architecture == "Qwen2MoeForCausalLM");
  CHECK(back.shared_expert_size == 5632);
  CHECK(back.n_experts == 60);
  CHECK(back.intermediate_size == 1408);
  CHECK(back.qkv_bias);
  CHECK(back.parameter_count() == c.parameter_count());
  // HF's defaults: a shared expert of 5632, not renormalised; a width of 0
  // adds nothing (no shared expert); model_type alone names the family.
  json j = qwen2_moe_json();
  j.erase("shared_expert_intermediate_size");
  j.erase("norm_topk_prob");
  CHECK(parse_config(j).shared_expert_size == 5632);
  CHECK_FALSE(parse_config(j).norm_topk_prob);
  j["shared_expert_intermediate_size"] = 0;
  CHECK_FALSE(parse_config(j).has_shared_expert());
  j.erase("architectures");
  CHECK(parse_config(j).hf_architecture == "Qwen2MoeForCausalLM");
  // A shared expert is Qwen2-MoE's alone.
  c = parse_config(qwen3_moe_json());
  c.shared_expert_size = 64;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("a shared expert (width 64) belongs to a Qwen2MoeForCausalLM"),
                       model_error);
}

TEST_CASE("mixture-of-experts features that are not supported are refused, naming the field") {
  struct refusal {
    json config;
    const char* field;
    const char* says;
  };
  std::vector<refusal> cases;
  auto qwen = [](const char* key, json value) {
    json j = qwen3_moe_json();
    j[key] = std::move(value);
    return j;
  };
  auto mixtral = [](const char* key, json value) {
    json j = mixtral_json();
    j[key] = std::move(value);
    return j;
  };
  cases.push_back({qwen("decoder_sparse_step", 2), "decoder_sparse_step", "is not 1"});
  cases.push_back({qwen("mlp_only_layers", json::array({1})), "mlp_only_layers", "is not empty"});
  cases.push_back({qwen("router_jitter_noise", 0.1), "router_jitter_noise", "is not 0"});
  cases.push_back({mixtral("router_jitter_noise", 0.1), "router_jitter_noise", "is not 0"});
  cases.push_back({qwen("num_experts_per_tok", 129), "num_experts_per_tok", "exceeds the number of experts (128)"});
  cases.push_back({mixtral("num_experts_per_tok", 9), "num_experts_per_tok", "exceeds the number of experts (8)"});
  cases.push_back({qwen("shared_expert_intermediate_size", 512), "shared_expert_intermediate_size", "shared experts"});
  cases.push_back({mixtral("shared_expert_intermediate_size", 512), "shared_expert_intermediate_size", "shared experts"});
  auto qwen2 = [](const char* key, json value) {
    json j = qwen2_moe_json();
    j[key] = std::move(value);
    return j;
  };
  cases.push_back({qwen2("decoder_sparse_step", 2), "decoder_sparse_step", "is not 1"});
  cases.push_back({qwen2("mlp_only_layers", json::array({0})), "mlp_only_layers", "is not empty"});
  cases.push_back({qwen2("shared_expert_intermediate_size", -1), "shared_expert_intermediate_size", "positive integer"});
  cases.push_back({qwen("num_experts_per_tok", 0), "num_experts_per_tok", "positive integer"});
  cases.push_back({mixtral("num_local_experts", 0), "num_local_experts", "positive integer"});
  cases.push_back({qwen("decoder_sparse_step", 0), "decoder_sparse_step", "positive integer"});
  cases.push_back({qwen("norm_topk_prob", "yes"), "norm_topk_prob", "true or false"});
  json missing = qwen3_moe_json();
  missing.erase("num_experts");
  cases.push_back({missing, "num_experts", "missing field"});
  missing = qwen3_moe_json();
  missing.erase("moe_intermediate_size");
  cases.push_back({missing, "moe_intermediate_size", "missing field"});
  missing = mixtral_json();
  missing.erase("num_local_experts");
  cases.push_back({missing, "num_local_experts", "missing field"});
  missing = mixtral_json();
  missing.erase("num_experts_per_tok");
  cases.push_back({missing, "num_experts_per_tok", "missing field"});
  for (const refusal& r : cases) {
    CAPTURE(r.field);
    const std::string e = error_of(r.config);  // a model_error, or "(no error)"
    CHECK(contains(e, std::string("'") + r.field + "'"));
    CHECK(contains(e, r.says));
    CHECK(contains(e, "/models/x/config.json"));
  }
  // validate() holds the same line for configs made in code.
  model_config c = parse_config(mixtral_json());
  c.experts_per_token = 9;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("9 experts per token of 8"), model_error);
  c.experts_per_token = 0;
  CHECK_THROWS_AS(c.validate(), model_error);
  c.experts_per_token = 2;
  c.n_experts = -1;
  CHECK_THROWS_AS(c.validate(), model_error);
}

TEST_CASE("to_hf_json round-trips mixtral and qwen3-moe configs") {
  json qwen_top1 = qwen3_moe_json();
  qwen_top1["norm_topk_prob"] = false;
  qwen_top1["num_experts_per_tok"] = 1;
  qwen_top1["tie_word_embeddings"] = true;
  for (const json& src : {mixtral_json(), qwen3_moe_json(), qwen_top1}) {
    const model_config a = parse_config(src);
    CAPTURE(a.hf_architecture);
    const json out = to_hf_json(a);
    CHECK(out["architectures"] == json::array({a.hf_architecture}));
    CHECK(out["model_type"] == src["model_type"]);
    CHECK(out.value("output_router_logits", true) == false);  // no auxiliary loss in the loss
    const model_config b = parse_config(out);
    CHECK(b.hf_architecture == a.hf_architecture);
    CHECK(b.n_experts == a.n_experts);
    CHECK(b.experts_per_token == a.experts_per_token);
    CHECK(b.norm_topk_prob == a.norm_topk_prob);
    CHECK(b.intermediate_size == a.intermediate_size);
    CHECK(b.hidden_size == a.hidden_size);
    CHECK(b.n_layers == a.n_layers);
    CHECK(b.n_heads == a.n_heads);
    CHECK(b.n_kv_heads == a.n_kv_heads);
    CHECK(b.head_dim == a.head_dim);
    CHECK(b.qk_norm == a.qk_norm);
    CHECK(b.qkv_bias == a.qkv_bias);
    CHECK(b.o_bias == a.o_bias);
    CHECK(b.max_positions == a.max_positions);
    CHECK(b.norm_eps == a.norm_eps);
    CHECK(b.rope == a.rope);
    CHECK(b.tie_embeddings == a.tie_embeddings);
    CHECK(b.parameter_count() == a.parameter_count());
  }
  // The names HF reads.
  const json m = to_hf_json(parse_config(mixtral_json()));
  CHECK(m["num_local_experts"] == 8);
  CHECK(m["num_experts_per_tok"] == 2);
  CHECK(m["intermediate_size"] == 14336);
  const json q = to_hf_json(parse_config(qwen3_moe_json()));
  CHECK(q["num_experts"] == 128);
  CHECK(q["moe_intermediate_size"] == 768);
  CHECK(q["norm_topk_prob"] == true);
  CHECK(q["decoder_sparse_step"] == 1);
  CHECK(q["mlp_only_layers"] == json::array());
}
