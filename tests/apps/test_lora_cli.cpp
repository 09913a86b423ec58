// LoRA adapters through the real binary: `corolla train --lora-rank` prints
// the library's adapter losses and saves a PEFT directory, leaving the model
// untouched; `generate --adapter` prints the library's generation of the
// merged model; `train --adapter` goes on from the saved adapter; flags that
// cannot go together are refused with one error line.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;
namespace fs = std::filesystem;

tiny_model_options tiny_gpt2() {
  tiny_model_options o = tiny_options_for(architecture::gpt2, 32);
  o.init_std = 0.05f;
  return o;
}

void write_pattern(const fs::path& file) {
  std::vector<std::uint16_t> t(400);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint16_t>((i * 7 + i / 5) % 64);
  write_raw_u16(file, t);
}

/// The --json step lines' losses, and the summary (the last line).
std::vector<double> json_losses(const process_result& r, nlohmann::json& summary) {
  std::vector<double> losses;
  for (const std::string& l : r.out_lines()) {
    const nlohmann::json j = nlohmann::json::parse(l);
    if (j.contains("final_loss") || j.contains("fresh_init"))
      summary = j;
    else
      losses.push_back(j.at("loss").get<double>());
  }
  return losses;
}

/// The library's run of what the CLI is asked: an adapter (new, or `from`)
/// trained 20 steps of 2 x 16 at lr 3e-2, seed 4, beside the model's
/// weights loaded as `f`. Returns its losses.
std::vector<float> library_losses(const fs::path& model_dir, const fs::path& data_file, lora_adapter& a,
                                  weight_format f = weight_format::f32) {
  transformer model = f == weight_format::f32 ? transformer::load(model_dir, cpu_backend())
                                              : transformer::load_inference(model_dir, cpu_backend(), f);
  token_dataset data = token_dataset::open(data_file, nullptr, model.config().vocab_size);
  train_options o;
  o.batch = 2;
  o.seq = 16;
  o.steps = 20;
  o.optimizer.adamw.lr = 3e-2f;
  o.adapter = &a;
  trainer t(model, data, o);
  return t.run().losses;
}

