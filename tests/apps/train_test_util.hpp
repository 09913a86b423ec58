// Helpers of the distributed-training process tests (mp_train_dist.cpp,
// mp_train_elastic.cpp): a tiny GPT-2 job on a token pattern, the
// library's single-process losses as the reference, `--json` step lines,
// and the rank processes of a local launcher.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "apps/self_process.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/lora.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla::testing::train_test {

using namespace corolla;
using namespace corolla::testing;
namespace fs = std::filesystem;


inline tiny_model_options tiny(architecture arch) {
  tiny_model_options o;
  o.arch = arch;
  o.vocab = 64;
  o.hidden = 32;
  o.layers = 4;
  o.heads = 4;
  o.kv_heads = arch == architecture::gpt2 ? 4 : 2;
  o.intermediate = 64;
  o.max_positions = 32;
  o.init_std = 0.05f;
  return o;
}

inline std::vector<std::uint16_t> pattern_tokens(std::size_t n) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>((i * 7 + i / 5 + (i * i) % 3) % 64);
  return t;
}

struct job {
  fs::path model, data;
  int batch = 6, seq = 8, steps = 20;
  float lr = 3e-3f, clip = 0.0f;
  int warmup = 0;
  bool cosine = false;
};

inline std::vector<std::string> train_args(const job& j, std::vector<std::string> extra) {
  std::vector<std::string> a = {"train", "--model", j.model,  "--data", j.data,  "--batch", std::to_string(j.batch),
                                "--seq", std::to_string(j.seq), "--steps", std::to_string(j.steps), "--lr",
                                std::to_string(j.lr), "--grad-clip", std::to_string(j.clip), "--json", "--threads", "1",
                                "--warmup-steps", std::to_string(j.warmup), "--lr-schedule", j.cosine ? "cosine" : "constant"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

struct step_line {
  int step = 0;
  double loss = 0, grad_norm = -1;
};

inline std::vector<step_line> json_steps(const std::vector<std::string>& lines) {
  std::vector<step_line> out;
  for (const std::string& l : lines) {
    INFO("line: " << l);
    auto j = nlohmann::json::parse(l);
    if (!j.contains("step") || !j.contains("loss") || j.contains("tokens")) continue;  // the summary
    out.push_back({j["step"].get<int>(), j["loss"].get<double>(), j.value("grad_norm", -1.0)});
  }
  return out;
}

/// The single-process trainer's options for `j`.
inline train_options options_of(const job& j) {
  train_options o;
  o.batch = j.batch;
  o.seq = j.seq;
  o.steps = j.steps;
  o.optimizer.adamw.lr = j.lr;
  o.optimizer.max_grad_norm = j.clip;
  o.optimizer.schedule = {j.warmup, j.cosine, 0.1f};
  return o;
}

/// The library's single-process run of `j` (the reference).
inline std::vector<float> reference_losses(const job& j, transformer model, std::vector<double>* norms = nullptr) {
  token_dataset data = token_dataset::open(j.data, nullptr, model.config().vocab_size);
  trainer t(model, data, options_of(j));
  std::vector<float> losses;
  while (t.steps_done() < j.steps) {
    step_report r = t.step();
    losses.push_back(r.loss);
    if (norms) norms->push_back(r.grad_norm);
  }
  return losses;
}

/// The library's single-process LoRA training of `a` on `j`'s model (with
/// weights, held as `base`: not f32 is QLoRA) and data: the losses; `a`
/// holds the trained adapter after.
inline std::vector<float> lora_reference_losses(const job& j, lora_adapter& a,
                                                weight_format base = weight_format::f32) {
  transformer model = base == weight_format::f32 ? transformer::load(j.model, cpu_backend())
                                                 : transformer::load_inference(j.model, cpu_backend(), base);
  token_dataset data = token_dataset::open(j.data, nullptr, model.config().vocab_size);
  train_options o = options_of(j);
  o.adapter = &a;
  trainer t(model, data, o);
  return t.run().losses;
}

inline void check_close(const std::vector<step_line>& got, const std::vector<float>& want, double rel, int first_step = 1) {
  REQUIRE(got.size() == want.size() - static_cast<std::size_t>(first_step - 1));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("step " << got[i].step);
    CHECK(got[i].step == first_step + static_cast<int>(i));
    const double w = want[static_cast<std::size_t>(got[i].step - 1)];
    CHECK(std::abs(got[i].loss - w) <= rel * std::abs(w));
  }
}

inline process_result run_layout(const job& j, int pp, int dp, std::vector<std::string> extra = {}) {
  extra.insert(extra.end(), {"--pp", std::to_string(pp), "--dp", std::to_string(dp)});
  return run_corolla(train_args(j, extra), std::chrono::seconds(120));
}

/// A job on a fresh GPT-2 (tied embeddings) from its config.json only.
inline job fresh_gpt2_job(const temp_dir_guard& tmp) {
  job j;
  j.model = tmp / "gpt2";
  fs::create_directories(j.model);
  std::ofstream(j.model / "config.json") << to_hf_json(tiny_config(tiny(architecture::gpt2))).dump(2);
  j.data = tmp / "tokens.bin";
  write_raw_u16(j.data, pattern_tokens(3000));
  return j;
}

inline transformer fresh_gpt2(const job& j) { return transformer::init(load_config(j.model), 0, cpu_backend()); }

// The pids of the processes whose parent is `parent` and whose command line
// holds `needle` as one argument.
inline std::vector<pid_t> children_with_arg(pid_t parent, const std::vector<std::string>& needle) {
  std::vector<pid_t> out;
  for (const app::process_command& c : app::children_of(parent))
    if (std::search(c.args.begin(), c.args.end(), needle.begin(), needle.end()) != c.args.end())
      out.push_back(c.pid);
  return out;
}

/// Two clusters of two CPU workers each (IB inside "fast", Ethernet inside
/// "slow", a 1 Gbit/s link between them), for --cluster jobs.
inline const char* two_clusters_toml = R"(
name = "two-clusters"
[nic.ib]
bandwidth_gbps = 8
latency_us = 20
[nic.ethernet]
bandwidth_gbps = 1
latency_us = 100
[[cluster]]
name = "fast"
  [[cluster.node]]
  name = "fast"
  count = 2
  nic = "ib"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.2
    memory_gib = 4
[[cluster]]
name = "slow"
  [[cluster.node]]
  name = "eth"
  count = 2
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.1
    memory_gib = 4
[[link]]
clusters = ["fast", "slow"]
bandwidth_gbps = 1
latency_us = 500
)";

/// Three single-worker nodes on 50 Mbit/s Ethernet, so slow at compute (as
/// modelled) that the planner takes two of them as data-parallel replicas
/// (PP 1 x DP 2 on n0/0 and n1/0; n2/0 idle).
inline const char* three_nodes_toml = R"(
name = "three-nodes"
[nic.ethernet]
bandwidth_gbps = 0.05
latency_us = 200
[[cluster]]
name = "site"
  [[cluster.node]]
  name = "n"
  count = 3
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = 0.00002
    memory_gib = 4
)";

}  // namespace corolla::testing::train_test
