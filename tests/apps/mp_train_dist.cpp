// `corolla train --pp P --dp D` end to end: real rank processes on
// 127.0.0.1 against the library's single-process training on the same
// global batch (distributed equals single-process), resume, the final save,
// a rank killed mid-run, ranks started by a launcher's environment, and bad
// input.
#include <doctest/doctest.h>

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/train_store.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/safetensors.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/cli_expect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"
#include "tests/apps/train_test_util.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;
using namespace corolla::testing::train_test;
namespace fs = std::filesystem;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("every pipeline x data-parallel layout gives the single-process losses over 20 steps") {
  temp_dir_guard tmp("mp-train-layouts");
  const job j = fresh_gpt2_job(tmp);
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  for (auto [pp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}, {4, 1}, {3, 2}}) {
    INFO("layout " << pp << "x" << dp);
    const process_result r = run_layout(j, pp, dp, {"--seed", "0"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), want, 1e-5);
  }
  // The layouts above reduce their buckets' rings side by side (the
  // default --rings-at-once 4); one bucket after another gives the same.
  // Each --json step line says the most that ran at once on any rank
  // (`key`: rings_side_by_side of the reductions, updates_side_by_side of
  // the step before's update jobs).
  auto most_side_by_side = [](const process_result& r, const char* key = "rings_side_by_side") {
    int most = 0;
    for (const std::string& l : r.out_lines())
      if (auto j = nlohmann::json::parse(l, nullptr, false); j.is_object() && j.contains(key))
        most = std::max(most, j[key].get<int>());
    return most;
  };
  const process_result one = run_layout(j, 2, 2, {"--seed", "0", "--rings-at-once", "1"});
  INFO("stderr: " << one.err);
  REQUIRE(one.exit_code == 0);
  check_close(json_steps(one.out_lines()), want, 1e-5);
  CHECK(most_side_by_side(one) == 1);
  // Links of 4 ms: a hop waits that long, and the buckets the backward
  // hands over meanwhile (microseconds apart) run beside it.
  const process_result lanes = run_layout(j, 1, 2, {"--seed", "0", "--link-profile", "lat=4ms"});
  INFO("stderr: " << lanes.err);
  REQUIRE(lanes.exit_code == 0);
  check_close(json_steps(lanes.out_lines()), want, 1e-5);
  CHECK(most_side_by_side(lanes) >= 2);
  // Clipped, the all-gathers run after the coordinator's norm, in the
  // update request's jobs (one per bucket, in the reductions' lanes): the
  // losses check that path on real compute over the same links, and the
  // next step's line says how many of those jobs ran at once.
  job clipped = j;
  clipped.clip = 0.5f;
  const process_result clipped_lanes = run_layout(clipped, 1, 2, {"--seed", "0", "--link-profile", "lat=4ms"});
  INFO("stderr: " << clipped_lanes.err);
  REQUIRE(clipped_lanes.exit_code == 0);
  check_close(json_steps(clipped_lanes.out_lines()), reference_losses(clipped, fresh_gpt2(clipped)), 1e-5);
  CHECK(most_side_by_side(clipped_lanes) >= 2);
  CHECK(most_side_by_side(clipped_lanes, "updates_side_by_side") >= 2);
  CHECK(most_side_by_side(lanes, "updates_side_by_side") == 0);  // unclipped: the updates ride the reductions
  CHECK(most_side_by_side(one, "updates_side_by_side") == 0);
}

