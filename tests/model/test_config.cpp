// Tests for model/config: parsing HF config.json for Llama, Mistral, Qwen,
// Mixtral, Qwen3-MoE and GPT-2, error messages, parameter counts and the
// to_hf_json round trip.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using json = nlohmann::json;

namespace {

json llama_json() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": false, "hidden_act": "silu", "rope_scaling": null,
    "bos_token_id": 128000, "eos_token_id": [128001, 128009], "torch_dtype": "bfloat16"})");
}

json gpt2_json() {
  // The official gpt2 config.json (abridged to the fields that matter).
  return json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "resid_pdrop": 0.1, "vocab_size": 50257})");
}

json mixtral_json() {
  // Mixtral-8x7B-v0.1's config.json (abridged to the fields that matter).
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})");
}

json qwen3_moe_json() {
  // Qwen3-30B-A3B's config.json (abridged to the fields that matter).
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})");
}

json qwen2_moe_json() {
  // Qwen1.5-MoE-A2.7B's config.json (abridged to the fields that matter).
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
    "moe_intermediate_size": 1408, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})");
}

std::string error_of(const json& j) {
  try {
    parse_config(j, "/models/x/config.json");
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("llama config.json parses every field with HF defaults") {
  model_config c = parse_config(llama_json());
  CHECK(c.arch == architecture::llama);
  CHECK(c.hf_architecture == "LlamaForCausalLM");
  CHECK(c.vocab_size == 32000);
  CHECK(c.hidden_size == 4096);
  CHECK(c.n_layers == 32);
  CHECK(c.n_heads == 32);
  CHECK(c.n_kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.intermediate_size == 14336);
  CHECK(c.max_positions == 8192);
  CHECK(c.norm_eps == doctest::Approx(1e-5));
  CHECK(c.rope.theta == doctest::Approx(500000.0));
  CHECK_FALSE(c.tie_embeddings);
  CHECK(c.bos_token_id == 128000);
  CHECK(c.eos_token_id == 128001);  // first of the list

  json j = llama_json();
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j["eos_token_id"] = nullptr;
  j["head_dim"] = 64;  // explicit head_dim wins over hidden/heads
  c = parse_config(j);
  CHECK(c.n_kv_heads == 32);
  CHECK(c.rope.theta == doctest::Approx(10000.0));
  CHECK_FALSE(c.tie_embeddings);
  CHECK(c.eos_token_id == -1);
  CHECK(c.head_dim == 64);
}

TEST_CASE("mistral and model_type without architectures are llama-family") {
  json j = llama_json();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4096;
  model_config c = parse_config(j);
  CHECK(c.arch == architecture::llama);
  CHECK(c.hf_architecture == "MistralForCausalLM");
  CHECK(c.max_positions == 4096);  // context capped at the window: attention stays exact

  j = llama_json();
  j.erase("architectures");
  j["model_type"] = "mistral";
  CHECK(parse_config(j).hf_architecture == "MistralForCausalLM");
  j = gpt2_json();
  j.erase("architectures");
  CHECK(parse_config(j).arch == architecture::gpt2);
}

TEST_CASE("gpt2 config.json parses n_* fields and ties the head") {
  model_config c = parse_config(gpt2_json());
  CHECK(c.arch == architecture::gpt2);
  CHECK(c.vocab_size == 50257);
  CHECK(c.hidden_size == 768);
  CHECK(c.n_layers == 12);
  CHECK(c.n_heads == 12);
  CHECK(c.n_kv_heads == 12);
  CHECK(c.head_dim == 64);
  CHECK(c.intermediate_size == 3072);  // n_inner absent -> 4 * n_embd
  CHECK(c.max_positions == 1024);
  CHECK(c.tie_embeddings);
  CHECK(c.bos_token_id == 50256);
  CHECK(c.eos_token_id == 50256);
  // The real GPT-2 small has 124,439,808 parameters.
  CHECK(c.parameter_count() == 124439808LL);

  json j = gpt2_json();
  j.erase("n_positions");
  j["n_inner"] = 1000;
  j["activation_function"] = "gelu_pytorch_tanh";
  c = parse_config(j);
  CHECK(c.max_positions == 1024);  // from n_ctx
  CHECK(c.intermediate_size == 1000);
}

TEST_CASE("parameter_count is exact for llama shapes") {
  // TinyLlama-1.1B: 1,100,048,384 parameters.
  json j = json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
    "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
    "num_key_value_heads": 4, "intermediate_size": 5632, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "hidden_act": "silu"})");
  CHECK(parse_config(j).parameter_count() == 1100048384LL);
  // Tied: the LM head is not counted twice.
  j["tie_word_embeddings"] = true;
  CHECK(parse_config(j).parameter_count() == 1100048384LL - 32000LL * 2048);
}

