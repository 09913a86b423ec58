// corolla bench lora-ranks — a LoRA adapter trained across real rank
// processes on this machine (`corolla train --lora-rank --pp --dp`) beside
// the frozen model's blocks held as f32 and as --weights (QLoRA across
// ranks), in the same invocation: each rank process's peak anonymous
// resident memory (sampled from /proc while the job runs) and the steps'
// tokens/s, with the QLoRA run's ratios to the f32 run's. A human summary
// and one machine-readable JSON line.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench_model.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/scratch_dir.hpp"
#include "apps/self_process.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;

struct lora_ranks_options {
  std::string model_dir;
  int pp = 2, dp = 1;
  int rank = 8;
  int steps = 6, batch = 4, seq = 128;
  int threads = 1;
  std::string weights = "nf4";
  std::string device = "cpu";
  std::uint64_t seed = 0;
  bool json = false;
};

/// One `corolla train` run: its ranks' peak anonymous memory and the
/// steps' tokens/s.
struct ranks_run {
  std::vector<double> rank_peak_mib;  ///< per rank process, by its --rank
  double median_tokens_per_s = 0;     ///< over the steps after the first
};

/// RssAnon of process `pid` in KiB (0: gone).
double anon_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stod(line.substr(8));
  return 0;
}

ranks_run run_ranks(const lora_ranks_options& o, const fs::path& model, const fs::path& data, const fs::path& dir,
                    const std::string& weights) {
  const fs::path out = dir / ("train-" + weights + ".json"), err = dir / ("train-" + weights + ".err");
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write " + out.string());
  const std::vector<std::string> args{
      "train",   "--model",   model.string(),         "--data",        data.string(),       "--steps",
      std::to_string(o.steps), "--batch", std::to_string(o.batch), "--seq", std::to_string(o.seq), "--lr",
      "1e-3",    "--lora-rank", std::to_string(o.rank), "--pp",          std::to_string(o.pp), "--dp",
      std::to_string(o.dp), "--weights", weights,     "--threads",     std::to_string(o.threads), "--device",
      o.device,  "--seed",    std::to_string(o.seed), "--json"};
  pid_t pid = spawn_self(args, fd, err.string());
  ::close(fd);
  end_on_stop_signal(pid);
  std::map<int, double> peak;  // by --rank
  int status = 0;
  for (;;) {
    for (const auto& [rank, child] : rank_processes_of(pid)) peak[rank] = std::max(peak[rank], anon_kib(child) / 1024);
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) throw std::runtime_error("lost the train process");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  forget_on_stop_signal(pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream e(err);
    std::stringstream text;
    text << e.rdbuf();
    throw std::runtime_error("corolla train --weights " + weights + " failed: " + text.str());
  }
  ranks_run r;
  std::vector<double> rates;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || j.contains("steps")) continue;
    if (j["step"].get<int>() > 1) rates.push_back(j.value("tokens_per_s", 0.0));
  }
  if (rates.empty()) throw std::runtime_error("corolla train --weights " + weights + " printed no timed step");
  std::sort(rates.begin(), rates.end());
  r.median_tokens_per_s = rates[rates.size() / 2];
  for (int rank = 0; rank < o.pp * o.dp; ++rank) r.rank_peak_mib.push_back(peak.count(rank) ? peak[rank] : 0.0);
  return r;
}