std::vector<std::string> train_args(const fs::path& model, const fs::path& data, std::vector<std::string> extra) {
  std::vector<std::string> args{"train", "--model", model.string(), "--data", data.string(), "--batch", "2",
                                "--seq", "16", "--steps", "20", "--lr", "3e-2", "--seed", "4", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::int32_t> last_ids(const process_result& r) {
  const auto lines = r.out_lines();
  REQUIRE(!lines.empty());
  std::istringstream in(lines.back());
  std::vector<std::int32_t> ids;
  for (std::int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

}  // namespace

TEST_CASE("corolla train --lora-rank trains an adapter, the library's losses, and generate --adapter runs the merged model") {
  temp_dir_guard tmp("cli-lora");
  const fs::path base = tmp / "gpt2", data = tmp / "tokens.bin", saved = tmp / "adapter";
  write_tiny_model(base, tiny_gpt2());
  write_pattern(data);
  const std::string weights_before = read_whole_file(base / "model.safetensors");

  const process_result r = run_corolla(
      train_args(base, data, {"--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "c_attn,c_fc", "--save", saved}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json summary;
  const std::vector<double> cli = json_losses(r, summary);
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  c.targets = {"c_attn", "c_fc"};
  const model_config cfg = load_config(base);
  lora_adapter mine = lora_adapter::init(cfg, c, 4, cpu_backend());
  const std::vector<float> lib = library_losses(base, data, mine);
  REQUIRE(cli.size() == lib.size());
  for (std::size_t i = 0; i < cli.size(); ++i) CHECK(std::abs(cli[i] - lib[i]) < 5e-6);
  CHECK(cli.back() < cli.front());
  CHECK(summary["adapter"]["rank"] == 4);
  CHECK(summary["adapter"]["targets"] == nlohmann::json::array({"attn.c_attn", "mlp.c_fc"}));
  CHECK(summary["adapter"]["parameters"] == mine.numel());
  CHECK(read_whole_file(base / "model.safetensors") == weights_before);  // the model is not touched
  REQUIRE(fs::exists(saved / "adapter_config.json"));
  REQUIRE(fs::exists(saved / "adapter_model.safetensors"));
  CHECK_FALSE(fs::exists(saved / "model.safetensors"));

  // generate --adapter: the library's greedy generation of the merged model.
  const process_result gen = run_corolla({"generate", "--model", base.string(), "--adapter", saved.string(),
                                          "--prompt-ids", "7,14,21", "--max-new-tokens", "10", "--print-ids"});
  INFO("generate stderr: " << gen.err);
  REQUIRE(gen.exit_code == 0);
  auto loaded = std::make_shared<lora_adapter>(lora_adapter::load(saved, cfg, cpu_backend()));
  transformer merged = transformer::load(base, cpu_backend(), {}, loaded);
  generation_params p;
  p.max_new_tokens = 10;
  const std::vector<std::int32_t> want = generator(merged).generate(std::vector<std::int32_t>{7, 14, 21}, p).tokens;
  CHECK(last_ids(gen) == want);
  const process_result plain = run_corolla({"generate", "--model", base.string(), "--prompt-ids", "7,14,21",
                                            "--max-new-tokens", "10", "--print-ids"});
  REQUIRE(plain.exit_code == 0);
  CHECK(last_ids(plain) != want);  // the adapter changed what it says

  // train --adapter: on from the saved adapter, as the library goes on.
  const process_result again = run_corolla(train_args(base, data, {"--adapter", saved, "--save", tmp / "adapter2"}));
  INFO("again stderr: " << again.err);
  REQUIRE(again.exit_code == 0);
  nlohmann::json s2;
  const std::vector<double> cli2 = json_losses(again, s2);
  lora_adapter from = lora_adapter::load(saved, cfg, cpu_backend());
  const std::vector<float> lib2 = library_losses(base, data, from);
  REQUIRE(cli2.size() == lib2.size());
  for (std::size_t i = 0; i < cli2.size(); ++i) CHECK(std::abs(cli2[i] - lib2[i]) < 5e-6);
  CHECK(cli2.front() < cli.front() - 1e-3);  // it starts where the first run left off
}

TEST_CASE("corolla train --lora-rank --weights nf4 trains the adapter beside nf4 weights (QLoRA), the library's losses") {
  temp_dir_guard tmp("cli-qlora");
  const fs::path base = tmp / "gpt2", data = tmp / "tokens.bin", saved = tmp / "adapter";
  write_tiny_model(base, tiny_gpt2());
  write_pattern(data);
  const process_result r = run_corolla(
      train_args(base, data, {"--lora-rank", "4", "--lora-targets", "c_attn,c_fc", "--weights", "nf4", "--save", saved}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json summary;
  const std::vector<double> cli = json_losses(r, summary);
  CHECK(summary["adapter"]["base_weights"] == "nf4");
  lora_config c;
  c.rank = 4;
  c.alpha = 4.0f;
  c.targets = {"c_attn", "c_fc"};
  const model_config cfg = load_config(base);
  lora_adapter mine = lora_adapter::init(cfg, c, 4, cpu_backend());
  const std::vector<float> lib = library_losses(base, data, mine, weight_format::nf4);
  REQUIRE(cli.size() == lib.size());
  for (std::size_t i = 0; i < cli.size(); ++i) CHECK(std::abs(cli[i] - lib[i]) < 5e-6);
  CHECK(cli.back() < cli.front());
  // Not the f32 base's run: the nf4 weights are what it trained beside.
  lora_adapter on_f32 = lora_adapter::init(cfg, c, 4, cpu_backend());
  CHECK(std::abs(library_losses(base, data, on_f32).front() - cli.front()) > 1e-4);
  REQUIRE(fs::exists(saved / "adapter_model.safetensors"));
  const lora_adapter back = lora_adapter::load(saved, cfg, cpu_backend());
  CHECK(back.digest() == mine.digest());  // the library's adapter, saved
}

TEST_CASE("corolla train, generate and serve refuse adapter flags that cannot apply, with one error line") {
  temp_dir_guard tmp("cli-lora-bad");
  const fs::path base = tmp / "gpt2", data = tmp / "tokens.bin";
  write_tiny_model(base, tiny_gpt2());
  write_pattern(data);
  fs::create_directories(tmp / "config-only");
  fs::copy_file(base / "config.json", tmp / "config-only" / "config.json");
  struct bad_case {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<bad_case> cases = {
      {train_args(base, data, {"--lora-alpha", "8"}), "add --lora-rank R"},
      // Distributed LoRA jobs (tests/apps/mp_train_lora.cpp) refuse these
      // before any rank starts.
      {train_args(base, data, {"--lora-rank", "4", "--join", "127.0.0.1:5555"}), "drop them beside --join"},
      {train_args(base, data, {"--weights", "nf4", "--join", "127.0.0.1:5555"}), "drop it beside --join"},
      {train_args(base, data, {"--lora-rank", "4", "--pp", "2", "--weights", "nf4", "--compute", "bf16"}),
       "computes in f32"},
      {train_args(base, data, {"--lora-rank", "4", "--pp", "2", "--lora-targets", "q_proj"}), "names no module"},
      {train_args(tmp / "config-only", data, {"--lora-rank", "4", "--dp", "2"}), "holds no weights"},
      {train_args(base, data, {"--adapter", tmp / "absent", "--pp", "2"}), "does not exist"},
      {train_args(base, data, {"--weights", "nf4"}), "carry an adapter"},
      {train_args(base, data, {"--lora-rank", "4", "--weights", "int8", "--compute", "bf16"}), "computes in f32"},
      {train_args(base, data, {"--lora-rank", "4", "--weights", "int4"}), "int4"},
      {train_args(base, data, {"--lora-rank", "4", "--adapter", tmp / "a"}), "give one of them"},
      {train_args(base, data, {"--adapter", tmp / "a", "--lora-alpha", "4"}), "the saved adapter's own alpha"},
      {train_args(tmp / "config-only", data, {"--lora-rank", "4"}), "holds no weights"},
      {train_args(base, data, {"--lora-rank", "4", "--lora-targets", "q_proj"}), "names no module"},
      {train_args(base, data, {"--adapter", tmp / "absent"}), "does not exist"},
      {{"generate", "--model", base.string(), "--adapter", (tmp / "absent").string(), "--prompt-ids", "1"},
       "does not exist"},
      {{"serve", "--model", base.string(), "--blocks", "0:1", "--no-dht", "--adapter", (tmp / "absent").string()},
       "does not exist"},
      {{"serve", "--model", base.string(), "--blocks", "0:1", "--no-dht", "--adapter", "=" + (tmp / "a").string()},
       "the adapter needs a name"},
      {{"serve", "--model", base.string(), "--blocks", "0:1", "--no-dht", "--adapter", "my lora=" + (tmp / "a").string()},
       "has a space"},
      {{"serve", "--model", base.string(), "--blocks", "0:1", "--no-dht", "--adapter", "a@b=" + (tmp / "a").string()},
       "'@' (clients write NAME@DIGEST)"},
      {{"serve", "--model", base.string(), "--blocks", "0:1", "--no-dht", "--adapter", "."}, "is no name"},
  };
  for (const bad_case& c : cases) {
    const process_result r = run_corolla(c.args);
    INFO(c.mentions << ": stderr = " << r.err);
    CHECK(r.exit_code == 1);
    const std::vector<std::string> err = r.err_lines();
    REQUIRE(err.size() == 1u);
    CHECK(err[0].rfind("corolla: error: ", 0) == 0);
    CHECK(err[0].find(c.mentions) != std::string::npos);
  }
}