TEST_CASE("parameter_count equals the element count of the written tiny checkpoints") {
  for (int variant = 0; variant < 7; ++variant) {
    testing::tiny_model_options o;
    if (variant == 1) o.tied = true;
    if (variant == 2) {
      o.arch = architecture::gpt2;
      o.heads = 4;
    }
    if (variant == 3) o.family = "Qwen2ForCausalLM";
    if (variant == 4) {
      o.family = "Qwen3ForCausalLM";
      o.head_dim = 16;
      o.attention_bias = true;
    }
    if (variant == 5) o.family = "MixtralForCausalLM";
    if (variant == 6) {
      o.family = "Qwen3MoeForCausalLM";
      o.experts = 3;
      o.experts_per_token = 1;
      o.tied = true;
    }
    testing::temp_dir_guard dir("config-count");
    testing::write_tiny_model(dir.path(), o);
    checkpoint ck = checkpoint::open(dir.path());
    long long total = 0;
    for (const auto& name : ck.names()) total += shape_numel(ck.info(name).shape);
    model_config c = load_config(dir.path());
    CAPTURE(variant);
    CHECK(c.parameter_count() == total);
    CHECK(c.parameter_count() == testing::tiny_config(o).parameter_count());
  }
}

TEST_CASE("unsupported architectures and features are named in the error") {
  json j = llama_json();
  j["architectures"] = {"FalconForCausalLM"};
  CHECK(error_of(j) ==
        "unsupported architecture 'FalconForCausalLM' in /models/x/config.json (supported: "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
        "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GPT2LMHeadModel)");

  j = llama_json();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  std::string e = error_of(j);
  CHECK(contains(e, "rope_scaling type 'dynamic'"));
  CHECK(contains(e, "not supported"));
  CHECK(contains(e, "/models/x/config.json"));
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  CHECK(contains(error_of(j), "rope_scaling type 'longrope' in /models/x/config.json is not supported"));
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  CHECK(contains(error_of(j), "missing field 'low_freq_factor' in rope_scaling in /models/x/config.json"));
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -1}};
  CHECK(contains(error_of(j), "field 'factor' in rope_scaling"));
  j["rope_scaling"] = 3;
  CHECK(contains(error_of(j), "must be an object or null"));

  j = llama_json();
  j["mlp_bias"] = true;
  CHECK(contains(error_of(j), "mlp_bias"));

  j = llama_json();
  j["hidden_act"] = "gelu";
  CHECK(contains(error_of(j), "hidden_act"));

  j = gpt2_json();
  j["activation_function"] = "relu";
  e = error_of(j);
  CHECK(contains(e, "activation_function"));
  CHECK(contains(e, "relu"));
  CHECK(contains(e, "gelu_new"));
}

