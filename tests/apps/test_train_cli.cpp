// `corolla train` end to end: the real binary (COROLLA_BINARY, run through
// tests/support/process.hpp) against the library's own training on the same
// tiny models and data.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/token_data.hpp"
#include "model/tokenizer.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;
namespace fs = std::filesystem;

// The `step <i> loss <value>` lines of stdout, checked for form and order.
std::vector<double> step_losses(const process_result& r) {
  std::vector<double> losses;
  for (const std::string& l : r.out_lines()) {
    int step = 0;
    double loss = 0.0;
    char tail = 0;
    INFO("line: " << l);
    REQUIRE(std::sscanf(l.c_str(), "step %d loss %lf%c", &step, &loss, &tail) == 2);
    REQUIRE(step == static_cast<int>(losses.size()) + 1);
    losses.push_back(loss);
  }
  return losses;
}

tiny_model_options tiny_gpt2() {
  tiny_model_options o;
  o.arch = architecture::gpt2;
  o.vocab = 64;
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.intermediate = 64;
  o.max_positions = 32;
  o.init_std = 0.05f;
  return o;
}

std::vector<std::uint16_t> pattern_tokens(std::size_t n) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>((i * 7 + i / 5) % 64);
  return t;
}

// The library's losses for the same run the CLI is asked to do.
std::vector<float> library_losses(transformer model, const fs::path& data_file, int steps,
                                  float lr, float wd, int batch = 2, int micro_batch = 0) {
  token_dataset data = token_dataset::open(data_file, nullptr, model.config().vocab_size);
  train_options o;
  o.batch = batch;
  o.micro_batch = micro_batch;
  o.seq = 16;
  o.steps = steps;
  o.optimizer.adamw.lr = lr;
  o.optimizer.adamw.weight_decay = wd;
  trainer t(model, data, o);
  return t.run().losses;
}

void check_same_losses(const std::vector<double>& cli, const std::vector<float>& lib) {
  REQUIRE(cli.size() == lib.size());
  for (std::size_t i = 0; i < cli.size(); ++i) {
    INFO("step " << i + 1);
    // %.6f printing rounds to 5e-7; allow a little for thread scheduling.
    CHECK(std::abs(cli[i] - lib[i]) < 5e-6);
  }
}

}  // namespace

