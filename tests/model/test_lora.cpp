// LoRA adapters (model/lora.hpp): the adapter's gradients against central
// differences of the loss; training changes the adapter only and lowers the
// loss; the saved PEFT directory loads back, merged as the model loads, to
// the very model that trained (bits), in bf16 too; what cannot be applied
// exactly is refused with the file named.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "model/safetensors.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/pattern_tokens.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::testing;
namespace fs = std::filesystem;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void write_json(const fs::path& file, const nlohmann::json& j) { std::ofstream(file) << j.dump(); }

}  // namespace

TEST_CASE("lora: the adapter's gradients equal central differences of the loss (Llama GQA, GPT-2's stacked c_attn)") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    const model_config cfg = tiny_config(tiny_options_for(arch));
    transformer model = transformer::init(cfg, 5, cpu_backend());
    lora_config c;
    c.rank = 3;
    c.alpha = 6.0f;
    c.targets = {"all-linear"};
    lora_adapter adapter = lora_adapter::init(cfg, c, 9, cpu_backend());
    CHECK(adapter.modules().size() == (arch == architecture::llama ? 7u : 4u));
    randomise_b(adapter, 100);
    lora_tuning tuning(model, adapter);
    const auto ids = pattern_ids(2 * 8, 0), targets = pattern_ids(2 * 8, 1);
    model.zero_grads();
    tuning.zero_grads();
    model.forward_backward(ids, targets, 2, 8);
    CHECK(model.gradient_values() == 0);  // the model made no gradient buffer of its own
    std::vector<param_group> g = adapter.groups();
    const auto loss = [&] {
      tuning.refresh();
      return static_cast<double>(model.forward_loss(ids, targets, 2, 8));
    };
    std::uint64_t seed = 7;
    for (int l = 0; l < cfg.n_layers; ++l)
      for (const lora_module& m : adapter.modules())
        for (const char* which : {".lora_A", ".lora_B"}) {
          const std::string name = m.path + which;
          const Tensor grad = g[static_cast<std::size_t>(l)].grads->get(name);
          CHECK(std::sqrt(dot(grad, grad)) > 1e-6);  // both halves learn
          check_direction("block " + std::to_string(l) + " " + name, adapter.block(l).get(name), grad, loss, seed++);
        }
  }
}

TEST_CASE("frozen weights: the trained weights' gradients equal the full backward's, the frozen ones are not formed") {
  tiny_model_options qwen2, qwen3, mixtral;
  qwen2.family = "Qwen2ForCausalLM";  // biases on q, k and v
  qwen3.family = "Qwen3ForCausalLM";  // per-head q/k norms, frozen
  mixtral.family = "MixtralForCausalLM";  // its router and experts frozen whole
  for (const tiny_model_options& o :
       {tiny_model_options{}, qwen2, qwen3, mixtral, tiny_options_for(architecture::gpt2)}) {
    CAPTURE(o.family);
    const model_config cfg = tiny_config(o);
    transformer model = transformer::init(cfg, 12, cpu_backend());
    const auto ids = pattern_ids(2 * 8, 3), targets = pattern_ids(2 * 8, 4);
    std::vector<param_group> g = model.groups();
    model.zero_grads();
    const float full_loss = model.forward_backward(ids, targets, 2, 8);
    std::vector<Tensor> full;
    for (const param_group& p : g) full.push_back(p.grads->flat().clone());
    // q and v trained, k between them frozen: the batched q/k/v backward
    // runs product by product; the MLP's norm trained, the attention's
    // (and Qwen3's q/k norms) not.
    std::set<std::string> trained = {"q.weight", "v.weight", "mlp_norm.weight"};
    if (!cfg.is_moe()) trained.insert("down.weight");
    CHECK_THROWS_AS(model.set_trained_weights(std::set<std::string>{"q.weight", "router.weight"}), tensor_error);
    // A weight of another family's blocks: refused, not trained silently as nothing.
    if (!cfg.qk_norm)
      CHECK_THROWS_AS(model.set_trained_weights(std::set<std::string>{"q_norm.weight"}), tensor_error);
    model.set_trained_weights(trained);
    model.zero_grads();
    CHECK(model.forward_backward(ids, targets, 2, 8) == full_loss);
    CHECK(dot(g[0].grads->flat(), g[0].grads->flat()) == 0.0);  // no head gradient
    for (std::size_t b = 1; b < g.size(); ++b) {
      std::vector<std::pair<std::string, shape_t>> layout;
      for (const param_entry& e : g[b].grads->entries()) layout.emplace_back(e.name, e.shape);
      const param_set want(layout, full[b]);
      for (const param_entry& e : g[b].grads->entries()) {
        CAPTURE(e.name);
        const Tensor got = g[b].grads->get(e.name);
        const std::string stem = e.name.substr(0, e.name.find('.'));
        if (trained.count(stem + ".weight"))
          CHECK(max_rel_diff(got, want.get(e.name)) < 1e-5);  // formed, as the full backward forms it
        else
          CHECK(dot(got, got) == 0.0);  // never formed
      }
    }
    model.set_trained_weights(std::nullopt);  // every gradient again
    model.zero_grads();
    model.forward_backward(ids, targets, 2, 8);
    for (std::size_t b = 0; b < g.size(); ++b) CHECK(max_rel_diff(g[b].grads->flat(), full[b]) == 0.0);
  }
}