TEST_CASE("rope_scaling types give HF's frequencies: linear, llama3 (Llama 3.1's numbers), yarn (Qwen's)") {
  json j = llama_json();  // rope_theta 500000, head_dim 128
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  const model_config c = parse_config(j);
  CHECK(c.rope.kind == rope_kind::llama3);
  const rope_spec plain(500000.0);
  // Short wavelengths (< 8192/4) stay, long ones (> 8192) are divided by 8,
  // those between are mixed.
  CHECK(c.rope.inv_freq(0, 128) == plain.inv_freq(0, 128));
  CHECK(c.rope.inv_freq(63, 128) == doctest::Approx(plain.inv_freq(63, 128) / 8));
  int mixed = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = c.rope.inv_freq(i, 128), p = plain.inv_freq(i, 128);
    CHECK(f <= p);
    CHECK(f >= p / 8 * (1 - 1e-12));
    mixed += f < p && f > p / 8 * (1 + 1e-9);
  }
  CHECK(mixed > 0);
  CHECK(c.rope.scale() == 1.0);

  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // the older key
  CHECK(parse_config(j).rope.inv_freq(5, 128) == doctest::Approx(plain.inv_freq(5, 128) / 2));

  // Qwen2.5's long-context setting: factor 4 over 32768 positions.
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  const model_config y = parse_config(j);
  CHECK(y.rope.kind == rope_kind::yarn);
  CHECK(y.rope.scale() == doctest::Approx(0.1 * std::log(4.0) + 1.0));
  // dim 128, base 1e6, 32768 positions: the ramp spans dimensions
  // [floor(23.6), ceil(39.65)] = [23, 40].
  CHECK(y.rope.ramp_low == 23.0);
  CHECK(y.rope.ramp_high == 40.0);
  const rope_spec base(1000000.0);
  CHECK(y.rope.inv_freq(3, 128) == base.inv_freq(3, 128));
  CHECK(y.rope.inv_freq(60, 128) == doctest::Approx(base.inv_freq(60, 128) / 4));
  const double mid = y.rope.inv_freq(31, 128) / base.inv_freq(31, 128);  // ramp (31 - 23) / 17
  CHECK(mid == doctest::Approx(1.0 / 4 * (8.0 / 17) + (1 - 8.0 / 17)));
  // Round trip keeps the scaling.
  CHECK(parse_config(to_hf_json(y)).rope == y.rope);
  j["rope_scaling"] = {{"rope_type", "default"}};
  CHECK(parse_config(j).rope == rope_spec(1000000.0));
}

TEST_CASE("qwen2 and qwen3 configs: q/k/v biases, q/k norms, their own head_dim, sliding windows only when used") {
  json j = llama_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["sliding_window"] = 1024;
  j["use_sliding_window"] = false;
  model_config c = parse_config(j);
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.o_bias);
  CHECK_FALSE(c.qk_norm);
  CHECK(c.max_positions == 8192);
  j["use_sliding_window"] = true;
  CHECK(parse_config(j).max_positions == 1024);
  CHECK(parse_config(to_hf_json(c)).qkv_bias);

  j = llama_json();
  j.erase("architectures");
  j["model_type"] = "qwen3";
  j["head_dim"] = 64;  // 32 heads x 64 != hidden 4096
  c = parse_config(j);
  CHECK(c.hf_architecture == "Qwen3ForCausalLM");
  CHECK(c.qk_norm);
  CHECK(c.head_dim == 64);
  CHECK_FALSE(c.qkv_bias);
  j["attention_bias"] = true;
  c = parse_config(j);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  const model_config back = parse_config(to_hf_json(c));
  CHECK(back.qk_norm);
  CHECK(back.o_bias);
  CHECK(back.head_dim == 64);
  // Parameters: the four biases of each of the 32 layers.
  j["attention_bias"] = false;
  const long long plain = parse_config(j).parameter_count();
  CHECK(c.parameter_count() - plain == 32LL * (32 * 64 + 2 * 8 * 64 + 4096));
}

