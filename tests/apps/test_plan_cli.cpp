// `corolla plan` end to end: tables, JSON, and the infeasible error.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using corolla::testing::run_corolla;

namespace {

std::string example(const std::string& name) {
  return (std::filesystem::path(COROLLA_SOURCE_DIR) / "docs" / "clusters" / name).string();
}

}  // namespace

TEST_CASE("corolla plan prints the plan and both baselines") {
  auto r = run_corolla({"plan", "--cluster", example("three_clusters.toml"), "--model",
                        example("models/llama2-7b.json")});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("cluster three-clusters") != std::string::npos);
  CHECK(r.out.find("plan: PP ") != std::string::npos);
  CHECK(r.out.find("predicted step: ") != std::string::npos);
  CHECK(r.out.find("Holmes rule (NIC-sorted, layers by TFLOP/s)") != std::string::npos);
  CHECK(r.out.find("naive (file order, even split)") != std::string::npos);
  CHECK(r.out.find("planner ") != std::string::npos);
}

TEST_CASE("corolla plan --json prints one object with the plan, baselines and speedups") {
  corolla::testing::temp_dir_guard dir("plan-cli");
  std::filesystem::copy_file(example("models/gpt-7.5b.json"), dir / "config.json");
  auto r = run_corolla({"plan", "--cluster", example("unequal_gpus.toml"), "--model", dir.path().string(),
                        "--global-batch", "64", "--json"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["plan"]["feasible"] == true);
  CHECK(j["plan"]["tp"] == 1);
  int pp = j["plan"]["pp"], dp = j["plan"]["dp"];
  CHECK(static_cast<int>(j["plan"]["stages"].size()) == pp);
  CHECK(j["plan"]["micro_batches"].get<int>() * dp == 64);
  CHECK(j["baselines"]["holmes"]["pp"] == pp);
  CHECK(j["speedup"]["vs_holmes"].get<double>() >= 1.0);
  CHECK(j["speedup"]["vs_naive"].get<double>() >= 1.0);
  int layers = 0;
  for (const auto& s : j["plan"]["stages"]) {
    CHECK(s["first_layer"] == layers);
    layers = s["last_layer"];
    CHECK(s["cluster"] == "dc");
    CHECK(s["nic"] == "ib");
  }
  CHECK(layers == 36);
}

TEST_CASE("corolla plan rejects a job that fits nowhere with the reason") {
  corolla::testing::temp_dir_guard dir("plan-cli");
  std::ofstream(dir / "small.toml") << R"(
[[cluster]]
name = "tiny"
  [[cluster.node]]
  name = "n"
  nic = "ethernet"
    [[cluster.node.worker]]
    tflops = 10
    memory_gib = 4
    count = 2
)";
  auto r = run_corolla({"plan", "--cluster", (dir / "small.toml").string(), "--model",
                        example("models/llama2-7b.json")});
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("corolla: error: no feasible plan: the model does not fit in memory") == 0);

  auto bad = run_corolla({"plan", "--cluster", (dir / "missing.toml").string(), "--model",
                          example("models/llama2-7b.json")});
  CHECK(bad.exit_code == 1);
  CHECK(bad.err.find("corolla: error: cluster file " + (dir / "missing.toml").string() + " does not exist\n") == 0);

  auto folder = run_corolla({"plan", "--cluster", dir.path().string(), "--model", example("models/llama2-7b.json")});
  CHECK(folder.exit_code == 1);
  CHECK(folder.err.find("corolla: error: cluster file " + dir.path().string() + " is a directory\n") == 0);
}

TEST_CASE("corolla plan --lora-rank prices a LoRA job: a faster step than the whole model's, the adapter named") {
  const std::vector<std::string> base{"plan", "--cluster", example("ib_ethernet.toml"), "--model",
                                      example("models/llama2-7b.json"), "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_corolla(a);
  };
  const auto whole = with({});
  const auto lora = with({"--lora-rank", "8", "--lora-targets", "q_proj,v_proj,o_proj"});
  CAPTURE(lora.err);
  REQUIRE(whole.exit_code == 0);
  REQUIRE(lora.exit_code == 0);
  const auto w = nlohmann::json::parse(whole.out), l = nlohmann::json::parse(lora.out);
  CHECK(w["setup"]["lora"].is_null());
  CHECK(l["setup"]["lora"]["rank"] == 8);
  CHECK(l["setup"]["lora"]["targets"] ==
        nlohmann::json::array({"self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj"}));
  CHECK(l["setup"]["lora"]["values"] == 32 * 3 * 2 * 8 * 4096);  // 32 blocks, 3 modules of 4096 x 4096
  CHECK(l["plan"]["step_s"].get<double>() < w["plan"]["step_s"].get<double>());

  const auto text = run_corolla({"plan", "--cluster", example("ib_ethernet.toml"), "--model",
                                 example("models/llama2-7b.json"), "--lora-rank", "8"});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("LoRA: an adapter of rank 8 on self_attn.q_proj, self_attn.v_proj (4194304 values)") !=
        std::string::npos);
  const auto bad = run_corolla({"plan", "--cluster", example("ib_ethernet.toml"), "--model",
                                example("models/llama2-7b.json"), "--lora-targets", "q_proj"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.err.find("add --lora-rank R") != std::string::npos);
}

TEST_CASE("corolla plan --lora-rank --weights nf4 prices a QLoRA job in f32: fewer stages, the frozen bytes named, "
          "and --weights refused without an adapter or beside bf16") {
  const std::vector<std::string> base{"plan",          "--cluster", example("memory_tight.toml"), "--model",
                                      example("models/llama2-7b.json"), "--lora-rank", "8", "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_corolla(a);
  };
  const auto f32 = with({"--precision", "fp32"}), nf4 = with({"--weights", "nf4"});
  CAPTURE(nf4.err);
  REQUIRE(f32.exit_code == 0);
  REQUIRE(nf4.exit_code == 0);
  const auto w = nlohmann::json::parse(f32.out), q = nlohmann::json::parse(nf4.out);
  CHECK(w["setup"]["lora"]["base_weights"] == "f32");
  CHECK(w["setup"]["lora"]["frozen_block_bytes"] == 0);
  CHECK(q["setup"]["lora"]["base_weights"] == "nf4");
  CHECK(q["setup"]["precision"] == "fp32");  // train computes QLoRA in f32
  // A Llama-2-7B block: 202 M parameters, a little over half a byte each as nf4.
  const double block = q["setup"]["lora"]["frozen_block_bytes"].get<double>();
  CHECK(block > 0.5 * 202e6);
  CHECK(block < 0.6 * 202e6);
  // The 24 GiB cards hold more of the nf4 blocks: half the stages.
  CHECK(q["plan"]["pp"].get<int>() * 2 <= w["plan"]["pp"].get<int>());
  CHECK(q["plan"]["step_s"].get<double>() < w["plan"]["step_s"].get<double>());

  const auto text = run_corolla({"plan", "--cluster", example("memory_tight.toml"), "--model",
                                 example("models/llama2-7b.json"), "--lora-rank", "8", "--weights", "int8"});
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("QLoRA: the frozen blocks held as int8") != std::string::npos);
  const auto bad = run_corolla({"plan", "--cluster", example("memory_tight.toml"), "--model",
                                example("models/llama2-7b.json"), "--weights", "nf4"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.err.find("carry an adapter (add --lora-rank R)") != std::string::npos);
  const auto bf16 = with({"--weights", "nf4", "--precision", "bf16"});
  CHECK(bf16.exit_code != 0);
  CHECK(bf16.err.find("computes an adapter beside nf4 weights in f32") != std::string::npos);
}