int run_lora_ranks(const lora_ranks_options& o) {
  const weight_format f = parse_weights_flag(o.weights);
  if (f == weight_format::f32)
    throw std::invalid_argument("--weights f32 is the baseline: give bf16, int8 or nf4 to compare with it");
  if (o.steps < 2) throw std::invalid_argument("--steps must be at least 2 (the first step is not timed)");
  const bench_model_dir on_disk(o.model_dir, "lora-ranks", o.seed);
  const model_config cfg = load_config(on_disk.path());
  const scratch_dir scratch("corolla-bench-lora-ranks");
  // Token ids drawn below the vocabulary (and u16): what the steps read.
  const fs::path data = scratch.path() / "tokens.bin";
  {
    std::mt19937 rng(static_cast<std::uint32_t>(o.seed));
    std::uniform_int_distribution<int> id(0, std::min(cfg.vocab_size, 65536) - 1);
    std::vector<std::uint16_t> ids(static_cast<std::size_t>(o.batch) * (o.seq + 1) * (o.steps + 1) * 2);
    for (auto& x : ids) x = static_cast<std::uint16_t>(id(rng));
    std::ofstream(data, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 2));
  }
  if (!o.json)
    std::fprintf(stderr, "bench lora-ranks: %d x %d ranks, r %d, %d steps of %d x %d tokens, beside f32 then %s\n",
                 o.pp, o.dp, o.rank, o.steps, o.batch, o.seq, o.weights.c_str());
  const ranks_run base = run_ranks(o, on_disk.path(), data, scratch.path(), "f32");
  const ranks_run q = run_ranks(o, on_disk.path(), data, scratch.path(), o.weights);
  const double base_max = *std::max_element(base.rank_peak_mib.begin(), base.rank_peak_mib.end());
  const double q_max = *std::max_element(q.rank_peak_mib.begin(), q.rank_peak_mib.end());
  const double memory_ratio = base_max > 0 ? q_max / base_max : 0;
  const double speed_ratio = base.median_tokens_per_s > 0 ? q.median_tokens_per_s / base.median_tokens_per_s : 0;
  nlohmann::json j{{"bench", "lora-ranks"},
                   {"layout", std::to_string(o.pp) + "x" + std::to_string(o.dp)},
                   {"parameters", cfg.parameter_count()},
                   {"rank", o.rank},
                   {"weights", o.weights},
                   {"f32", {{"rank_peak_mib", base.rank_peak_mib}, {"tokens_per_s", base.median_tokens_per_s}}},
                   {"quantised", {{"rank_peak_mib", q.rank_peak_mib}, {"tokens_per_s", q.median_tokens_per_s}}},
                   {"memory_ratio", memory_ratio},
                   {"speed_ratio", speed_ratio}};
  if (!o.json) {
    auto list = [](const std::vector<double>& v) {
      std::string s;
      for (double x : v) s += (s.empty() ? "" : ", ") + std::to_string(static_cast<long long>(x + 0.5));
      return s;
    };
    std::printf("LoRA r %d across %dx%d ranks, %.0fM-parameter model\n", o.rank, o.pp, o.dp,
                static_cast<double>(cfg.parameter_count()) / 1e6);
    std::printf("  beside f32 blocks:  rank peak anonymous memory %s MiB, %.1f tokens/s\n",
                list(base.rank_peak_mib).c_str(), base.median_tokens_per_s);
    std::printf("  beside %-4s blocks: rank peak anonymous memory %s MiB, %.1f tokens/s\n", o.weights.c_str(),
                list(q.rank_peak_mib).c_str(), q.median_tokens_per_s);
    std::printf("  %s/f32: %.3fx the largest rank's memory, %.3fx the tokens/s\n", o.weights.c_str(), memory_ratio,
                speed_ratio);
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_lora_ranks(CLI::App* bench, action_fn& action) {
  static lora_ranks_options o;
  auto* cmd = bench->add_subcommand(
      "lora-ranks",
      "A LoRA adapter across real rank processes beside f32 blocks vs beside --weights (QLoRA): each rank's peak "
      "memory and the steps' tokens/s");
  cmd->add_option("--model", o.model_dir, "A model directory with weights (default: the random ~100M bench model)");
  cmd->add_option("--pp", o.pp, "Pipeline stages")->check(integer_between(1, 64))->capture_default_str();
  cmd->add_option("--dp", o.dp, "Data-parallel replicas")->check(integer_between(1, 64))->capture_default_str();
  cmd->add_option("--rank", o.rank, "The adapter's rank r")->check(integer_between(1, 65536))->capture_default_str();
  cmd->add_option("--steps", o.steps, "Steps of each run (the first untimed)")
      ->check(integer_between(2, 100000))
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "Sequences per step")->check(integer_between(1, 1 << 16))->capture_default_str();
  cmd->add_option("--seq", o.seq, "Tokens per sequence")->check(integer_between(2, 1 << 20))->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads of each rank")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--weights", o.weights, "The frozen blocks' format compared with f32: bf16, int8 or nf4")
      ->capture_default_str();
  cmd->add_option("--device", o.device, "The ranks' device (cpu, cuda, auto)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the bench model, the adapter and the tokens")->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON line");
  cmd->callback([&action] { action = [] { return run_lora_ranks(o); }; });
}

}  // namespace corolla::app