TEST_CASE("a distributed job draws a progress bar on a terminal and says each step's tokens per second") {
  temp_dir_guard tmp("mp-train-lines");
  job j = fresh_gpt2_job(tmp);
  j.steps = 6;
  // --json: each step line carries its tokens per second, the global
  // batch over the step's seconds, and no bar is drawn (stderr is a pipe
  // here anyway).
  const process_result r = run_layout(j, 2, 1, {"--seed", "0"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  int lines = 0;
  for (const std::string& l : r.out_lines()) {
    const auto s = nlohmann::json::parse(l);
    if (!s.contains("step") || s.contains("tokens")) continue;  // the summary
    ++lines;
    const double seconds = s["seconds"].get<double>();
    REQUIRE(seconds > 0);
    CHECK(s["tokens_per_s"].get<double>() == doctest::Approx(j.batch * j.seq / seconds));
  }
  CHECK(lines == j.steps);
  CHECK(r.err.find("train [") == std::string::npos);
  // On a terminal (script(1) gives the launcher a pseudo-terminal): the
  // text lines, each on a line of its own, and the bar redrawn after
  // every step, ending at 6/6 with the last loss and a rate.
  std::string command = std::string("'") + COROLLA_BINARY + "'";
  for (const std::string& arg : std::vector<std::string>{"train", "--model", j.model, "--data", j.data, "--batch",
                                                         std::to_string(j.batch), "--seq", std::to_string(j.seq),
                                                         "--steps", std::to_string(j.steps), "--lr", "0.003",
                                                         "--threads", "1", "--seed", "0", "--pp", "2", "--log-every",
                                                         "2"})
    command += " '" + arg + "'";
  const process_result t = run_process("/usr/bin/script", {"-qefc", command, "/dev/null"}, std::chrono::seconds(120));
  INFO("terminal: " << t.out);
  REQUIRE(t.exit_code == 0);
  int bars = 0;
  for (auto at = t.out.find("train ["); at != std::string::npos; at = t.out.find("train [", at + 1)) ++bars;
  CHECK(bars == j.steps);
  CHECK(t.out.find("] 6/6  loss ") != std::string::npos);
  CHECK(t.out.find(" tok/s") != std::string::npos);
  // Every logged step's line starts a line of its own: the bar was
  // cleared ("\r\033[K") before it was written.
  for (const char* line : {"step 1 loss", "step 2 loss", "step 4 loss", "step 6 loss"}) {
    CAPTURE(line);
    const auto at = t.out.find(line);
    REQUIRE(at != std::string::npos);
    if (at == 0) continue;  // the first output of all
    const std::string before = t.out.substr(at >= 3 ? at - 3 : 0, at >= 3 ? 3 : at);
    CHECK((before == "\033[K" || before.back() == '\n'));
  }
  CHECK(t.out.find("step 3 loss") == std::string::npos);  // --log-every 2
  // The bar's last state stays on its line: the summary starts a new one.
  const auto summary = t.out.find("trained 6 steps on 2x1");
  REQUIRE(summary != std::string::npos);
  CHECK(t.out.rfind("\n", summary) > t.out.rfind("] 6/6", summary));
}

TEST_CASE("ranks computing on the GPU give the single-process losses (stages and buckets staged through host memory)") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  temp_dir_guard tmp("mp-train-cuda");
  job j = fresh_gpt2_job(tmp);
  j.clip = 1.0f;  // the clipped path reduces norms of the host copies too
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  for (auto [pp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}, {1, 2}}) {
    INFO("layout " << pp << "x" << dp);
    const process_result r = run_layout(j, pp, dp, {"--seed", "0", "--device", "cuda"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), want, 1e-5);
  }
}

TEST_CASE("ranks whose data-parallel groups reduce over NCCL give the single-process losses (--collectives device)") {
  const int gpus = cuda_device_count();
  if (gpus < 2) {
    MESSAGE("skipped: --collectives device needs a GPU per rank, " << gpus << " visible");
    return;
  }
  temp_dir_guard tmp("mp-train-nccl");
  job j = fresh_gpt2_job(tmp);
  for (float clip : {0.0f, 1.0f}) {  // the update on the DP thread's stream, and on the stage thread's
    j.clip = clip;
    const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
    for (auto [pp, dp] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {2, 2}}) {
      if (pp * dp > gpus) continue;
      INFO("layout " << pp << "x" << dp << ", clip " << clip);
      const process_result r = run_layout(j, pp, dp, {"--seed", "0", "--collectives", "device"});
      INFO("stderr: " << r.err);
      REQUIRE(r.exit_code == 0);
      check_close(json_steps(r.out_lines()), want, 1e-5);
    }
  }
}

TEST_CASE("interleaved 1F1B (two chunks per stage) gives the single-process losses over 20 steps") {
  temp_dir_guard tmp("mp-train-interleaved");
  job j = fresh_gpt2_job(tmp);
  j.batch = 8;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  for (auto [pp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}}) {
    INFO("layout " << pp << "x" << dp << " v2");
    const process_result r = run_layout(j, pp, dp, {"--chunks", "2"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), want, 1e-5);
  }
  // Interleaving needs the micro-batches per replica to be a multiple of --pp.
  job odd = j;
  odd.batch = 6;
  check_one_error(run_layout(odd, 2, 2, {"--chunks", "2"}), "multiple of --pp 2");
  check_one_error(run_layout(odd, 4, 1, {"--chunks", "2"}), "4 stages x 2 chunks for a model of 4 blocks");
}