TEST_CASE("corolla train on a config-only GPT-2 prints the library's losses step by step") {
  temp_dir_guard tmp("cli-train-fresh");
  const fs::path model_dir = tmp / "fresh";
  fs::create_directories(model_dir);
  const model_config cfg = tiny_config(tiny_gpt2());
  {
    std::ofstream(model_dir / "config.json") << to_hf_json(cfg).dump(2);
  }
  write_llmc_shard(tmp / "data.bin", pattern_tokens(400));

  const process_result r =
      run_corolla({"train", "--model", model_dir, "--data", tmp / "data.bin", "--batch", "2",
                   "--seq", "16", "--steps", "6", "--lr", "1e-3", "--weight-decay", "0.1",
                   "--seed", "5"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> cli = step_losses(r);
  REQUIRE(cli.size() == 6u);
  check_same_losses(cli, library_losses(transformer::init(cfg, 5, cpu_backend()),
                                        tmp / "data.bin", 6, 1e-3f, 0.1f));
  // A different seed is a different initialisation.
  const process_result other =
      run_corolla({"train", "--model", model_dir, "--data", tmp / "data.bin", "--batch", "2",
                   "--seq", "16", "--steps", "1", "--lr", "1e-3", "--seed", "6"});
  REQUIRE(other.exit_code == 0);
  CHECK(step_losses(other).front() != doctest::Approx(cli.front()).epsilon(1e-7));
}

TEST_CASE("corolla train continues from a weights directory and saves a model generate can load") {
  temp_dir_guard tmp("cli-train-weights");
  const fs::path model_dir = tmp / "gpt2";
  write_tiny_model(model_dir, tiny_gpt2());
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(300));
  const fs::path saved = tmp / "saved";

  const process_result r =
      run_corolla({"train", "--model", model_dir, "--data", tmp / "tokens.bin", "--batch", "2",
                   "--seq", "16", "--steps", "5", "--lr", "3e-3", "--save", saved});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> cli = step_losses(r);
  check_same_losses(cli, library_losses(transformer::load(model_dir, cpu_backend()),
                                        tmp / "tokens.bin", 5, 3e-3f, 0.0f));
  REQUIRE(fs::exists(saved / "config.json"));

  // The saved model holds the trained weights: its loss on the first batch
  // is what a sixth step would have reported, not the initial loss.
  transformer reloaded = transformer::load(saved, cpu_backend());
  token_dataset data = token_dataset::open(tmp / "tokens.bin", nullptr, 64);
  std::vector<std::int32_t> ids, targets;
  data.next_batch(2, 16, ids, targets);
  CHECK(reloaded.forward_loss(ids, targets, 2, 16) < cli.front() - 1e-3);

  const process_result gen =
      run_corolla({"generate", "--model", saved, "--prompt-ids", "1,2", "--max-new-tokens", "4",
                   "--temperature", "0", "--print-ids"});
  INFO("generate stderr: " << gen.err);
  REQUIRE(gen.exit_code == 0);
  const std::vector<std::string> out = gen.out_lines();
  REQUIRE(!out.empty());
  std::istringstream last(out.back());
  int id = 0, count = 0;
  while (last >> id) {
    CHECK(id >= 0);
    CHECK(id < 64);
    ++count;
  }
  CHECK(count == 4);
}

TEST_CASE("corolla train --micro-batch accumulates gradients: the library's losses, and the whole batch's") {
  temp_dir_guard tmp("cli-train-micro");
  const fs::path model_dir = tmp / "gpt2";
  write_tiny_model(model_dir, tiny_gpt2());
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(400));
  const process_result r =
      run_corolla({"train", "--model", model_dir, "--data", tmp / "tokens.bin", "--batch", "4", "--micro-batch", "2",
                   "--seq", "16", "--steps", "4", "--lr", "3e-3"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> cli = step_losses(r);
  check_same_losses(cli, library_losses(transformer::load(model_dir, cpu_backend()), tmp / "tokens.bin", 4, 3e-3f,
                                        0.0f, 4, 2));
  // The same steps as the whole batch at once, to f32 summation order.
  const std::vector<float> whole =
      library_losses(transformer::load(model_dir, cpu_backend()), tmp / "tokens.bin", 4, 3e-3f, 0.0f, 4);
  REQUIRE(whole.size() == cli.size());
  for (std::size_t i = 0; i < cli.size(); ++i) CHECK(std::abs(cli[i] - whole[i]) < 2e-5);
}

TEST_CASE("corolla train tokenises text data with the model directory's tokenizer") {
  temp_dir_guard tmp("cli-train-text");
  tiny_model_options o = tiny_gpt2();
  o.sentencepiece_tokenizer = true;
  write_tiny_model(tmp / "gpt2", o);
  {
    std::ofstream(tmp / "corpus.txt") << tiny_corpus(o.vocab);
  }
  const process_result r =
      run_corolla({"train", "--model", tmp / "gpt2", "--data", tmp / "corpus.txt", "--batch",
                   "2", "--seq", "16", "--steps", "3", "--lr", "1e-3"});
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<double> cli = step_losses(r);

  transformer model = transformer::load(tmp / "gpt2", cpu_backend());
  const auto tok = load_tokenizer(tmp / "gpt2");
  token_dataset data = token_dataset::open(tmp / "corpus.txt", tok.get(), o.vocab);
  train_options opts;
  opts.batch = 2;
  opts.seq = 16;
  opts.steps = 3;
  opts.optimizer.adamw.lr = 1e-3f;
  trainer t(model, data, opts);
  check_same_losses(cli, t.run().losses);
}

TEST_CASE("corolla train --json and --log-every print the chosen steps for scripts") {
  temp_dir_guard tmp("cli-train-json");
  write_tiny_model(tmp / "gpt2", tiny_gpt2());
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(200));
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"train",   "--model", tmp / "gpt2", "--data",
                                     tmp / "tokens.bin", "--batch", "1", "--seq", "8",
                                     "--steps", "7", "--lr", "1e-3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };

  const process_result sparse = run_corolla(with({"--log-every", "3"}));
  REQUIRE(sparse.exit_code == 0);
  std::vector<std::string> want = {"step 1 ", "step 3 ", "step 6 ", "step 7 "};
  const std::vector<std::string> got = sparse.out_lines();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i].rfind(want[i], 0) == 0);

  const process_result js = run_corolla(with({"--json", "--grad-clip", "1"}));
  REQUIRE(js.exit_code == 0);
  const std::vector<std::string> jl = js.out_lines();
  REQUIRE(jl.size() == 8u);  // 7 steps + summary
  CHECK(jl.front().find("\"step\":1") != std::string::npos);
  CHECK(jl.front().find("\"grad_norm\"") != std::string::npos);
  CHECK(jl.back().find("\"tokens_per_s\"") != std::string::npos);
  CHECK(jl.back().find("\"tokens\":56") != std::string::npos);
}

