// `corolla generate`, run as a real process: its ids equal the library's
// generation, text streams through the tokenizer, and bad input ends with
// exactly one "corolla: error: ..." line and exit status 1 (never a signal).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/generator.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

std::vector<std::int32_t> parse_ids(const std::string& line) {
  std::vector<std::int32_t> ids;
  std::istringstream in(line);
  std::int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

std::vector<std::int32_t> library_generate(const fs::path& dir,
                                           const std::vector<std::int32_t>& prompt,
                                           const generation_params& p,
                                           weight_format weights = weight_format::f32, dtype kv = dtype::f32) {
  transformer model = transformer::load(dir, cpu_backend());
  generator gen(model, 0, weights, kv);
  return gen.generate(prompt, p).tokens;
}

/// The run failed the way a user should see it: one error line, status 1.
void rewrite_weights(const fs::path& dir,
                     const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  auto all = testing::read_all_f32(dir);
  checkpoint ck = checkpoint::open(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, values] : all)
    tensors.emplace_back(name, Tensor::from_f32(values, ck.info(name).shape));
  edit(tensors);
  fs::remove(dir / "model.safetensors");
  write_safetensors(dir / "model.safetensors", tensors);
}

std::vector<std::string> generate_args(const fs::path& dir, std::vector<std::string> extra) {
  std::vector<std::string> args{"generate", "--model", dir.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("generate --print-ids prints the library's greedy generation") {
  for (auto arch : {architecture::llama, architecture::gpt2}) {
    testing::temp_dir_guard dir("cli-ids");
    testing::tiny_model_options o;
    o.arch = arch;
    if (arch == architecture::gpt2) o.kv_heads = o.heads;
    testing::write_tiny_model(dir.path(), o);
    auto r = testing::run_corolla(generate_args(
        dir.path(), {"--prompt-ids", "3,17,42,8", "--max-new-tokens", "12", "--print-ids"}));
    INFO("stderr: " << r.err);
    REQUIRE(r.exited());
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.empty());
    const auto lines = r.out_lines();
    REQUIRE(!lines.empty());
    generation_params p;
    p.max_new_tokens = 12;
    const auto expected = library_generate(dir.path(), {3, 17, 42, 8}, p);
    CHECK(expected.size() == 12);
    CHECK(parse_ids(lines.back()) == expected);
  }
}

TEST_CASE("generate --prompts prints the library's generation after the trained deep prompts") {
  testing::temp_dir_guard dir("cli-prompts");
  testing::write_tiny_model(dir.path(), {});
  const model_config cfg = load_config(dir.path());
  // What corolla finetune --save writes: deep_prompts [layers, P, D].
  std::vector<float> values(static_cast<std::size_t>(cfg.n_layers) * 3 * cfg.hidden_size);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
  const Tensor prompts = Tensor::from_f32(values, {cfg.n_layers, 3, cfg.hidden_size});
  const fs::path file = dir / "prompts.safetensors";
  write_safetensors(file, {{"deep_prompts", prompts}});
  auto r = testing::run_corolla(generate_args(
      dir.path(), {"--prompt-ids", "3,17,42,8", "--max-new-tokens", "10", "--print-ids", "--prompts", file.string()}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  transformer model = transformer::load(dir.path(), cpu_backend());
  generator gen(model);
  gen.set_deep_prompts(prompts);
  generation_params p;
  p.max_new_tokens = 10;
  const std::vector<std::int32_t> ids{3, 17, 42, 8};
  CHECK(parse_ids(r.out_lines().back()) == gen.generate(ids, p).tokens);

  // A file without them and a wrong shape are one clear error each, with
  // --swarm too, before any server is contacted.
  const fs::path other = dir / "other.safetensors";
  write_safetensors(other, {{"something_else", prompts}});
  testing::check_one_error(testing::run_corolla(generate_args(dir.path(), {"--prompt-ids", "1", "--prompts", other.string()})),
                           "has no 'deep_prompts' tensor");
  const fs::path wrong = dir / "wrong.safetensors";
  write_safetensors(wrong, {{"deep_prompts", Tensor::zeros({cfg.n_layers + 1, 3, cfg.hidden_size})}});
  testing::check_one_error(testing::run_corolla(generate_args(dir.path(), {"--prompt-ids", "1", "--prompts", wrong.string()})),
                           "the model needs");
  testing::check_one_error(
      testing::run_corolla(generate_args(dir.path(), {"--prompt-ids", "1", "--prompts", wrong.string(), "--swarm",
                                                      "127.0.0.1:1"})),
      "the model needs");
  // spdlog would read an unknown level as "off" and silence every line.
  testing::check_one_error(testing::run_corolla(generate_args(dir.path(), {"--prompt-ids", "1", "--log-level", "loud"})),
                           "--log-level must be trace, debug, info, warn, error, critical or off, got 'loud'");
  // The same for the environment's level, which every process reads.
  ::setenv("COROLLA_LOG_LEVEL", "loud", 1);
  const testing::process_result env = testing::run_corolla(generate_args(dir.path(), {"--prompt-ids", "1"}));
  ::unsetenv("COROLLA_LOG_LEVEL");
  testing::check_one_error(env, "COROLLA_LOG_LEVEL must be trace, debug, info, warn, error, critical or off, got 'loud'");
}

TEST_CASE("generate --kv-dtype bf16 prints the library's generation on a bf16 KV cache") {
  testing::temp_dir_guard dir("cli-kv16");
  testing::write_tiny_model(dir.path(), {});
  auto r = testing::run_corolla(generate_args(
      dir.path(), {"--prompt-ids", "3,17,42,8", "--max-new-tokens", "12", "--print-ids", "--kv-dtype", "bf16"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exited());
  REQUIRE(r.exit_code == 0);
  generation_params p;
  p.max_new_tokens = 12;
  const auto expected = library_generate(dir.path(), {3, 17, 42, 8}, p, weight_format::f32, dtype::bf16);
  CHECK(expected.size() == 12);
  CHECK(parse_ids(r.out_lines().back()) == expected);
}

TEST_CASE("generate --weights bf16 prints the library's bf16-weight generation") {
  for (auto arch : {architecture::llama, architecture::gpt2}) {
    testing::temp_dir_guard dir("cli-bf16");
    testing::tiny_model_options o;
    o.arch = arch;
    if (arch == architecture::gpt2) o.kv_heads = o.heads;
    testing::write_tiny_model(dir.path(), o);
    auto r = testing::run_corolla(
        generate_args(dir.path(), {"--prompt-ids", "3,17,42,8", "--max-new-tokens", "12",
                                   "--print-ids", "--weights", "bf16"}));
    INFO("stderr: " << r.err);
    REQUIRE(r.exited());
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.empty());
    generation_params p;
    p.max_new_tokens = 12;
    const auto expected = library_generate(dir.path(), {3, 17, 42, 8}, p, weight_format::bf16);
    CHECK(expected.size() == 12);
    CHECK(parse_ids(r.out_lines().back()) == expected);
  }
}

TEST_CASE("generate --print-ids prints the library's generation for Mixtral and Qwen3-MoE models") {
  for (const char* family : {"MixtralForCausalLM", "Qwen3MoeForCausalLM"}) {
    CAPTURE(family);
    testing::temp_dir_guard dir("cli-moe");
    testing::tiny_model_options o;
    o.family = family;
    o.init_std = 0.6f;
    testing::write_tiny_model(dir.path(), o);
    REQUIRE(load_config(dir.path()).is_moe());
    for (const char* weights : {"f32", "int8"}) {
      CAPTURE(weights);
      auto r = testing::run_corolla(generate_args(
          dir.path(), {"--prompt-ids", "3,17,42,8", "--max-new-tokens", "12", "--print-ids", "--weights", weights}));
      INFO("stderr: " << r.err);
      REQUIRE(r.exited());
      REQUIRE(r.exit_code == 0);
      CHECK(r.err.empty());
      generation_params p;
      p.max_new_tokens = 12;
      const auto expected = library_generate(dir.path(), {3, 17, 42, 8}, p, *weight_format_named(weights));
      CHECK(expected.size() == 12);
      REQUIRE(!r.out_lines().empty());
      CHECK(parse_ids(r.out_lines().back()) == expected);
    }
  }
}

TEST_CASE("generate samples as the library does for a seed") {
  testing::temp_dir_guard dir("cli-sample");
  testing::write_tiny_model(dir.path(), {});
  auto r = testing::run_corolla(generate_args(
      dir.path(), {"--prompt-ids", "1, 2, 3", "--max-new-tokens", "10", "--temperature", "0.8",
                   "--top-k", "12", "--top-p", "0.9", "--seed", "77", "--print-ids", "--threads",
                   "1"}));
  REQUIRE(r.exit_code == 0);
  generation_params p;
  p.max_new_tokens = 10;
  p.sampling = {0.8f, 12, 0.9f, 77};
  CHECK(parse_ids(r.out_lines().back()) == library_generate(dir.path(), {1, 2, 3}, p));
}

TEST_CASE("generate --prompt streams the text of the generated ids") {
  testing::temp_dir_guard dir("cli-text");
  testing::tiny_model_options o;
  o.vocab = 200;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(dir.path(), o);
  const std::string text = "the cat sat on the mat";
  auto r = testing::run_corolla(generate_args(
      dir.path(), {"--prompt", text, "--max-new-tokens", "16", "--ignore-eos", "--print-ids"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  auto tok = load_tokenizer(dir.path());
  generation_params p;
  p.max_new_tokens = 16;
  p.ignore_eos = true;
  const auto ids = library_generate(dir.path(), tok->encode(text, true), p);
  const auto lines = r.out_lines();
  REQUIRE(lines.size() >= 2);
  CHECK(parse_ids(lines.back()) == ids);
  // Everything before the ids line is the decoded continuation.
  const std::string shown = r.out.substr(0, r.out.size() - lines.back().size() - 1);
  CHECK(shown == tok->decode(ids) + "\n");
}

TEST_CASE("generate stops at the model context and says so") {
  testing::temp_dir_guard dir("cli-context");
  testing::write_tiny_model(dir.path(), {});  // context 64
  std::string prompt;
  for (int i = 0; i < 60; ++i) prompt += std::to_string(i % 64) + ",";
  prompt.pop_back();
  auto r = testing::run_corolla(
      generate_args(dir.path(), {"--prompt-ids", prompt, "--max-new-tokens", "10", "--print-ids"}));
  REQUIRE(r.exit_code == 0);
  CHECK(parse_ids(r.out_lines().back()).size() == 4);
  REQUIRE(r.err_lines().size() == 1);
  CHECK(r.err_lines()[0] ==
        "corolla: note: stopped after 4 new tokens at the model context of 64 tokens");
}

TEST_CASE("generate reports bad input with one error line and status 1") {
  testing::temp_dir_guard dir("cli-errors");
  const fs::path model = dir / "model";
  auto fresh = [&] {
    fs::remove_all(model);
    testing::write_tiny_model(model, {});
  };
  const std::vector<std::string> ok_prompt{"--prompt-ids", "1,2,3", "--max-new-tokens", "2"};

  SUBCASE("missing model directory") {
    testing::check_one_error(testing::run_corolla(generate_args(dir / "nowhere", ok_prompt)),
                    "does not exist");
  }
  SUBCASE("truncated model.safetensors") {
    fresh();
    fs::resize_file(model / "model.safetensors", fs::file_size(model / "model.safetensors") / 2);
    testing::check_one_error(testing::run_corolla(generate_args(model, ok_prompt)), "truncated");
  }
  SUBCASE("a tensor missing") {
    fresh();
    rewrite_weights(model, [](auto& tensors) {
      std::erase_if(tensors, [](const auto& t) { return t.first == "model.layers.1.mlp.up_proj.weight"; });
    });
    testing::check_one_error(testing::run_corolla(generate_args(model, ok_prompt)),
                    "model.layers.1.mlp.up_proj.weight");
  }
  SUBCASE("a tensor with the wrong shape") {
    fresh();
    rewrite_weights(model, [](auto& tensors) {
      for (auto& [name, t] : tensors)
        if (name == "model.layers.0.self_attn.k_proj.weight") t = Tensor::zeros({16, 31});
    });
    testing::check_one_error(testing::run_corolla(generate_args(model, ok_prompt)),
                    "model.layers.0.self_attn.k_proj.weight");
  }
  SUBCASE("a NaN in the weights: an error, not a stream of token 0") {
    fresh();
    rewrite_weights(model, [](auto& tensors) {
      for (auto& [name, t] : tensors)
        if (name == "model.layers.1.mlp.down_proj.weight") t.template data<float>()[3] = std::nanf("");
    });
    testing::check_one_error(testing::run_corolla(generate_args(model, ok_prompt)), "logits are not finite");
  }
  SUBCASE("unknown architecture in config.json") {
    fresh();
    nlohmann::json j;
    std::ifstream(model / "config.json") >> j;
    j["architectures"] = {"FalconForCausalLM"};
    std::ofstream(model / "config.json") << j.dump();
    testing::check_one_error(testing::run_corolla(generate_args(model, ok_prompt)), "FalconForCausalLM");
  }
  SUBCASE("prompt id outside the vocabulary") {
    fresh();
    testing::check_one_error(testing::run_corolla(generate_args(model, {"--prompt-ids", "1,64"})),
                    "prompt id 64 is outside the vocabulary (64 tokens)");
  }
  SUBCASE("prompt longer than the context") {
    fresh();
    std::string prompt;
    for (int i = 0; i < 65; ++i) prompt += std::to_string(i % 64) + ",";
    prompt.pop_back();
    testing::check_one_error(testing::run_corolla(generate_args(model, {"--prompt-ids", prompt})),
                    "prompt of 65 tokens exceeds the model context of 64");
  }
  SUBCASE("--prompt without a tokenizer") {
    fresh();
    testing::check_one_error(testing::run_corolla(generate_args(model, {"--prompt", "hello"})),
                    "--prompt needs a tokenizer");
  }
  SUBCASE("prompt ids that are not numbers") {
    fresh();
    testing::check_one_error(testing::run_corolla(generate_args(model, {"--prompt-ids", "1,x"})),
                    "'x' is not a token id");
  }
  SUBCASE("neither --prompt nor --prompt-ids") {
    fresh();
    testing::check_one_error(testing::run_corolla(generate_args(model, {})), "--prompt");
  }
  SUBCASE("a --weights dtype that is neither f32 nor bf16") {
    fresh();
    testing::check_one_error(
        testing::run_corolla(generate_args(model, {"--prompt-ids", "1", "--weights", "f16"})),
        "--weights must be f32, bf16, int8 or nf4, got 'f16'");
    testing::check_one_error(
        testing::run_corolla(generate_args(model, {"--prompt-ids", "1", "--kv-dtype", "fp8"})),
        "--kv-dtype must be f32, bf16 or f16, got 'fp8'");
  }
  SUBCASE("a device this build cannot use") {
    fresh();
    testing::check_one_error(testing::run_corolla(generate_args(model, {"--prompt-ids", "1", "--device", "tpu"})),
                    "unknown device 'tpu'");
    testing::check_one_error(
        testing::run_corolla(generate_args(model, {"--prompt-ids", "1", "--device", "cuda:7"})),
        "cuda:7");
    // With --swarm the head stays on the cpu: a device there is refused
    // (before any connection), and auto is the cpu.
    testing::check_one_error(
        testing::run_corolla(generate_args(model, {"--prompt-ids", "1", "--swarm", "127.0.0.1:1", "--device", "cuda"})),
        "--device cuda: with --swarm the client's head runs on the cpu");
  }
}