TEST_CASE("an untied Llama with several micro-batches per replica, clipping and a cosine schedule trains like one process") {
  temp_dir_guard tmp("mp-train-llama");
  tiny_model_options o = tiny(architecture::llama);
  job j;
  j.model = tmp / "llama";
  write_tiny_model(j.model, o);
  j.data = tmp / "tokens.bin";
  write_raw_u16(j.data, pattern_tokens(3000));
  j.batch = 8;
  j.steps = 10;
  j.lr = 1e-2f;
  j.clip = 0.5f;
  j.warmup = 3;
  j.cosine = true;
  std::vector<double> norms;
  const std::vector<float> want = reference_losses(j, transformer::load(j.model, cpu_backend()), &norms);
  // 2 stages x 2 replicas, 4 sequences per replica in micro-batches of 2.
  const process_result r = run_layout(j, 2, 2, {"--micro-batch", "2"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const auto got = json_steps(r.out_lines());
  check_close(got, want, 1e-5);
  // The norm the coordinator sums from the ranks' shards is the global one,
  // and clipping was active (it is above 0.5 at the start).
  REQUIRE(got.size() == norms.size());
  CHECK(norms.front() > 0.5);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].grad_norm == doctest::Approx(norms[i]).epsilon(1e-4));

  // Dynamic loss scaling reaches the ranks through the job file; in f32 it
  // never overflows and changes nothing but the report.
  const process_result scaled = run_layout(j, 2, 2, {"--micro-batch", "2", "--loss-scale", "dynamic"});
  INFO("stderr: " << scaled.err);
  REQUIRE(scaled.exit_code == 0);
  check_close(json_steps(scaled.out_lines()), want, 1e-5);
  int reported = 0;
  for (const std::string& l : scaled.out_lines()) {
    const auto line = nlohmann::json::parse(l);
    if (!line.contains("loss_scale")) continue;
    CHECK(line["loss_scale"].get<double>() == 65536.0);
    CHECK(line["skipped"].get<bool>() == false);
    ++reported;
  }
  CHECK(reported == j.steps);
}

TEST_CASE("Qwen2 and Qwen3 models with scaled RoPE train in 2x2 like one process, and --save writes their biases and norms") {
  temp_dir_guard tmp("mp-train-qwen");
  for (const char* family : {"Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    CAPTURE(family);
    tiny_model_options o = tiny(architecture::llama);
    o.family = family;
    o.rope_scaling = R"({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8})";
    if (o.family == "Qwen3ForCausalLM") {
      o.head_dim = 16;
      o.attention_bias = true;
    }
    job j;
    j.model = tmp / family;
    write_tiny_model(j.model, o);
    j.data = tmp / "tokens.bin";
    write_raw_u16(j.data, pattern_tokens(3000));
    j.steps = 8;
    j.lr = 1e-2f;
    const std::vector<float> want = reference_losses(j, transformer::load(j.model, cpu_backend()));
    const fs::path saved = tmp / (std::string(family) + "-trained");
    const process_result r = run_layout(j, 2, 2, {"--save", saved.string()});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), want, 1e-5);
    // The saved model is the same family, with its extra tensors.
    const model_config back = load_config(saved);
    CHECK(back.hf_architecture == family);
    CHECK(back.rope == load_config(j.model).rope);
    const auto tensors = read_all_f32(saved);
    CHECK(tensors.count("model.layers.3.self_attn.q_proj.bias") == 1);
    CHECK(tensors.count("model.layers.3.self_attn.k_norm.weight") == (o.family == "Qwen3ForCausalLM" ? 1u : 0u));
  }
}

