// `corolla finetune` with bad input: one "corolla: error: ..." line and
// status 1 (the runs themselves are in tests/actors/mp_swarm_finetune.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/whole_file.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;

namespace {

/// A tiny model in `model` and 4096 raw uint16 tokens of it in `data`.
void write_model_and_data(const std::string& model, const std::string& data) {
  testing::write_tiny_model(model, {});
  std::ofstream out(data, std::ios::binary);
  for (std::uint16_t i = 0; i < 4096; ++i) {
    const std::uint16_t id = static_cast<std::uint16_t>(i % 60);  // the tiny vocabulary has 64 ids
    out.write(reinterpret_cast<const char*>(&id), sizeof id);
  }
}

}  // namespace

TEST_CASE("finetune: a device for a swarm run, or one this build cannot use, is one clear error") {
  testing::temp_dir_guard dir("cli-finetune");
  const std::string model = (dir / "model").string();
  const std::string data = (dir / "data.bin").string();
  write_model_and_data(model, data);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"finetune", "--model", model, "--data", data, "--steps", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_corolla(args, std::chrono::seconds(60));
  };
  testing::check_one_error(run({"--swarm", "127.0.0.1:1", "--device", "cuda"}),
                           "--device cuda places --local's blocks; with a swarm the servers compute");
  testing::check_one_error(run({"--local", "--device", "tpu"}), "unknown device 'tpu'");
  testing::check_one_error(run({"--local", "--device", "cuda:7"}), "cuda:7");
  testing::check_one_error(run({"--local", "--lr", "nan"}), "--lr must be a finite number >= 0, got nan");
  testing::check_one_error(run({"--local", "--lr", "-1"}), "--lr must be a finite number >= 0, got -1");
}

TEST_CASE("finetune: prompts that diverge are not saved over the file") {
  testing::temp_dir_guard dir("cli-finetune-diverge");
  const std::string model = (dir / "model").string();
  const std::string data = (dir / "data.bin").string();
  write_model_and_data(model, data);
  const std::string prompts = (dir / "prompts.safetensors").string();
  std::ofstream(prompts) << "the user's earlier prompts";
  // A finite rate so large that the prompts overflow to inf and the loss to NaN.
  const auto r = testing::run_corolla({"finetune", "--model", model, "--data", data, "--steps", "3", "--seq", "16", "--local", "--lr",
                                       "3e38", "--save", prompts},
                                      std::chrono::seconds(60));
  INFO("stdout: " << r.out << "stderr: " << r.err);
  CHECK(r.exit_code == 1);
  REQUIRE_FALSE(r.err_lines().empty());
  CHECK(r.err_lines().back() == "corolla: error: the loss of step 3 is not finite: training diverged and nothing "
                                "is saved (" + prompts + " is unchanged)");
  CHECK(read_whole_file(prompts) == "the user's earlier prompts");

  // An adapter that diverges leaves its directory as it was too.
  const std::string adapter = (dir / "adapter").string();
  const auto l = testing::run_corolla({"finetune", "--model", model, "--data", data, "--steps", "3", "--seq", "16",
                                       "--local", "--lr", "3e38", "--lora-rank", "2", "--save-adapter", adapter},
                                      std::chrono::seconds(60));
  INFO("stdout: " << l.out << "stderr: " << l.err);
  CHECK(l.exit_code == 1);
  REQUIRE_FALSE(l.err_lines().empty());
  CHECK(l.err_lines().back() == "corolla: error: the loss of step 3 is not finite: training diverged and nothing "
                                "is saved (" + adapter + " is unchanged)");
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(adapter) / "adapter_config.json"));
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(adapter) / "adapter_model.safetensors"));
}

TEST_CASE("finetune: LoRA flags that do not go together are one clear error before anything loads") {
  testing::temp_dir_guard dir("cli-finetune-lora");
  const std::string model = (dir / "model").string();
  const std::string data = (dir / "data.bin").string();
  write_model_and_data(model, data);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"finetune", "--model", model, "--data", data, "--steps", "1", "--local"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_corolla(args, std::chrono::seconds(60));
  };
  testing::check_one_error(run({"--tuning", "none"}),
                           "--tuning none trains no prompts: add --lora-rank R or --adapter DIR to train an adapter");
  testing::check_one_error(run({"--tuning", "wide"}), "--tuning must be deep, shallow or none, got 'wide'");
  testing::check_one_error(run({"--lora-alpha", "8"}),
                           "--lora-alpha, --lora-targets and --lora-rslora shape an adapter: add --lora-rank R");
  testing::check_one_error(run({"--lora-rank", "4", "--adapter", model}),
                           "--lora-rank makes a new adapter and --adapter trains on a saved one: give one of them");
  testing::check_one_error(run({"--adapter", model, "--lora-rslora"}),
                           "--adapter trains on with the saved adapter's own alpha and targets");
  testing::check_one_error(run({"--lora-rank", "4", "--save", (dir / "p.safetensors").string()}),
                           "--save writes trained prompts and none train (--tuning none): --save-adapter DIR");
  testing::check_one_error(run({"--save-adapter", (dir / "x").string()}),
                           "--save-adapter writes a trained LoRA adapter: add --lora-rank R or --adapter DIR");
  testing::check_one_error(run({"--lora-rank", "129"}), "--lora-rank 129: servers take adapters of rank at most 128");
  testing::check_one_error(run({"--lora-rank", "4", "--lora-targets", "nonesuch"}), "LoRA target 'nonesuch' names no module");
  // A rank-2 adapter with deep prompts beside it trains, and --json says both.
  const auto both = run({"--lora-rank", "2", "--tuning", "deep", "--prompt-len", "2", "--seq", "8", "--json"});
  INFO("stderr: " << both.err);
  REQUIRE(both.exit_code == 0);
  const auto j = nlohmann::json::parse(both.out_lines().back());
  CHECK(j["tuning"] == "deep");
  CHECK(j["prompt_len"] == 2);
  CHECK(j["adapter"]["rank"] == 2);
  CHECK(j["adapter"]["parameters"].get<long long>() > 0);
}