TEST_CASE("corolla train --loss-scale dynamic reports its scale and, in f32, trains exactly as without") {
  temp_dir_guard tmp("cli-train-loss-scale");
  write_tiny_model(tmp / "gpt2", tiny_gpt2());
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(200));
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"train",   "--model", tmp / "gpt2", "--data", tmp / "tokens.bin", "--batch",
                                     "1",       "--seq",   "8",          "--steps", "4",              "--lr",
                                     "1e-3", "--device", "cpu"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const process_result plain = run_corolla(with({}));
  const process_result scaled = run_corolla(with({"--loss-scale", "dynamic"}));
  INFO("stderr: " << scaled.err);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(scaled.exit_code == 0);
  // A power-of-two scale that never overflows changes no bit of f32 training.
  CHECK(scaled.out == plain.out);

  const process_result js = run_corolla(with({"--loss-scale", "dynamic", "--json"}));
  REQUIRE(js.exit_code == 0);
  const std::vector<std::string> lines = js.out_lines();
  REQUIRE(lines.size() == 5u);
  for (std::size_t i = 0; i < 4; ++i) {
    const nlohmann::json step = nlohmann::json::parse(lines[i]);
    CHECK(step.at("loss_scale").get<double>() == 65536.0);
    CHECK(step.at("skipped").get<bool>() == false);
    CHECK(step.at("grad_norm").get<double>() > 0.0);
  }
  const nlohmann::json summary = nlohmann::json::parse(lines.back());
  CHECK(summary.at("skipped_steps").get<int>() == 0);
  CHECK(summary.at("loss_scale").get<double>() == 65536.0);
  // Off (the default for f32) prints neither.
  const process_result off = run_corolla(with({"--json"}));
  REQUIRE(off.exit_code == 0);
  CHECK(off.out.find("loss_scale") == std::string::npos);
}

