// corolla generate — local text generation from a HuggingFace model directory.
//
// stdout carries the generated text, streamed piece by piece as tokens are
// sampled (when the model has a tokenizer), and with --print-ids a last line
// holding the generated ids alone, space-separated, for scripts. Notes
// (stopping at the context limit, --stats) go to stderr.
#include <charconv>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/swarm_client.hpp"
#include "actors/swarm_generate.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/model_load.hpp"
#include "apps/swarm_flags.hpp"
#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/prompt_tuning.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"

namespace corolla::app {
namespace {

struct generate_options {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  bool has_prompt = false;      ///< --prompt given (possibly empty)
  bool has_prompt_ids = false;  ///< --prompt-ids given
  int max_new_tokens = 32;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  bool ignore_eos = false;
  bool print_ids = false;
  swarm_flags swarm;
  std::string compression = "none";  ///< --compression: hidden states on the wire
  bool no_server_push = false;  ///< --no-server-push: the client carries every hop
  bool stats = false;
  std::string device = "auto";
  std::string weights = "f32";  ///< --weights: dtype of the linear weights decode reads
  std::string adapter;          ///< --adapter: a LoRA adapter merged as the weights load
  std::string kv_dtype = "f32";  ///< --kv-dtype: element type of the local KV cache
  std::string prompts;          ///< --prompts: trained deep prompts (corolla finetune --save)
  int threads = 0;
  std::string log_level = "warn";
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// "1,2,3" -> {1, 2, 3}; anything else is a clear error.
std::vector<std::int32_t> parse_ids(const std::string& text) {
  std::vector<std::int32_t> ids;
  std::string_view rest = text;
  for (;;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    std::int32_t id = 0;
    const auto r = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || r.ec != std::errc() || r.ptr != item.data() + item.size())
      throw std::invalid_argument("invalid --prompt-ids '" + text + "': '" + std::string(item) +
                                  "' is not a token id (expected comma-separated integers, "
                                  "e.g. 1,2,3)");
    ids.push_back(id);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return ids;
}

void write_out(const std::string& text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

/// Local head, remote blocks: a node in this process connects to the
/// servers and routes the session through them (actors/swarm_client.hpp).
generation_result generate_through_swarm(const generate_options& o, head& h, std::span<const std::int32_t> prompt,
                                         const generation_params& p, const token_callback& on_token) {
  // A bad prompts file is an error before any server is contacted.
  const Tensor deep_prompts = o.prompts.empty() ? Tensor() : load_deep_prompts(o.prompts, h.config());
  swarm_connection c = connect_swarm(o.swarm, o.model, h.config().n_layers);
  // The client only embeds and samples: one thread, unless told otherwise,
  // so that its idle thread pool does not compete with servers sharing the
  // machine.
  if (o.threads == 0) set_cpu_threads(1);
  swarm_client_options& so = c.options;
  so.server_push = !o.no_server_push;
  so.adapter = o.adapter;  // a name the servers announce (serve --adapter NAME=DIR)
  if (o.compression == "int8")
    so.compress = true;
  else if (o.compression != "none")
    throw std::invalid_argument("--compression must be none or int8, got '" + o.compression + "'");
  swarm_client client(*c.runtime, so);
  swarm_generation g = swarm_generate(client, h, prompt, p, on_token, deep_prompts);
  std::string route;
  for (const auto& hop : g.route)
    route += (route.empty() ? "" : " -> ") + to_string(hop.span()) + " on " + hop.server;
  spdlog::info("swarm route: {}; {} failover(s); {} hop input(s) pushed server to server, {} step(s) posted", route,
               g.failovers, g.pushed_hops, g.posted_steps);
  const spot_check_stats& sc = g.spot_checks;
  spdlog::info("spot checks: {} step(s) compared with another server, {} with none to ask, {} disagreement(s), "
               "{} undecided, {} server(s) found wrong",
               sc.checks, sc.unchecked, sc.disagreements, sc.undecided, sc.wrong.size());
  return g.result;
}

int run_generate(const generate_options& o) {
  apply_common_options(o.threads, o.log_level);
  if (o.has_prompt == o.has_prompt_ids)
    throw std::invalid_argument("give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  std::vector<std::int32_t> prompt;
  if (o.has_prompt_ids) prompt = parse_ids(o.prompt_ids);
  const weight_format weights = parse_weights_flag(o.weights);
  const dtype kv = parse_kv_dtype_flag(o.kv_dtype);

  // With --swarm the servers compute the blocks and the head stays on the
  // cpu (its hidden states come from and go to the wire): auto means cpu.
  const device where = o.device == "auto" && o.swarm.given() ? device{} : parse_device(o.device);
  if (where.kind != device_kind::cpu && o.swarm.given())
    throw std::invalid_argument("--device " + o.device +
                                ": with --swarm the client's head runs on the cpu; the servers' --device places the blocks");
  Backend& be = backend_for(where);
  // With --swarm only the head (embeddings, final norm, LM head) is loaded
  // here; the servers hold the blocks.
  const model_config cfg = load_config(o.model);
  std::optional<transformer> model;
  std::optional<head> client_head;
  if (!o.swarm.given()) {
    // bf16, int8 or nf4: only those weights are kept (block by block), not
    // the f32 parameters beside them.
    model.emplace(load_for_decoding(o.model, be, weights, "generate", o.adapter));
  } else {
    // With --swarm, --weights covers the LM head held here; the servers'
    // blocks follow their own --weights.
    client_head.emplace(head::load(checkpoint::open(o.model), cfg, be));
    client_head->use_inference_weights(weights);
  }

  // Text needs the tokenizer; ids alone do not (text is then shown only
  // when the directory has one).
  std::unique_ptr<tokenizer> tok;
  if (o.has_prompt) {
    try {
      tok = load_tokenizer(o.model);
    } catch (const model_error& e) {
      throw model_error(std::string("--prompt needs a tokenizer (or use --prompt-ids): ") +
                        e.what());
    }
    prompt = tok->encode(o.prompt, tok->prepends_bos());
  } else {
    try {
      tok = load_tokenizer(o.model);
    } catch (const model_error& e) {
      // No tokenizer: ids only, as asked. A broken one is said.
      if (has_tokenizer_files(o.model))
        std::fprintf(stderr, "generate: %s; the output is shown as ids only\n", e.what());
      tok.reset();
    }
  }

  generation_params p;
  p.max_new_tokens = o.max_new_tokens;
  p.sampling = sampling_params{o.temperature, o.top_k, o.top_p, o.seed};
  p.ignore_eos = o.ignore_eos;
  if (tok && cfg.eos_token_id < 0) p.eos_id = tok->eos_id();

  std::optional<stream_decoder> text;
  if (tok) text.emplace(*tok);
  const token_callback on_token = [&](std::int32_t id) {
    if (text) write_out(text->push(id));
  };
  generation_result r;
  if (model) {
    generator gen(*model, 0, weights, kv);
    if (!o.prompts.empty()) gen.set_deep_prompts(load_deep_prompts(o.prompts, cfg));
    r = gen.generate(prompt, p, on_token);
  } else {
    r = generate_through_swarm(o, *client_head, prompt, p, on_token);
  }
  if (text) write_out(text->flush() + "\n");

  if (o.print_ids || !text) {
    std::string line;
    for (std::int32_t id : r.tokens) line += std::to_string(id) + " ";
    if (!line.empty()) line.pop_back();
    write_out(line + "\n");
  }
  if (r.reason == stop_reason::context)
    std::fprintf(stderr,
                 "corolla: note: stopped after %zu new tokens at the model context of %d tokens\n",
                 r.tokens.size(), cfg.max_positions);
  if (o.stats) {
    const double prefill_tps = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0;
    const double decode_tps = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0.0;
    std::fprintf(stderr,
                 "prefill: %d tokens in %.4f s (%.1f tokens/s); decode: %d tokens in %.4f s "
                 "(%.1f tokens/s)\n",
                 r.prompt_tokens, r.prefill_seconds, prefill_tps, r.decode_steps,
                 r.decode_seconds, decode_tps);
  }
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, action_fn& action) {
  auto o = std::make_shared<generate_options>();
  auto* cmd = app.add_subcommand("generate", "Generate text with a local model");
  cmd->add_option("--model", o->model, "HuggingFace model directory")->required();
  auto* prompt = cmd->add_option("--prompt", o->prompt, "Prompt text (needs a tokenizer)");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, e.g. 1,2,3");
  prompt->excludes(ids);
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")
      ->capture_default_str();
  // Checked on the text given: a float would hold 1e-300 as 0, and the
  // sampler's own message would then say "got 0.000000".
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")
      ->check(finite_between(0, 1e6))
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0 = all)")
      ->check(integer_between(0, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass (1 = off; above 0)")
      ->check(finite_between(1e-30, 1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")
      ->check(unsigned_integer())
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the end-of-sequence token");
  cmd->add_flag("--print-ids", o->print_ids,
                "End stdout with a line of the generated ids (space-separated)");
  cmd->add_flag("--stats", o->stats, "Print prefill and decode speed on stderr");
  add_swarm_flags(cmd, o->swarm);
  cmd->add_option("--compression", o->compression,
                  "Hidden states on the wire with --swarm: none, or int8 (blockwise absmax, ~1/4 of the bytes, "
                  "lossy)")
      ->capture_default_str();
  cmd->add_flag("--no-server-push", o->no_server_push,
               "With --swarm: the client sends every hop's input itself instead of servers pushing each step's "
               "output to the next server (two network crossings per server instead of one)");
  cmd->add_option("--device", o->device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--prompts", o->prompts,
                  "Trained deep prompts to generate after (the safetensors corolla finetune --save writes)");
  cmd->add_option("--adapter", o->adapter,
                  "A LoRA adapter (a PEFT directory, such as corolla train --lora-rank --save writes) merged into "
                  "the weights as they load. With --swarm: the NAME of an adapter servers hold (serve --adapter "
                  "NAME=DIR); the route takes only servers that announce it");
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "Element type of the KV cache: f32, or bf16/f16 (half its memory; keys and values rounded once "
                  "as stored). With --swarm the servers' own --kv-dtype applies")
      ->capture_default_str();
  cmd->add_option("--weights", o->weights,
                  "Linear weights decode reads: f32, bf16 (copies made at load: half the bytes per token), "
                  "int8 (quantised at load per output channel: a quarter) or nf4 (4-bit NormalFloat in blocks "
                  "of 64, int8 LM head: about an eighth); norms, biases and embeddings stay f32. With --swarm: "
                  "the LM head held here")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn, error, off")
      ->capture_default_str();
  cmd->callback([o, cmd, prompt, ids, &action] {
    o->has_prompt = prompt->count() > 0;
    o->has_prompt_ids = ids->count() > 0;
    action = [o, cmd] {
      refuse_swarm_only_flags(*cmd, o->swarm, {"--compression", "--no-server-push"});
      return run_generate(*o);
    };
  });
}

}  // namespace corolla::app
