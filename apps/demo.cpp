// corolla demo — the main job on an embedded default, needing no download:
// train a SentencePiece tokenizer and a small GPT from scratch on the corpus
// built into the binary, for about a time budget with a progress display,
// pipeline x data-parallel on an emulated two-cluster layout the planner
// chooses (one rank process per worker, links shaped per NIC class), save
// the model as a HuggingFace directory, and generate from it. Then
// (unless --no-swarm) serve it from local `corolla serve` processes and
// generate through them while one is killed: the output must not change.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sentencepiece_trainer.h>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "apps/cluster_file.hpp"
#include "apps/commands.hpp"
#include "apps/demo_corpus.hpp"
#include "apps/flag_checks.hpp"
#include "apps/local_swarm.hpp"
#include "apps/plan_print.hpp"
#include "apps/train_args.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/safetensors.hpp"
#include "model/sampler.hpp"
#include "model/token_data.hpp"
#include "model/tokenizer.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "schedule/cluster.hpp"
#include "schedule/planner.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;

struct demo_options {
  std::string out = "corolla-demo";
  double seconds = 60;
  int threads = 0;
  std::string prompt = "Once upon a time";
  int max_new_tokens = 160;
  float temperature = 0.8f;
  int top_k = 40;
  std::uint64_t seed = 0;
  int vocab = 1024;
  bool no_swarm = false;
};

/// Tokens the swarm stage generates (greedy); the server is killed after a
/// third of them.
constexpr int swarm_tokens = 48;

/// Sequences per step and tokens per sequence of the demo's training.
constexpr int demo_batch = 8;
constexpr int demo_seq = 128;

/// The emulated layout the demo trains on: a fast-NIC cluster and an
/// Ethernet cluster of two single-worker CPU nodes each, at speeds scaled to
/// this machine (the planner sees them as it would real hardware).
constexpr const char* demo_cluster_toml = R"(# corolla demo: an emulated fast-NIC cluster next to an Ethernet cluster.
name = "demo-two-clusters"

[nic.ib]
bandwidth_gbps = 10
latency_us = 5

[nic.ethernet]
bandwidth_gbps = 1
latency_us = 50

[[cluster]]
name = "fast"
  [[cluster.node]]
  name = "fast"
  count = 2
  nic = "ib"
    [[cluster.node.worker]]
    kind = "cpu"
    model = "cpu-core"
    tflops = 0.05
    memory_gib = 2

[[cluster]]
name = "eth"
  [[cluster.node]]
  name = "eth"
  count = 2
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    model = "cpu-core"
    tflops = 0.05
    memory_gib = 2

[[link]]
clusters = ["fast", "eth"]
bandwidth_gbps = 1
latency_us = 1000
)";

/// The demo model: GPT-2 architecture, ~2.5M parameters, trained in a minute
/// on two cores.
model_config demo_config(int vocab, int bos, int eos) {
  model_config c;
  c.arch = architecture::gpt2;
  c.hf_architecture = "GPT2LMHeadModel";
  c.vocab_size = vocab;
  c.hidden_size = 192;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.head_dim = 48;
  c.intermediate_size = 4 * 192;
  c.max_positions = 256;
  c.norm_eps = 1e-5f;
  c.tie_embeddings = true;
  c.bos_token_id = bos;
  c.eos_token_id = eos;
  return c;
}

/// Splits the corpus into stories (blocks separated by a blank line).
std::vector<std::string> split_stories(std::string_view text) {
  std::vector<std::string> stories;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find("\n\n", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view s = text.substr(pos, end - pos);
    if (s.find_first_not_of(" \n") != std::string_view::npos) stories.emplace_back(s);
    pos = end + 2;
  }
  return stories;
}