TEST_CASE("corolla train rejects bad input with one error line and exit code 1") {
  temp_dir_guard tmp("cli-train-bad");
  write_tiny_model(tmp / "gpt2", tiny_gpt2());  // context 32
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(200));
  const std::string model = tmp / "gpt2";
  const std::string data = tmp / "tokens.bin";
  struct bad_case {
    std::string what;
    std::vector<std::string> args;
    std::string mentions;
  };
  auto args_for = [&](std::string model_arg, std::string data_arg, std::string batch,
                      std::string seq) {
    return std::vector<std::string>{"--model", model_arg, "--data", data_arg,
                                    "--batch", batch,     "--seq",  seq};
  };
  std::vector<bad_case> cases = {
      {"missing data file", args_for(model, tmp / "nope.bin", "1", "8"), "nope.bin"},
      {"sequence beyond the context", args_for(model, data, "1", "33"), "context of 32"},
      {"batch of zero", args_for(model, data, "0", "8"), "batch size"},
      {"missing model directory", args_for(tmp / "absent", data, "1", "8"), "absent"},
      {"text data without a tokenizer", args_for(model, tmp / "gpt2" / "config.json", "1", "8"),
       "tokenizer"},
  };
  cases.push_back({"micro-batch not dividing the batch", args_for(model, data, "2", "8"),
                   "a micro-batch of 3 sequences does not divide the batch of 2"});
  cases.back().args.insert(cases.back().args.end(), {"--micro-batch", "3"});
  cases.push_back({"unknown device", args_for(model, data, "1", "8"), "tpu"});
  cases.back().args.insert(cases.back().args.end(), {"--device", "tpu"});
  cases.push_back({"unknown matmul precision", args_for(model, data, "1", "8"), "unknown matmul precision 'fp8'"});
  cases.back().args.insert(cases.back().args.end(), {"--matmul", "fp8"});
  cases.push_back({"unknown matmul precision, distributed", args_for(model, data, "2", "8"), "unknown matmul precision"});
  cases.back().args.insert(cases.back().args.end(), {"--matmul", "fp8", "--pp", "2"});
  cases.push_back({"unknown compute dtype", args_for(model, data, "1", "8"), "not 'fp8'"});
  cases.back().args.insert(cases.back().args.end(), {"--compute", "fp8"});
  cases.push_back({"16-bit compute on the cpu", args_for(model, data, "1", "8"),
                   "--compute bf16 needs a GPU (--device cuda): the cpu backend computes in f32"});
  cases.back().args.insert(cases.back().args.end(), {"--compute", "bf16", "--device", "cpu"});
  cases.push_back({"16-bit compute on the cpu, distributed", args_for(model, data, "2", "8"), "--compute bf16 needs a GPU"});
  cases.back().args.insert(cases.back().args.end(), {"--compute", "bf16", "--device", "cpu", "--pp", "2"});
  cases.push_back({"f16 compute on the cpu", args_for(model, data, "1", "8"),
                   "--compute f16 needs a GPU (--device cuda): the cpu backend computes in f32"});
  cases.back().args.insert(cases.back().args.end(), {"--compute", "f16", "--device", "cpu"});
  cases.push_back({"unknown loss scaling", args_for(model, data, "1", "8"),
                   "--loss-scale must be auto, dynamic or off, got 'static'"});
  cases.back().args.insert(cases.back().args.end(), {"--loss-scale", "static"});
  cases.push_back({"unknown loss scaling, distributed", args_for(model, data, "2", "8"), "--loss-scale must be"});
  cases.back().args.insert(cases.back().args.end(), {"--loss-scale", "2", "--pp", "2"});
  // Optimiser settings that would train to NaN are refused before anything trains.
  for (const auto& [flag, value, rule] : std::vector<std::array<std::string, 3>>{
           {"--beta1", "nan", "--beta1 must be in [0, 1), got nan"},
           {"--beta2", "1", "--beta2 must be in [0, 1), got 1"},
           {"--eps", "0", "--eps must be a finite number > 0, got 0"},
           {"--weight-decay", "-1", "--weight-decay must be a finite number >= 0, got -1"},
           {"--grad-clip", "inf", "--grad-clip must be a finite number >= 0 (0 = no clipping), got inf"},
           {"--grad-clip", "-1", "--grad-clip must be a finite number >= 0 (0 = no clipping), got -1"}}) {
    cases.push_back({flag + " " + value, args_for(model, data, "1", "8"), rule});
    cases.back().args.insert(cases.back().args.end(), {flag, value});
    cases.push_back({flag + " " + value + ", distributed", args_for(model, data, "2", "8"), rule});
    cases.back().args.insert(cases.back().args.end(), {flag, value, "--pp", "2"});
  }
  for (const bad_case& c : cases) {
    std::vector<std::string> args = {"train", "--steps", "2", "--lr", "1e-3"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const process_result r = run_corolla(args);
    INFO(c.what << ": stderr = " << r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    const std::vector<std::string> err = r.err_lines();
    REQUIRE(err.size() == 1u);
    CHECK(err[0].rfind("corolla: error: ", 0) == 0);
    CHECK(err[0].find(c.mentions) != std::string::npos);
  }
}

TEST_CASE("a learning rate that cannot train is refused, and a run that diverges saves nothing over the model") {
  temp_dir_guard tmp("cli-train-diverge");
  write_tiny_model(tmp / "gpt2", tiny_gpt2());
  write_raw_u16(tmp / "tokens.bin", pattern_tokens(300));
  auto train = [&](const std::string& lr) {
    return run_corolla({"train", "--model", tmp / "gpt2", "--data", tmp / "tokens.bin", "--batch", "2", "--seq", "16",
                        "--steps", "3", "--lr", lr, "--save", tmp / "gpt2"});
  };
  const std::string before = read_whole_file(tmp / "gpt2" / "model.safetensors");

  const process_result negative_pp =
      run_corolla({"train", "--model", tmp / "gpt2", "--data", tmp / "tokens.bin", "--batch", "2", "--seq", "16",
                   "--steps", "3", "--lr", "1e-3", "--pp", "-1"});
  CHECK(negative_pp.exit_code == 105);  // CLI11's validation error
  CHECK(negative_pp.err.find("--pp: Value -1 not in range 0 to 4096") != std::string::npos);

  const process_result nan_lr = train("nan");
  CHECK(nan_lr.exit_code == 1);
  CHECK(nan_lr.err == "corolla: error: --lr must be a finite number >= 0, got nan\n");

  // A finite rate so large that the weights overflow: the run ends with an
  // error instead of overwriting the model it started from.
  const process_result diverged = train("1e30");
  INFO("stderr: " << diverged.err);
  CHECK(diverged.exit_code == 1);
  REQUIRE_FALSE(diverged.err_lines().empty());
  CHECK(diverged.err_lines().back() ==
        "corolla: error: the loss of step 3 is not finite: the model diverged and is not saved (" +
            (tmp / "gpt2").string() + " is unchanged)");
  CHECK(read_whole_file(tmp / "gpt2" / "model.safetensors") == before);
}