TEST_CASE("a Mixtral model trains in one process and in 2x2 with the library's losses, and --save writes its experts") {
  temp_dir_guard tmp("mp-train-moe");
  tiny_model_options o = tiny(architecture::llama);
  o.family = "MixtralForCausalLM";
  o.init_std = 0.3f;  // routing that differs from token to token
  job j;
  j.model = tmp / "mixtral";
  write_tiny_model(j.model, o);
  j.data = tmp / "tokens.bin";
  write_raw_u16(j.data, pattern_tokens(3000));
  j.batch = 4;
  j.steps = 4;
  j.lr = 1e-2f;
  j.clip = 1.0f;
  const std::vector<float> want = reference_losses(j, transformer::load(j.model, cpu_backend()));
  REQUIRE(want.back() < want.front());  // the updates matter to the losses

  // `corolla train` in one process.
  const process_result single = run_corolla(train_args(j, {}), std::chrono::seconds(60));
  INFO("stderr: " << single.err);
  REQUIRE(single.exit_code == 0);
  check_close(json_steps(single.out_lines()), want, 1e-5);

  // Two stages of two blocks, two replicas each.
  const fs::path saved = tmp / "mixtral-trained";
  const process_result r = run_layout(j, 2, 2, {"--save", saved.string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), want, 1e-5);
  // The saved model is a Mixtral with its router and experts, trained.
  const model_config back = load_config(saved);
  CHECK(back.hf_architecture == "MixtralForCausalLM");
  CHECK(back.n_experts == o.experts);
  CHECK(back.experts_per_token == o.experts_per_token);
  const auto before = read_all_f32(j.model), after = read_all_f32(saved);
  CHECK(after.size() == before.size());
  for (const char* name : {"model.layers.0.block_sparse_moe.gate.weight", "model.layers.3.block_sparse_moe.gate.weight",
                           "model.layers.1.block_sparse_moe.experts.2.w3.weight",
                           "model.layers.2.block_sparse_moe.experts.3.w2.weight"}) {
    CAPTURE(name);
    REQUIRE(after.count(name) == 1);
    CHECK(after.at(name) != before.at(name));
  }
  CHECK(after.count("model.layers.0.mlp.gate_proj.weight") == 0);
}

TEST_CASE("Mixtral ranks on the GPU give the single-process losses, in f32 and (within bf16 tolerance) with --compute bf16") {
  if (cuda_device_count() == 0) {
    MESSAGE("skipped: no CUDA device visible");
    return;
  }
  temp_dir_guard tmp("mp-train-moe-cuda");
  tiny_model_options o = tiny(architecture::llama);
  o.family = "MixtralForCausalLM";
  o.init_std = 0.3f;
  job j;
  j.model = tmp / "mixtral";
  write_tiny_model(j.model, o);
  j.data = tmp / "tokens.bin";
  write_raw_u16(j.data, pattern_tokens(3000));
  j.batch = 4;
  j.steps = 4;
  j.lr = 1e-2f;
  const std::vector<float> want = reference_losses(j, transformer::load(j.model, cpu_backend()));
  // The router's logits come back to the host each block: a top-k tie the
  // GPU's rounding breaks the other way would change a loss by far more.
  const process_result single = run_corolla(train_args(j, {"--device", "cuda"}), std::chrono::seconds(60));
  INFO("stderr: " << single.err);
  REQUIRE(single.exit_code == 0);
  check_close(json_steps(single.out_lines()), want, 1e-4);
  const process_result r = run_layout(j, 2, 2, {"--device", "cuda"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), want, 1e-4);
  // Mixed precision: the router and the experts on bf16 copies, in one
  // process and in ranks, within bf16's tolerance of the f32 losses.
  const process_result mixed = run_corolla(train_args(j, {"--device", "cuda", "--compute", "bf16"}),
                                           std::chrono::seconds(60));
  INFO("stderr: " << mixed.err);
  REQUIRE(mixed.exit_code == 0);
  check_close(json_steps(mixed.out_lines()), want, 5e-2);
  const process_result ranks = run_layout(j, 2, 1, {"--device", "cuda", "--compute", "bf16"});
  INFO("stderr: " << ranks.err);
  REQUIRE(ranks.exit_code == 0);
  check_close(json_steps(ranks.out_lines()), want, 5e-2);
}