TEST_CASE("missing or invalid fields are named with the file") {
  json j = llama_json();
  j.erase("hidden_size");
  CHECK(error_of(j) == "missing field 'hidden_size' in /models/x/config.json");

  j = llama_json();
  j["num_attention_heads"] = "32";
  std::string e = error_of(j);
  CHECK(contains(e, "'num_attention_heads'"));
  CHECK(contains(e, "positive integer"));

  j = llama_json();
  j["rms_norm_eps"] = -1.0;
  CHECK(contains(error_of(j), "'rms_norm_eps'"));

  j = gpt2_json();
  j.erase("n_positions");
  j.erase("n_ctx");
  CHECK(contains(error_of(j), "'n_ctx'"));
}

TEST_CASE("validate rejects inconsistent head counts") {
  json j = llama_json();
  j["num_key_value_heads"] = 5;
  std::string e = error_of(j);
  CHECK(contains(e, "not divisible"));
  CHECK(contains(e, "/models/x/config.json"));

  j = llama_json();
  j["hidden_size"] = 4100;  // not divisible by 32 heads, no head_dim
  CHECK(contains(error_of(j), "hidden_size"));

  model_config c = parse_config(llama_json());
  c.n_layers = 0;
  CHECK_THROWS_AS(c.validate(), model_error);
  c = parse_config(llama_json());
  c.n_kv_heads = 3;
  CHECK_THROWS_AS(c.validate(), model_error);
}

TEST_CASE("load_config reports missing files and invalid JSON with the position") {
  testing::temp_dir_guard dir("config-load");
  std::string e;
  try {
    load_config(dir.path() / "nope");
  } catch (const model_error& x) {
    e = x.what();
  }
  CHECK(contains(e, "does not exist"));

  CHECK_THROWS_WITH_AS(load_config(dir.path()), ("no config.json in " + dir.path().string()).c_str(),
                       model_error);

  {
    std::ofstream out(dir.path() / "config.json");
    out << "{\"vocab_size\": 10,\n \"hidden_size\": }";
  }
  e.clear();
  try {
    load_config(dir.path());
  } catch (const model_error& x) {
    e = x.what();
  }
  CHECK(contains(e, "invalid JSON in " + (dir.path() / "config.json").string() + " at byte"));

  // A config.json path works as well as its directory.
  {
    std::ofstream out(dir.path() / "config.json");
    out << gpt2_json().dump();
  }
  CHECK(load_config(dir.path() / "config.json").hidden_size == 768);
}

TEST_CASE("to_hf_json round-trips through parse_config") {
  for (const json& src : {llama_json(), gpt2_json()}) {
    model_config a = parse_config(src);
    json out = to_hf_json(a);
    CHECK(out["torch_dtype"] == "float32");
    CHECK(out["architectures"].size() == 1);
    model_config b = parse_config(out);
    CHECK(b.arch == a.arch);
    CHECK(b.hf_architecture == a.hf_architecture);
    CHECK(b.vocab_size == a.vocab_size);
    CHECK(b.hidden_size == a.hidden_size);
    CHECK(b.n_layers == a.n_layers);
    CHECK(b.n_heads == a.n_heads);
    CHECK(b.n_kv_heads == a.n_kv_heads);
    CHECK(b.head_dim == a.head_dim);
    CHECK(b.intermediate_size == a.intermediate_size);
    CHECK(b.max_positions == a.max_positions);
    CHECK(b.norm_eps == a.norm_eps);
    CHECK(b.rope == a.rope);
    CHECK(b.tie_embeddings == a.tie_embeddings);
    CHECK(b.bos_token_id == a.bos_token_id);
    CHECK(b.eos_token_id == a.eos_token_id);
  }
  // Epsilons are written as the short decimal, not float noise.
  CHECK(to_hf_json(parse_config(llama_json())).at("rms_norm_eps").get<double>() == 1e-5);
  json g = to_hf_json(parse_config(gpt2_json()));
  CHECK(g["model_type"] == "gpt2");
  CHECK(g["activation_function"] == "gelu_new");
  CHECK(g["n_embd"] == 768);
}

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