TEST_CASE("lora: a fresh adapter is the base model, training moves the adapter only, and its PEFT directory loads back as the trained model") {
  temp_dir_guard tmp("lora-train");
  tiny_model_options o;  // 2-layer GQA Llama
  o.init_std = 0.1f;
  write_tiny_model(tmp / "base", o);
  write_pattern(tmp / "pattern.bin");
  const auto ids = pattern_ids(16, 0), targets = pattern_ids(16, 1);

  transformer model = transformer::load(tmp / "base", cpu_backend());
  const float base_loss = model.forward_loss(ids, targets, 1, 16);
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  lora_adapter adapter = lora_adapter::init(model.config(), c, 1, cpu_backend());
  CHECK(adapter.config().targets == std::vector<std::string>{"self_attn.q_proj", "self_attn.v_proj"});
  token_dataset data = token_dataset::open(tmp / "pattern.bin", nullptr, o.vocab);
  train_options opts;
  opts.batch = 4;
  opts.seq = 16;
  opts.steps = 30;
  opts.optimizer.adamw.lr = 2e-2f;
  opts.adapter = &adapter;
  opts.adapter_base = "tiny-llama";
  opts.save_dir = tmp / "adapter";
  transformer base = transformer::load(tmp / "base", cpu_backend());
  float tuned_loss = 0;
  {
    trainer train(model, data, opts);
    CHECK(model.forward_loss(ids, targets, 1, 16) == base_loss);  // B = 0: the base model
    // Moments for the adapter only: 2 layers x (q: 4x32 + 32x4, v: 4x32 + 16x4).
    CHECK(adapter.numel() == 2 * (4 * 32 + 32 * 4 + 4 * 32 + 16 * 4));
    CHECK(train.optimizer().size() == adapter.numel());
    const train_summary s = train.run();
    MESSAGE("lora pattern loss: step 1 " << s.losses.front() << ", step 30 " << s.losses.back());
    CHECK(s.losses.front() == doctest::Approx(base_loss).epsilon(1e-6));
    CHECK(s.losses.back() < 0.5f * s.losses.front());
    tuned_loss = model.forward_loss(ids, targets, 1, 16);  // the terms beside the weights
    CHECK(tuned_loss < 0.5f * base_loss);
    // While it trains, the model's weights are the base's to the bit:
    // nothing merged into them, nothing copied.
    for (int l = 0; l < 2; ++l)
      CHECK(same_bits(model.blocks()[static_cast<std::size_t>(l)].flat(), base.blocks()[static_cast<std::size_t>(l)].flat()));
  }
  // The trainer (and its lora_tuning) gone, the model is the trained one,
  // the adapter merged once: its loss is the training's, up to rounding.
  const float merged_loss = model.forward_loss(ids, targets, 1, 16);
  CHECK(merged_loss == doctest::Approx(tuned_loss).epsilon(1e-5));

  // Only the adapted weights moved, each by exactly s B A.
  CHECK(same_bits(model.head().flat(), base.head().flat()));
  for (int l = 0; l < 2; ++l) {
    const param_set& p = model.blocks()[static_cast<std::size_t>(l)];
    const param_set& b = base.blocks()[static_cast<std::size_t>(l)];
    for (const auto& e : p.entries()) {
      CAPTURE(e.name);
      const bool adapted = e.name == "q.weight" || e.name == "v.weight";
      CHECK(same_bits(p.get(e.name), b.get(e.name)) == !adapted);
    }
  }
  param_set expect = base.blocks()[1].like();
  expect.flat().copy_from(base.blocks()[1].flat());
  adapter.merge(cpu_backend(), 1, expect);
  CHECK(same_bits(expect.flat(), model.blocks()[1].flat()));

  // The PEFT directory: its config and its tensor names.
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(tmp / "adapter" / "adapter_config.json"));
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8.0);
  CHECK(j["target_modules"] == nlohmann::json::array({"q_proj", "v_proj"}));
  CHECK(j["base_model_name_or_path"] == "tiny-llama");
  auto file = safetensors_file::open(tmp / "adapter" / "adapter_model.safetensors");
  CHECK(file->tensors().size() == 8u);
  const tensor_info* a = file->find("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight");
  const tensor_info* b = file->find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->shape == shape_t{4, 32});
  CHECK(b->shape == shape_t{16, 4});

  // Loaded with the adapter: the trained model, to the bit; in bf16 close to it.
  const model_config cfg = model.config();
  auto loaded = std::make_shared<lora_adapter>(lora_adapter::load(tmp / "adapter", cfg, cpu_backend()));
  transformer merged = transformer::load(tmp / "base", cpu_backend(), {}, loaded);
  for (int l = 0; l < 2; ++l)
    CHECK(same_bits(merged.blocks()[static_cast<std::size_t>(l)].flat(), model.blocks()[static_cast<std::size_t>(l)].flat()));
  CHECK(merged.forward_loss(ids, targets, 1, 16) == merged_loss);
  // In bf16 (merged before rounding): the bf16 copies a generator makes of
  // the trained model, so the same greedy tokens; the base model's differ.
  generation_params gp;
  gp.max_new_tokens = 12;
  gp.ignore_eos = true;
  const std::vector<std::int32_t> prompt = pattern_ids(5, 0);
  const auto tokens_of = [&](transformer& m) { return generator(m, 0, weight_format::bf16).generate(prompt, gp).tokens; };
  transformer bf16 = transformer::load_inference(tmp / "base", cpu_backend(), weight_format::bf16, {}, loaded);
  transformer plain = transformer::load_inference(tmp / "base", cpu_backend(), weight_format::bf16);
  const auto want = tokens_of(model);

  CHECK(tokens_of(bf16) == want);
  CHECK(tokens_of(plain) != want);
  CHECK(want == pattern_ids(12, 5));  // the adapted model continues the pattern

  // Training on from the saved adapter continues where it stopped.
  transformer again = transformer::load(tmp / "base", cpu_backend());
  lora_adapter resumed = lora_adapter::load(tmp / "adapter", cfg, cpu_backend());
  lora_tuning tuning(again, resumed);
  CHECK(again.forward_loss(ids, targets, 1, 16) == tuned_loss);  // beside the weights, as it trained
}