TEST_CASE("a resumed run continues with the losses of an uninterrupted one, and --save writes the trained model") {
  temp_dir_guard tmp("mp-train-resume");
  job j = fresh_gpt2_job(tmp);
  j.steps = 10;
  const fs::path ck = tmp / "ck";
  const process_result whole = run_layout(j, 2, 2, {"--save", tmp / "saved"});
  INFO("stderr: " << whole.err);
  REQUIRE(whole.exit_code == 0);
  const auto uninterrupted = json_steps(whole.out_lines());
  REQUIRE(uninterrupted.size() == 10u);

  job first = j;
  first.steps = 6;
  const process_result a = run_layout(first, 2, 2, {"--checkpoint-dir", ck, "--checkpoint-every", "3"});
  INFO("stderr: " << a.err);
  REQUIRE(a.exit_code == 0);
  CHECK(latest_checkpoint_step(ck) == 6);
  CHECK(fs::exists(ck / "step-3" / "manifest.json"));
  for (int r = 0; r < 4; ++r) CHECK(fs::exists(ck / "step-6" / shard_file_name(r)));

  const process_result b = run_layout(j, 2, 2, {"--checkpoint-dir", ck, "--resume"});
  INFO("stderr: " << b.err);
  REQUIRE(b.exit_code == 0);
  const auto resumed = json_steps(b.out_lines());
  REQUIRE(resumed.size() == 4u);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CHECK(resumed[i].step == 7 + static_cast<int>(i));
    CHECK(resumed[i].loss == uninterrupted[6 + i].loss);
  }

  // The saved model equals the library's model after the same 10 steps, up
  // to Adam's amplification of rounding noise: the key bias's gradient is
  // zero in exact arithmetic (softmax ignores a per-query shift), so its
  // updates follow the sign of summation noise, up to lr per step.
  transformer lib = fresh_gpt2(j);
  {
    token_dataset data = token_dataset::open(j.data, nullptr, 64);
    train_options o;
    o.batch = j.batch;
    o.seq = j.seq;
    o.steps = j.steps;
    o.optimizer.adamw.lr = j.lr;
    trainer t(lib, data, o);
    t.run();
  }
  lib.save(tmp / "lib");
  const auto got = read_all_f32(tmp / "saved");
  const auto want = read_all_f32(tmp / "lib");
  REQUIRE(got.size() == want.size());
  for (const auto& [name, values] : want) {
    INFO("tensor " << name);
    REQUIRE(got.count(name) == 1);
    REQUIRE(got.at(name).size() == values.size());
    double worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, std::abs(double(got.at(name)[i]) - values[i]));
    const bool has_key_bias = name.find("c_attn.bias") != std::string::npos;
    CHECK(worst < (has_key_bias ? 10 * j.lr : 1e-4));
  }

  // A fresh run would overwrite the checkpoint `latest` names: refused.
  check_one_error(run_layout(first, 2, 2, {"--checkpoint-dir", ck, "--checkpoint-every", "3"}),
                  "already holds a checkpoint");
  // Another global batch cannot resume this checkpoint (another layout can: below).
  job other_batch = j;
  other_batch.batch = 4;
  check_one_error(run_layout(other_batch, 2, 2, {"--checkpoint-dir", ck, "--resume"}), "is of another job");
  // A shard cut short (a disk that filled up) is found by the launcher,
  // before any rank starts: one error line, not one per rank.
  const fs::path cut = tmp / "ck-cut";
  fs::copy(ck, cut, fs::copy_options::recursive);
  const fs::path shard = cut / "step-6" / shard_file_name(3);
  fs::resize_file(shard, fs::file_size(shard) / 2);
  check_one_error(run_layout(j, 2, 2, {"--checkpoint-dir", cut, "--resume"}), "truncated");
}