void train_tokenizer(const fs::path& corpus, const fs::path& model_dir, int vocab) {
  std::string args = "--input=" + corpus.string() + " --model_prefix=" +
                     (model_dir / "tokenizer").string() + " --vocab_size=" +
                     std::to_string(vocab) +
                     " --model_type=bpe --character_coverage=1.0 --unk_id=0 --bos_id=1"
                     " --eos_id=2 --pad_id=-1 --minloglevel=2 --num_threads=2";
  // The trainer logs its command line to stderr before it parses
  // --minloglevel; keep the demo's output clean (failures come back in status).
  std::fflush(stderr);
  int saved = dup(STDERR_FILENO);
  int devnull = open("/dev/null", O_WRONLY);
  if (saved >= 0 && devnull >= 0) dup2(devnull, STDERR_FILENO);
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (saved >= 0) {
    dup2(saved, STDERR_FILENO);
    close(saved);
  }
  if (devnull >= 0) close(devnull);
  if (!status.ok())
    throw model_error("training the demo tokenizer failed: " + std::string(status.message()));
  fs::remove(model_dir / "tokenizer.vocab");
}

/// One-line progress display: redrawn in place on a terminal, a plain line
/// every few seconds otherwise.
class progress_line {
 public:
  progress_line() : tty_(isatty(STDERR_FILENO) != 0) {}
  void update(double elapsed, double budget, int step, float loss, double tok_s) {
    if (tty_) {
      int width = 30;
      int filled = static_cast<int>(std::min(1.0, elapsed / budget) * width);
      std::fprintf(stderr, "\r  [%s%s] %4.0f/%.0f s  step %4d  loss %6.3f  %6.0f tok/s ",
                   std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(width - filled), '.').c_str(), elapsed,
                   budget, step, loss, tok_s);
      std::fflush(stderr);
    } else if (elapsed - last_ >= 5.0 || step == 1) {
      std::fprintf(stderr, "  %4.0f/%.0f s  step %4d  loss %6.3f  %6.0f tok/s\n", elapsed, budget,
                   step, loss, tok_s);
      last_ = elapsed;
    }
  }
  void done() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool tty_;
  double last_ = -1e9;
};

/// The text of `prompt` followed by the generated `ids` (decoded together,
/// so the space between them comes out as in the text).
std::string text_of(const tokenizer& tok, std::span<const std::int32_t> prompt, std::span<const std::int32_t> ids) {
  std::vector<std::int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), ids.begin(), ids.end());
  return tok.decode(all);
}

/// The server of the last hop of a "route [a, b) via X -> [b, c) via Y"
/// event ("" when the line names none).
std::string last_hop_server(const std::string& route_line) {
  static const std::regex via(R"( via (\S+))");
  std::string last;
  for (auto it = std::sregex_iterator(route_line.begin(), route_line.end(), via); it != std::sregex_iterator(); ++it)
    last = (*it)[1].str();
  return last;
}