TEST_CASE("lora: GPT-2's c_proj modules are saved by their paths where their last name is shared, and load back") {
  temp_dir_guard tmp("lora-gpt2");
  const model_config cfg = tiny_config(tiny_options_for(architecture::gpt2));
  struct named_case {
    std::vector<std::string> targets, paths;
    nlohmann::json saved;
  };
  const std::vector<named_case> cases = {
      // PEFT's suffix match takes attention's c_proj and the MLP's.
      {{"c_proj"}, {"attn.c_proj", "mlp.c_proj"}, {"attn.c_proj", "mlp.c_proj"}},
      // One of them alone keeps its path: "c_proj" would name both.
      {{"mlp.c_proj"}, {"mlp.c_proj"}, {"mlp.c_proj"}},
      {{"c_attn", "mlp.c_proj"}, {"attn.c_attn", "mlp.c_proj"}, {"c_attn", "mlp.c_proj"}},
      {{"all-linear"}, {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}, {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"}},
  };
  int n = 0;
  for (const named_case& k : cases) {
    CAPTURE(k.saved.dump());
    lora_config c;
    c.targets = k.targets;
    lora_adapter a = lora_adapter::init(cfg, c, 2, cpu_backend());
    CHECK(a.config().targets == k.paths);
    randomise_b(a, 40);
    const fs::path dir = tmp / std::to_string(n++);
    a.save(dir);
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"));
    CHECK(j["target_modules"] == k.saved);
    CHECK(j["fan_in_fan_out"] == true);
    lora_adapter back = lora_adapter::load(dir, cfg, cpu_backend());
    CHECK(back.config().targets == k.paths);  // by their paths, as init names them
    for (int l = 0; l < cfg.n_layers; ++l) CHECK(same_bits(back.block(l).flat(), a.block(l).flat()));
  }
  auto file = safetensors_file::open(tmp / "1" / "adapter_model.safetensors");
  const tensor_info* b = file->find("base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight");
  REQUIRE(b);
  CHECK(b->shape == shape_t{32, 8});
  CHECK(file->tensors().size() == 4u);  // 2 layers x (A, B) of mlp.c_proj only
}

TEST_CASE("lora: what cannot be applied exactly is refused, naming the file") {
  temp_dir_guard tmp("lora-bad");
  const model_config cfg = tiny_config(tiny_model_options{});
  lora_config c;
  c.rank = 2;
  lora_adapter a = lora_adapter::init(cfg, c, 3, cpu_backend());
  a.save(tmp / "good");
  CHECK_NOTHROW(lora_adapter::load(tmp / "good", cfg, cpu_backend()));
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(tmp / "good" / "adapter_config.json"));
  const auto variant = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    fs::create_directories(tmp / name);
    fs::copy_file(tmp / "good" / "adapter_model.safetensors", tmp / name / "adapter_model.safetensors");
    nlohmann::json j = good;
    change(j);
    write_json(tmp / name / "adapter_config.json", j);
    return tmp / name;
  };
  const auto refused = [&](const fs::path& dir, const std::string& part) {
    try {
      (void)lora_adapter::load(dir, cfg, cpu_backend());
      FAIL("loaded " << dir);
    } catch (const model_error& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find(part) != std::string::npos);
    }
  };
  refused(variant("ia3", [](nlohmann::json& j) { j["peft_type"] = "IA3"; }), "not \"LORA\"");
  refused(variant("dora", [](nlohmann::json& j) { j["use_dora"] = true; }), "DoRA");
  refused(variant("pattern", [](nlohmann::json& j) { j["rank_pattern"] = {{"q_proj", 4}}; }), "rank_pattern");
  refused(variant("layers", [](nlohmann::json& j) { j["layers_to_transform"] = {0}; }), "layers_to_transform");
  refused(variant("save", [](nlohmann::json& j) { j["modules_to_save"] = {"lm_head"}; }), "modules_to_save");
  refused(variant("bias", [](nlohmann::json& j) { j["bias"] = "all"; }), "biases");
  refused(variant("typed", [](nlohmann::json& j) { j["use_dora"] = "no"; }), "malformed");
  refused(variant("regex", [](nlohmann::json& j) { j["target_modules"] = ".*proj"; }), "regular expression");
  refused(variant("rank", [](nlohmann::json& j) { j["r"] = 3; }), "has shape [2, 32], expected [3, 32]");
  refused(variant("more", [](nlohmann::json& j) { j["target_modules"] = {"q_proj", "v_proj", "o_proj"}; }),
          "o_proj.lora_A.weight missing");
  refused(variant("fewer", [](nlohmann::json& j) { j["target_modules"] = {"q_proj"}; }),
          "v_proj.lora_A.weight, which adapts no module");
  refused(variant("unknown", [](nlohmann::json& j) { j["target_modules"] = {"qkv"}; }), "names no module");
  fs::create_directories(tmp / "empty");
  refused(tmp / "empty", "adapter_config.json");
  refused(tmp / "missing", "does not exist");
  // A model with more layers than the adapter was made for.
  tiny_model_options deeper;
  deeper.layers = 3;
  try {
    (void)lora_adapter::load(tmp / "good", tiny_config(deeper), cpu_backend());
    FAIL("a 2-layer adapter loaded for 3 layers");
  } catch (const model_error& e) {
    CHECK(std::string(e.what()).find("layers.2.self_attn.q_proj.lora_A.weight missing") != std::string::npos);
  }
  c.rank = 0;
  CHECK_THROWS_WITH_AS(lora_adapter::init(cfg, c, 1, cpu_backend()), doctest::Contains("rank must be at least 1"),
                       model_error);
  c.rank = 2;
  c.alpha = std::nanf("");
  CHECK_THROWS_WITH_AS(lora_adapter::init(cfg, c, 1, cpu_backend()), doctest::Contains("alpha"), model_error);
}

TEST_CASE("lora: a mixture of experts' attention is adapted, its experts are not") {
  tiny_model_options o;
  o.family = "MixtralForCausalLM";
  const model_config cfg = tiny_config(o);
  REQUIRE(cfg.is_moe());
  lora_config c;
  c.targets = {"all-linear"};
  CHECK(lora_adapter::init(cfg, c, 1, cpu_backend()).modules().size() == 4u);
  c.targets = {"up_proj"};
  CHECK_THROWS_WITH_AS(lora_adapter::init(cfg, c, 1, cpu_backend()), doctest::Contains("mixture of experts"),
                       model_error);
}