TEST_CASE("a checkpoint written by 2x2 resumes on 1x4 and on 3x1 with the single-process losses") {
  temp_dir_guard tmp("mp-train-relayout");
  job j = fresh_gpt2_job(tmp);
  j.batch = 12;  // divisible by every replica count below
  j.steps = 8;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const fs::path ck = tmp / "ck";
  job first = j;
  first.steps = 4;
  const process_result a = run_layout(first, 2, 2, {"--checkpoint-dir", ck, "--checkpoint-every", "4"});
  INFO("stderr: " << a.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(latest_checkpoint_step(ck) == 4);
  CHECK(checkpoint_layout(ck, 4) == "2x2 [0,2) [2,4)");
  for (auto [pp, dp] : std::vector<std::pair<int, int>>{{1, 4}, {3, 1}}) {
    INFO("resumed on " << pp << "x" << dp);
    const process_result r = run_layout(j, pp, dp, {"--checkpoint-dir", ck, "--resume"});
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    check_close(json_steps(r.out_lines()), want, 1e-5, 5);
    CHECK(r.err.find("written by layout 2x2") != std::string::npos);
  }
}

TEST_CASE("a rank killed mid-run fails the job naming its stage and rank, and the last checkpoint stays whole") {
  temp_dir_guard tmp("mp-train-kill");
  job j = fresh_gpt2_job(tmp);
  j.steps = 1000000;
  const fs::path ck = tmp / "ck";
  std::vector<std::string> args = train_args(j, {"--pp", "2", "--dp", "2", "--checkpoint-dir", ck,
                                                  "--checkpoint-every", "5", "--timeout-s", "60"});
  child_process launcher = child_process::corolla(args);
  REQUIRE(launcher.wait_line(std::regex(R"("step":12\b)"), std::chrono::seconds(60)));
  const auto victims = children_with_arg(launcher.pid(), {"--rank", "3"});
  REQUIRE(victims.size() == 1u);
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(victims[0], SIGKILL);
  const auto status = launcher.wait(std::chrono::seconds(10));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO("stderr: " << launcher.err());
  REQUIRE(status.has_value());
  CHECK(*status == 1);
  // Detection takes 1.4 s (heartbeats); the bound leaves room for a slow,
  // busy machine and is still far below the job's 60 s timeout.
  CHECK(seconds < 6.0);
  CHECK(launcher.err().find("rank 3 (stage 1, replica 1") != std::string::npos);
  // No rank outlives the launcher.
  CHECK(children_with_arg(launcher.pid(), {"--rank"}).empty());

  // The latest checkpoint is complete: a 2x2 run resumes from it.
  const int latest = latest_checkpoint_step(ck);
  REQUIRE(latest >= 10);
  for (int r = 0; r < 4; ++r) CHECK_NOTHROW(safetensors_file::open(ck / ("step-" + std::to_string(latest)) / shard_file_name(r)));
  job more = j;
  more.steps = latest + 2;
  const process_result resumed = run_layout(more, 2, 2, {"--checkpoint-dir", ck, "--resume"});
  INFO("resume stderr: " << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(json_steps(resumed.out_lines()).size() == 2u);
}

TEST_CASE("a launcher killed by SIGKILL leaves its job file, and the next launcher in that directory removes it") {
  temp_dir_guard tmp("mp-train-stale-job");
  job j = fresh_gpt2_job(tmp);
  const fs::path scratch = tmp / "tmp";
  fs::create_directories(scratch);
  auto in_scratch = [&](const job& jj, std::vector<std::string> extra) {
    std::vector<std::string> a = {"TMPDIR=" + scratch.string(), COROLLA_BINARY};
    for (auto& x : train_args(jj, std::move(extra))) a.push_back(x);
    return a;
  };
  auto job_files = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(scratch))
      if (e.path().filename().string().rfind("corolla-job-", 0) == 0) names.push_back(e.path().filename().string());
    return names;
  };
  j.steps = 1000000;
  child_process first("/usr/bin/env", in_scratch(j, {"--pp", "2", "--timeout-s", "60"}));
  REQUIRE(first.wait_line(std::regex(R"("step":2\b)"), std::chrono::seconds(60)));
  const pid_t killed = first.pid();  // env execs corolla: the same process
  first.signal(SIGKILL);             // no stop handler runs
  REQUIRE(first.wait(std::chrono::seconds(5)));
  const auto left = job_files();
  REQUIRE(left.size() == 1u);
  CHECK(left[0].rfind("corolla-job-" + std::to_string(killed) + "-", 0) == 0);
  // The next launcher there sweeps it, and removes its own when it ends.
  j.steps = 2;
  child_process second("/usr/bin/env", in_scratch(j, {"--pp", "2"}));
  const auto status = second.wait(std::chrono::seconds(120));
  INFO("stderr: " << second.err());
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK(job_files().empty());
}

TEST_CASE("ranks started by a torchrun-style environment form the job, rank 0 hosting the coordinator") {
  temp_dir_guard tmp("mp-train-env");
  job j = fresh_gpt2_job(tmp);
  j.steps = 5;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const std::string port = std::to_string(free_port());
  auto rank = [&](int r) {
    std::vector<std::string> a = {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + port, COROLLA_BINARY};
    for (auto& s : train_args(j, {"--pp", "2"})) a.push_back(s);
    return a;
  };
  child_process second("/usr/bin/env", rank(1));
  const process_result first = run_process("/usr/bin/env", rank(0), std::chrono::seconds(60));
  INFO("rank 0 stderr: " << first.err);
  INFO("rank 1 stderr: " << second.err());
  REQUIRE(first.exit_code == 0);
  check_close(json_steps(first.out_lines()), want, 1e-5);
  CHECK(second.wait(std::chrono::seconds(10)) == std::optional<int>(0));
  CHECK(second.lines().empty());  // only the coordinator prints steps
}