/// The swarm stage: the saved model served by three `corolla serve`
/// children of this binary, the second half of the blocks twice; greedy
/// generation through them, with the last hop's server killed (SIGKILL)
/// after a third of the tokens, must equal local greedy generation token
/// for token. Returns the exit code: 0 when equal, 1 when not.
int run_swarm_stage(const demo_options& o, const fs::path& out, const fs::path& model_dir, transformer& local,
                    const tokenizer& tok) {
  const model_config cfg = load_config(model_dir);
  const int half = cfg.n_layers / 2;
  std::printf("\n== swarm: 3 servers on 127.0.0.1, blocks [%d, %d) held twice (logs: %s/serve-*.log)\n", half,
              cfg.n_layers, out.c_str());
  std::fflush(stdout);
  local_swarm servers;  // every server is killed and reaped when this goes, also on an exception
  struct layout_entry {
    const char* id;
    int first, last;
  };
  const std::string model_name = model_dir.filename().string();
  for (const layout_entry& e : {layout_entry{"s-a", 0, half}, layout_entry{"s-b", half, cfg.n_layers},
                                layout_entry{"s-c", half, cfg.n_layers}}) {
    const auto& s = servers.start(model_dir, e.id, e.first, e.last, {"--threads", "1", "--log-level", "warn"},
                                out / ("serve-" + std::string(e.id) + ".log"), std::chrono::seconds(30));
    // The server's readiness line (local_swarm matched it; it carries no more than this).
    std::printf("  corolla serve %s blocks [%d, %d) of %s listening on %s\n", s.id.c_str(), s.first, s.last,
                model_name.c_str(), s.endpoint.c_str());
    std::fflush(stdout);
  }

  generation_params gp;
  gp.max_new_tokens = swarm_tokens;
  gp.sampling.temperature = 0;  // greedy: the same tokens wherever the blocks run
  gp.ignore_eos = true;
  const std::vector<std::int32_t> prompt = tok.encode(o.prompt, true);
  generator gen(local);
  const generation_result reference = gen.generate(prompt, gp);
  const int kill_after = swarm_tokens / 3;
  std::printf("local greedy reference: %zu tokens; now through the swarm, killing the last hop's server "
              "after token %d:\n",
              reference.tokens.size(), kill_after);
  std::fflush(stdout);

  node_options no;
  no.listen = "";  // the client only dials out
  auto client_node = node::start(no);
  if (!client_node) throw std::runtime_error("cannot start the client node: " + error_message(client_node.error()));
  swarm_client_options co;
  co.servers = servers.endpoints();
  co.model = model_name;
  std::string route;
  co.on_event = [&route](const std::string& line) {
    if (line.rfind("route ", 0) == 0) route = line;
    std::printf("  %s\n", line.c_str());
    std::fflush(stdout);
  };
  swarm_client client(**client_node, co);
  head client_head = head::load(checkpoint::open(model_dir), cfg, cpu_backend());

  int produced = 0;
  const auto t0 = std::chrono::steady_clock::now();
  swarm_generation g = swarm_generate(client, client_head, prompt, gp, [&](std::int32_t) {
    if (++produced != kill_after) return;
    const std::string victim = last_hop_server(route);
    pid_t pid = -1;
    for (const auto& s : servers.servers())
      if (s.id == victim) pid = s.pid;
    if (pid <= 0) {
      std::printf("  (no server of ours on the route's last hop '%s'; nothing killed)\n", victim.c_str());
      return;
    }
    std::printf("  token %d of %d: kill -9 %s (pid %d)\n", produced, swarm_tokens, victim.c_str(),
                static_cast<int>(pid));
    std::fflush(stdout);
    servers.signal(victim, SIGKILL);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string final_route;
  for (const auto& hop : g.route)
    final_route += (final_route.empty() ? "" : " -> ") + to_string(hop.span()) + " via " + hop.server;
  std::printf("\n%s\n\n", text_of(tok, prompt, g.result.tokens).c_str());
  std::printf("(%zu tokens through the swarm in %.1f s, %d failover(s), %llu hop input(s) pushed server to server; "
              "route at the end: %s)\n",
              g.result.tokens.size(), seconds, g.failovers, static_cast<unsigned long long>(g.pushed_hops),
              final_route.c_str());

  const auto& want = reference.tokens;
  const auto& got = g.result.tokens;
  if (got == want) {
    std::printf("the swarm output equals the local greedy output, token for token (%zu tokens)\n", got.size());
    return 0;
  }
  std::size_t at = 0;
  while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
  std::printf("the swarm output DIFFERS from the local greedy output from token %zu on (%zu vs %zu tokens); "
              "local:\n%s\n",
              at + 1, got.size(), want.size(), text_of(tok, prompt, want).c_str());
  return 1;
}

int run_demo(const demo_options& o) {
  apply_common_options(o.threads, "warn");
  // The sampling flags are checked before training, not after it wrote the model.
  check_sampling_params({.temperature = o.temperature, .top_k = o.top_k});
  Backend& be = cpu_backend();
  fs::path out = o.out;
  fs::path model_dir = out / "model";
  fs::create_directories(model_dir);

  std::string_view corpus = demo_corpus();
  std::vector<std::string> stories = split_stories(corpus);
  fs::path corpus_file = out / "corpus.txt";
  {
    std::ofstream f(corpus_file, std::ios::binary);
    f.write(corpus.data(), static_cast<std::streamsize>(corpus.size()));
    if (!f) throw model_error("cannot write " + corpus_file.string());
  }
  std::printf("corolla demo: train a small GPT from scratch, save it, generate from it%s\n",
              o.no_swarm ? "" : ", serve it from a local swarm");
  std::printf("[1/4] corpus: %zu stories, %.0f KB, built into the binary -> %s\n", stories.size(),
              static_cast<double>(corpus.size()) / 1024.0, corpus_file.c_str());

  train_tokenizer(corpus_file, model_dir, o.vocab);
  auto tok = load_tokenizer(model_dir);
  std::vector<std::int32_t> tokens;
  for (const auto& s : stories) {
    auto ids = tok->encode(s, true);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (tok->eos_id() >= 0) tokens.push_back(tok->eos_id());
  }
  std::printf("[2/4] tokenizer: SentencePiece BPE, %d tokens in the vocabulary; corpus = %zu tokens\n",
              tok->vocab_size(), tokens.size());

  model_config cfg = demo_config(tok->vocab_size(), tok->bos_id(), tok->eos_id());
  const fs::path tokens_file = out / "tokens.bin";
  {
    // The ranks read the corpus as raw uint16 ids (the vocabulary is far
    // below 65536).
    std::vector<std::uint16_t> ids(tokens.begin(), tokens.end());
    std::ofstream f(tokens_file, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof ids[0]));
    if (!f) throw model_error("cannot write " + tokens_file.string());
  }
  // A fresh model: config.json only; every rank initialises it from --seed.
  {
    std::ofstream f(model_dir / "config.json", std::ios::trunc);
    f << to_hf_json(cfg).dump(2) << '\n';
    if (!f) throw model_error("cannot write " + (model_dir / "config.json").string());
  }

  // The emulated two-cluster layout, planned like any cluster file.
  const fs::path cluster_file = out / "cluster.toml";
  {
    std::ofstream f(cluster_file, std::ios::trunc);
    f << demo_cluster_toml;
  }
  const schedule::cluster_description cluster = load_cluster_file(cluster_file);
  schedule::training_setup setup;
  setup.set_precision(schedule::precision::fp32);
  setup.global_batch = demo_batch;
  setup.micro_batch = 1;
  setup.seq = demo_seq;
  const schedule::plan plan = schedule::make_plan(cluster, cfg, setup).best;
  if (!plan.feasible) throw model_error("no feasible plan for the demo cluster: " + plan.reason);

  // Steps for the time budget, from one timed local step (the distributed
  // run shares these cores between its rank processes, hence the margin).
  double local_step_s = 0;
  {
    transformer probe = transformer::init(cfg, o.seed, be);
    token_dataset probe_data = token_dataset::from_tokens(tokens, cfg.vocab_size, "demo corpus");
    train_options popt;
    popt.batch = demo_batch;
    popt.seq = demo_seq;
    popt.steps = 2;
    trainer probe_train(probe, probe_data, popt);
    probe_train.step();  // warm-up
    local_step_s = probe_train.step().seconds;
  }
  const int steps = std::max(3, static_cast<int>(o.seconds / (2.0 * local_step_s)));

  std::printf("[3/4] training GPT-2-style model: %d layers, dim %d, %.2fM parameters, batch %dx%d, AdamW, "
              "%d steps (about %.0f s), on an emulated two-cluster layout (%s):\n",
              cfg.n_layers, cfg.hidden_size, static_cast<double>(cfg.parameter_count()) / 1e6, demo_batch, demo_seq,
              steps, o.seconds, cluster_file.c_str());
  print_plan(stdout, cluster, plan);
  std::fflush(stdout);

  train_args targs;
  targs.model = model_dir.string();
  targs.data = tokens_file.string();
  targs.batch = demo_batch;
  targs.seq = demo_seq;
  targs.steps = steps;
  targs.seed = o.seed;
  targs.threads = 1;
  dist_train_options job;
  use_plan(cluster, plan, job);
  job.batch = demo_batch;
  job.seq = demo_seq;
  job.steps = steps;
  // Short linear warm-up, then cosine decay to 10%.
  job.optimizer.adamw = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  job.optimizer.max_grad_norm = 1.0f;
  job.optimizer.schedule = {std::min(10, steps / 2), true, 0.1f};
  job.save_dir = model_dir;

  progress_line progress;
  const auto t0 = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0, elapsed = 0;
  int step = 0;
  run_local_job(targs, job, cfg, [&](const dist_step_report& r) {
    step = r.step;
    if (step == 1) first_loss = r.loss;
    last_loss = r.loss;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.update(elapsed, o.seconds, step, static_cast<float>(r.loss),
                    r.seconds > 0 ? demo_batch * demo_seq / r.seconds : 0.0);
  });
  progress.done();
  std::printf("      %d steps in %.0f s on %d rank processes: loss %.3f -> %.3f\n", step, elapsed, job.layout.world(),
              first_loss, last_loss);
  std::printf("[4/4] saved %s (config.json, model.safetensors, tokenizer.model); generating:\n\n",
              model_dir.c_str());
  std::fflush(stdout);

  // Reload from disk so the demo also exercises the real loading path.
  transformer loaded = transformer::load(model_dir, be);
  generator gen(loaded);
  generation_params gp;
  gp.max_new_tokens = o.max_new_tokens;
  gp.sampling.temperature = o.temperature;
  gp.sampling.top_k = o.top_k;
  gp.sampling.seed = o.seed;
  std::vector<std::int32_t> prompt = tok->encode(o.prompt, true);
  stream_decoder stream(*tok);
  std::printf("%s", o.prompt.c_str());
  bool first = true;
  auto res = gen.generate(prompt, gp, [&](std::int32_t id) {
    std::string piece = stream.push(id);
    // The decoder drops SentencePiece's leading space on the first piece.
    if (first && !piece.empty() && piece[0] != ' ') piece.insert(piece.begin(), ' ');
    first = piece.empty() && first;
    std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
  });
  std::printf("%s\n\n", stream.flush().c_str());
  std::printf("(%zu tokens, %.1f tokens/s)  Try: corolla generate --model %s --prompt \"%s\"\n",
              res.tokens.size(), res.decode_seconds > 0 ? res.decode_steps / res.decode_seconds : 0.0,
              model_dir.c_str(), o.prompt.c_str());
  if (o.no_swarm) return 0;
  return run_swarm_stage(o, out, model_dir, loaded, *tok);
}

}  // namespace

void register_demo(CLI::App& app, action_fn& action) {
  static demo_options o;
  auto* cmd = app.add_subcommand(
      "demo", "Train a small GPT on the built-in corpus for about a minute, save it, generate, "
      "then generate through a local swarm while a server is killed");
  cmd->add_option("--out", o.out, "Directory for the corpus copy and the trained model")
      ->check(non_empty())
      ->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "Training time budget")->capture_default_str()
      ->check(finite_above(0));
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--prompt", o.prompt, "Prompt for the generation at the end")->capture_default_str();
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Top-k sampling (0 = off)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed for initialisation and sampling")
      ->check(unsigned_integer())
      ->capture_default_str();
  // The built-in corpus has 61 distinct characters and about 3700 BPE
  // merges in it: SentencePiece refuses sizes outside that.
  cmd->add_option("--vocab", o.vocab, "Tokenizer vocabulary size (128 to 3000: the built-in corpus holds no more)")
      ->check(integer_between(128, 3000))
      ->capture_default_str();
  cmd->add_flag("--no-swarm", o.no_swarm,
                "Skip the last stage (local corolla serve processes, one killed mid-generation)");
  cmd->callback([&action] { action = [] { return run_demo(o); }; });
}

}  // namespace corolla::app
