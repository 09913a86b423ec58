// Tests for model/config: parsing HF config.json for Llama, Mistral, Qwen
// and GPT-2, error messages, parameter counts and the to_hf_json round
// trip; the mixture-of-experts configs are in test_config_moe.cpp.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/error.hpp"
#include "model/safetensors.hpp"
#include "tests/model/hf_config_json.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::config_test;

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
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_id == 2);  // first of the list

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