TEST_CASE("--cluster trains on the planner's layout over links shaped by the file, and equals one process") {
  temp_dir_guard tmp("mp-train-cluster");
  job j = fresh_gpt2_job(tmp);
  j.batch = 4;
  j.steps = 5;
  std::ofstream(tmp / "two.toml") << two_clusters_toml;
  const std::vector<float> want = reference_losses(j, fresh_gpt2(j));
  const process_result r = run_corolla(train_args(j, {"--cluster", tmp / "two.toml", "--pp", "2", "--dp", "2"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  check_close(json_steps(r.out_lines()), want, 1e-5);
  // The plan is printed first; each DP group stays inside one cluster and
  // NIC class, so only pipeline traffic crosses the slow link.
  CHECK(r.err.find("plan: PP 2 x DP 2") != std::string::npos);
  CHECK(r.err.find("fast0/0, fast1/0") != std::string::npos);
  CHECK(r.err.find("eth0/0, eth1/0") != std::string::npos);
}

TEST_CASE("bench train --cluster runs all four layouts with synthetic compute and reports each") {
  temp_dir_guard tmp("mp-bench-cluster");
  // Fast emulated workers: the bench's sleeps stay in milliseconds.
  std::string toml = two_clusters_toml;
  for (const char* slow : {"tflops = 0.2", "tflops = 0.1"})
    toml.replace(toml.find(slow), std::strlen(slow), "tflops = 5");
  std::ofstream(tmp / "fast.toml") << toml;
  // --lora-rank: each layout trains an adapter too, right after.
  const process_result r = run_corolla({"bench", "train", "--cluster", tmp / "fast.toml", "--batch", "4", "--seq",
                                        "16", "--steps", "1", "--lora-rank", "4", "--json"},
                                       std::chrono::seconds(120));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE_FALSE(r.out_lines().empty());
  const auto j = nlohmann::json::parse(r.out_lines().back());
  CHECK(j["bench"] == "train-cluster");
  CHECK(j["steps"] == 2);  // one timed step after the warm-up
  std::vector<std::string> layouts;
  for (const auto& row : j["layouts"]) {
    layouts.push_back(row["layout"]);
    CHECK(row["predicted_step_s"].get<double>() > 0);
    CHECK(row["measured_step_s"].get<double>() > 0);
    CHECK(row["samples_per_s"].get<double>() > 0);
    CHECK(row["lora_measured_step_s"].get<double>() > 0);
    CHECK(row["lora_vs_full"].get<double>() ==
          doctest::Approx(row["measured_step_s"].get<double>() / row["lora_measured_step_s"].get<double>()));
  }
  CHECK(layouts == std::vector<std::string>{"planner", "holmes rule", "all ethernet", "all ib"});
  CHECK(j["lora_rank"] == 4);
  CHECK(j["lora_targets"] == nlohmann::json::array({"self_attn.q_proj", "self_attn.v_proj"}));
  // The bench model: 8 blocks of width 128, q and v 128 wide: A [4, 128] and B [128, 4] each.
  CHECK(j["lora_adapter_values"] == 8 * 2 * (4 * 128 + 128 * 4));
  // The planner's own plan for the adapter, run with its modelled compute.
  REQUIRE(j["lora_plan"].is_object());
  CHECK(j["lora_plan"]["pp"].get<int>() * j["lora_plan"]["dp"].get<int>() >= 1);
  CHECK(j["lora_plan"]["predicted_step_s"].get<double>() > 0);
  CHECK(j["lora_plan"]["measured_step_s"].get<double>() > 0);
  CHECK(j["lora_plan"]["vs_planner_full"].get<double>() > 0);
  CHECK(j.contains("planner_vs_holmes"));
  // The baseline of the rings side by side: the planner's and all-IB's
  // layouts, where they have data-parallel groups, with one bucket's ring
  // at a time, in the same run.
  CHECK(j["rings_at_once"] == 4);
  std::vector<std::string> want_baselines, baselines;
  for (const auto& row : j["layouts"])
    if ((row["layout"] == "planner" || row["layout"] == "all ib") && row["dp"].get<int>() > 1)
      want_baselines.push_back(row["layout"]);
  for (const auto& row : j["one_ring_at_a_time"]) {
    baselines.push_back(row["layout"]);
    CHECK(row["rings_at_once_vs_one"].get<double>() > 0);
  }
  CHECK(baselines == want_baselines);  // none here: every layout is a pipeline (below: some)
}

TEST_CASE("bench train --cluster measures the rings side by side against one at a time where a layout has "
          "data-parallel groups") {
  // The documentation's cluster: with 16 sequences its all-IB layout is
  // 4 x 2 (a few seconds of synthetic compute in all). Clipped: the
  // all-gathers run in the update requests, one per bucket, which run side
  // by side too (or, in the baseline, one at a time).
  const process_result r =
      run_corolla({"bench", "train", "--cluster", std::string(COROLLA_SOURCE_DIR) + "/docs/clusters/emulated_ib_roce.toml",
                   "--batch", "16", "--seq", "16", "--steps", "1", "--grad-clip", "1", "--json"},
                  std::chrono::seconds(300));
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE_FALSE(r.out_lines().empty());
  const auto j = nlohmann::json::parse(r.out_lines().back());
  CHECK(j["grad_clip"].get<double>() == 1.0);
  std::map<std::string, nlohmann::json> by_layout;
  for (const auto& row : j["layouts"]) by_layout[row["layout"]] = row;
  REQUIRE(by_layout.count("all ib"));
  REQUIRE(by_layout["all ib"]["dp"].get<int>() > 1);
  bool all_ib = false;
  for (const auto& row : j["one_ring_at_a_time"]) {
    const std::string layout = row["layout"];
    INFO(layout);
    CHECK(by_layout[layout]["dp"].get<int>() > 1);
    CHECK(row["measured_step_s"].get<double>() > 0);
    // The ratio is of the same layout's two runs.
    CHECK(row["rings_at_once_vs_one"].get<double>() ==
          doctest::Approx(by_layout[layout]["samples_per_s"].get<double>() / row["samples_per_s"].get<double>()));
    all_ib = all_ib || layout == "all ib";
  }
  CHECK(all_ib);
  check_one_error(run_corolla({"bench", "train", "--grad-clip", "1"}), "bench train: --grad-clip applies to --cluster only");
  check_one_error(run_corolla({"bench", "train", "--lora-rank", "8"}), "bench train: --lora-rank applies to --cluster only");
}

TEST_CASE("bad distributed training input is one clear error") {
  temp_dir_guard tmp("mp-train-bad");
  const job j = fresh_gpt2_job(tmp);
  check_one_error(run_layout(j, 5, 1), "5 pipeline stages for a model of 4 blocks");
  check_one_error(run_layout(j, 1, 4), "does not split over 4 data-parallel replicas");
  check_one_error(run_layout(j, 2, 2, {"--micro-batch", "2"}), "--micro-batch 2 does not divide");
  check_one_error(run_layout(j, 2, 1, {"--checkpoint-dir", tmp / "none", "--resume"}), "no complete checkpoint");
  check_one_error(run_layout(j, 2, 1, {"--device", "gpu"}), "unknown device 'gpu'");
  check_one_error(run_corolla(train_args(j, {"--rank", "0", "--pp", "2"})), "needs --coordinator");
  check_one_error(run_layout(j, 2, 1, {"--link-profile", "bogus"}), "--link-profile 'bogus'");
  check_one_error(run_layout(j, 2, 1, {"--probe-every", "-1"}), "--probe-every must be >= 0");
  check_one_error(run_corolla(train_args(j, {"--cluster", tmp / "missing.toml"})), "missing.toml");
  check_one_error(run_layout(j, 1, 2, {"--collectives", "nccl"}), "--collectives must be host or device, got 'nccl'");
  check_one_error(run_layout(j, 1, 2, {"--rings-at-once", "0"}), "--rings-at-once must be between 1 and 64, not 0");
  check_one_error(run_layout(j, 1, 2, {"--collectives", "device", "--device", "cpu"}),
                  "--collectives device needs every rank on a GPU of its own, but --device cpu is the cpu here");
  check_one_error(run_layout(j, 1, 2, {"--collectives", "device", "--device", "cuda", "--link-profile", "ethernet"}),
                  "around the emulated links of --link-profile / --cluster");
  check_one_error(run_layout(j, 1, 2, {"--collectives", "device", "--device", "cuda:1"}),
                  "puts local rank r on GPU r: give --device cuda (or auto), not cuda:1");
  if (cuda_device_count() < 4)
    check_one_error(run_layout(j, 2, 2, {"--collectives", "device", "--device", "cuda"}),
                    "--collectives device needs a GPU per rank: the job has 4 ranks");
  // Distributed-only flags on a single-process run are refused, not ignored.
  check_one_error(run_corolla(train_args(j, {"--checkpoint-dir", tmp / "ck", "--resume"})),
                  "--checkpoint-dir, --resume: for pipeline x data-parallel training only; add --pp, --dp or --cluster");
  check_one_error(run_corolla(train_args(j, {"--collectives", "device"})),
                  "--collectives: for pipeline x data-parallel training only");
  check_one_error(run_corolla(train_args(j, {"--rings-at-once", "2"})),
                  "--rings-at-once: for pipeline x data-parallel training only");
}