TEST_CASE("finetune: a run resumed from its checkpoint prints the uninterrupted run's losses, and another run's is refused") {
  testing::temp_dir_guard dir("cli-finetune-resume");
  const std::string model = (dir / "model").string();
  const std::string data = (dir / "data.bin").string();
  write_model_and_data(model, data);
  const std::string state = (dir / "state").string();
  auto run = [&](std::vector<std::string> extra, const std::string& lr = "0.03") {
    std::vector<std::string> args{"finetune", "--model", model,  "--data",      data,  "--local", "--device", "cpu",
                                  "--seq",    "8",     "--lr",   lr,            "--lora-rank", "2", "--tuning",
                                  "deep",     "--prompt-len", "2", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_corolla(args, std::chrono::seconds(60));
  };
  const auto json_of = [](const testing::process_result& r) {
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out_lines().back());
  };
  const auto straight = json_of(run({"--steps", "6", "--save-adapter", (dir / "straight").string()}));
  const auto first = json_of(run({"--steps", "3", "--checkpoint-dir", state}));
  CHECK(first["checkpoint"]["file"] == (std::filesystem::path(state) / "finetune_state.safetensors").string());
  CHECK(first["checkpoint"]["step"] == 3);
  const auto rest = json_of(run({"--steps", "6", "--checkpoint-dir", state, "--resume", "--save-adapter",
                                 (dir / "resumed").string()}));
  CHECK(rest["first_step"] == 4);
  REQUIRE(straight["losses"].size() == 6u);
  REQUIRE(first["losses"].size() == 3u);
  REQUIRE(rest["losses"].size() == 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(first["losses"][i] == straight["losses"][i]);
    CHECK(rest["losses"][i] == straight["losses"][i + 3]);
  }
  // The adapters they save hold the same values.
  CHECK(read_whole_file(dir / "straight" / "adapter_model.safetensors") ==
        read_whole_file(dir / "resumed" / "adapter_model.safetensors"));

  // Another run's checkpoint: one clear error naming what differs.
  testing::check_one_error(run({"--steps", "6", "--checkpoint-dir", state, "--resume", "--batch", "2"}),
                           "was written by another run: its batch is '4', this run's '2'");
  testing::check_one_error(run({"--steps", "3", "--checkpoint-dir", state, "--resume"}),
                           "is at step 6, and --steps 3 leaves nothing to train");
  testing::check_one_error(run({"--steps", "6", "--resume"}), "--resume needs --checkpoint-dir DIR");
  testing::check_one_error(run({"--steps", "6", "--checkpoint-dir", (dir / "empty").string(), "--resume"}),
                           "finetune_state.safetensors does not exist");
  testing::check_one_error(run({"--steps", "6", "--checkpoint-dir", (dir / "model" / "state").string()}),
                           "is inside the model directory");
  testing::check_one_error(run({"--steps", "6", "--checkpoint-dir", state, "--resume"}, "0.0300001"),
                           "its lr is '0.03', this run's '0.0300001'");

  // A run that diverges (at this rate the state overflows after step 4)
  // keeps its last finite state, which a resumed run takes up.
  const std::string diverged = (dir / "diverged").string();
  const auto d = run({"--steps", "5", "--checkpoint-dir", diverged, "--checkpoint-every", "1"}, "1e37");
  INFO("stderr: " << d.err);
  REQUIRE(d.exit_code == 0);
  CHECK(d.err.find("is not finite: " + diverged + "/finetune_state.safetensors is left as it was") != std::string::npos);
  const auto dj = nlohmann::json::parse(d.out_lines().back());
  REQUIRE(dj.contains("checkpoint"));
  const int kept = dj["checkpoint"]["step"].get<int>();
  CHECK(kept >= 1);
  CHECK(kept < 5);
  const auto again = json_of(run({"--steps", "6", "--checkpoint-dir", diverged, "--resume"}, "1e37"));
  CHECK(again["first_step"] == kept + 1);
}
