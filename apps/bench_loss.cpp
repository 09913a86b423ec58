// corolla bench loss — the training loss of the head (final norm, LM head,
// softmax cross-entropy and their backward, model/head.hpp) with the logits
// formed a chunk of rows at a time, against all rows at once (the baseline,
// measured in the same run). Chunks bound the logits' memory to [chunk, V]
// instead of [rows, V] (0.8 GB of f32 for GPT-2 at B*T = 4096); this shows
// what the smaller products cost.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_timing.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/head.hpp"

namespace corolla::app {

namespace {

struct loss_options {
  std::string device = "auto";
  long long rows = 2048;
  long long vocab = 50257;
  long long hidden = 768;
  long long chunk_rows = 0;  ///< 0 = head's budget rule
  int rounds = 3;
  int threads = 0;
  bool json = false;
};

int run_loss(const loss_options& o) {
  apply_common_options(o.threads, "warn");
  Backend& be = backend_for(parse_device(o.device));
  model_config cfg;
  cfg.arch = architecture::llama;
  cfg.vocab_size = static_cast<int>(o.vocab);
  cfg.hidden_size = static_cast<int>(o.hidden);
  cfg.tie_embeddings = false;
  cfg.norm_eps = 1e-5f;
  head h(cfg, be);
  for (const auto& e : h.params().entries()) {
    Tensor t = h.params().get(e.name);
    const bool norm = e.name.find("norm") != std::string::npos;
    be.copy(random_tensor_on(cpu_backend(), t.shape(), dtype::f32, norm ? 3 : 4), t);
  }
  const std::int64_t N = o.rows, D = o.hidden;
  const Tensor x = random_tensor_on(be, {N, D}, dtype::f32, 5);
  std::vector<std::int32_t> t(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>((i * 7919) % static_cast<std::size_t>(o.vocab));
  const Tensor targets = Tensor::from_i32(t, {N});
  Tensor dx = be.empty({N, D});

  head_activations acts;
  auto time_with = [&](std::int64_t chunk) {
    h.set_loss_chunk_rows(chunk);
    return best_seconds(be, o.rounds, 1, [&] { h.loss(x, targets, &dx, 1.0f, acts); });
  };
  const double whole_s = time_with(N);
  const double chunked_s = time_with(o.chunk_rows);
  const std::int64_t used = h.loss_chunk_rows(N);  // --chunk-rows, or the budget rule's
  const double whole_mb = static_cast<double>(N) * o.vocab * 4 / 1e6, chunk_mb = static_cast<double>(used) * o.vocab * 4 / 1e6;
  const double flops = 6.0 * static_cast<double>(N) * o.vocab * D;  // forward, dx and dW products
  if (!o.json) {
    std::printf("head loss, %lld rows x vocab %lld x hidden %lld on %s\n", o.rows, o.vocab, o.hidden, be.name().c_str());
    std::printf("all rows at once      %9.2f ms  %8.1f GFLOP/s  logits %9.1f MB\n", whole_s * 1e3,
                flops / whole_s / 1e9, whole_mb);
    std::printf("chunks of %-8lld    %9.2f ms  %8.1f GFLOP/s  logits %9.1f MB  (time %.3fx, memory %.3fx)\n",
                static_cast<long long>(used), chunked_s * 1e3, flops / chunked_s / 1e9, chunk_mb, chunked_s / whole_s,
                chunk_mb / whole_mb);
  }
  const nlohmann::json j = {{"bench", "loss"},
                            {"device", be.name()},
                            {"threads", cpu_threads()},
                            {"rows", o.rows},
                            {"vocab", o.vocab},
                            {"hidden", o.hidden},
                            {"chunk_rows", used},
                            {"whole_ms", whole_s * 1e3},
                            {"chunked_ms", chunked_s * 1e3},
                            {"time_vs_whole", chunked_s / whole_s},
                            {"whole_logits_mb", whole_mb},
                            {"chunk_logits_mb", chunk_mb}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_loss(CLI::App* bench, action_fn& action) {
  static loss_options o;
  auto* cmd = bench->add_subcommand(
      "loss", "The head's training loss with the logits in chunks of rows vs all rows at once (time and memory)");
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--rows", o.rows, "Rows (B x T positions)")
      ->check(integer_between(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--vocab", o.vocab, "Vocabulary size (default GPT-2's)")
      ->check(integer_between(2, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--hidden", o.hidden, "Hidden size")->check(integer_between(1, 1 << 20))->capture_default_str();
  cmd->add_option("--chunk-rows", o.chunk_rows, "Rows per chunk (0 = the head's 256 MiB budget rule)")
      ->check(integer_between(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Timed rounds; the best counts")
      ->check(integer_between(1, 1000))
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_loss(o); }; });
}

}  // namespace corolla::app
