// corolla api — an OpenAI-compatible HTTP API over a model in this process
// (--local) or over a swarm (--swarm / --swarm-dht), see docs/api.md.
//
// Prints one line on stdout once it listens, so scripts and tests can read
// the address:
//   corolla api tiny listening on http://127.0.0.1:8000
// and serves until SIGINT or SIGTERM.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "actors/swarm_client.hpp"
#include "actors/swarm_wire.hpp"
#include "api/chat_template.hpp"
#include "api/completion_engine.hpp"
#include "api/http_api.hpp"
#include "api/server_metrics.hpp"
#include "api/swarm_view.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "apps/http_serving.hpp"
#include "apps/model_load.hpp"
#include "apps/node_flags.hpp"
#include "apps/serve_adapters.hpp"
#include "apps/swarm_flags.hpp"
#include "kernels/backend.hpp"
#include "model/error.hpp"
#include "model/lora.hpp"
#include "model/safetensors.hpp"
#include "model/whole_file.hpp"
#include "model/tokenizer.hpp"

namespace corolla::app {
namespace {

struct api_args {
  std::string model;
  bool local = false;
  swarm_flags swarm;
  std::string listen = "127.0.0.1:8000";
  std::string metrics_listen;  ///< --metrics-listen HOST:PORT: /metrics and /health on threads of their own
  std::string api_key;
  std::string api_key_file;  ///< --api-key-file: keys of tenants, one a line
  std::string chat_template;
  int parallel = 4;
  std::string batching = "on";
  std::string prefix_sharing = "on";
  bool isolate_requests = false;
  int http_threads = 64;
  int shutdown_grace_s = 30;
  int request_read_timeout_s = 60;
  std::string device = "auto";
  std::string weights = "f32";
  std::string kv_dtype = "f32";
  /// --adapter (repeatable): LoRA adapters requests name as their model:
  /// NAME=DIR (or DIR) loaded here with --local, NAME[@DIGEST] the servers
  /// hold with --swarm.
  std::vector<std::string> adapters;
  std::string merge_adapter;  ///< --merge-adapter DIR: merged into the weights as they load (--local)
  /// --adapter-tenants NAME=TENANT,... (repeatable): adapters private to
  /// those tenants of --api-key-file.
  std::vector<std::string> adapter_tenants;
  int threads = 0;
  std::string log_level = "warn";
};

/// The keys --api-key or --api-key-file give (none: no key required).
api::api_keys keys_of(const api_args& a) {
  if (!a.api_key_file.empty())
    return api::api_keys::parse(read_whole_file(a.api_key_file, "API key file", 1 << 20), a.api_key_file);
  if (!a.api_key.empty()) return api::api_keys::single(a.api_key);
  return {};
}

int run_api(const api_args& a) {
  apply_common_options(a.threads, a.log_level);
  if (a.local == a.swarm.given())
    throw std::invalid_argument("give exactly one of --local (the model in this process) or --swarm / --swarm-dht");
  if (!a.local && a.batching != "on")
    throw std::invalid_argument("--batching off is for --local (a swarm's servers batch their sessions' steps)");
  if (a.prefix_sharing != "on" && a.local && a.batching != "on")
    throw std::invalid_argument("--prefix-sharing off is for --local with batching on (the batcher shares the pages) "
                                "or --swarm (the servers share them)");
  const auto [host, port] = parse_http_listen(a.listen);
  if (!a.metrics_listen.empty()) parse_http_listen(a.metrics_listen, "--metrics-listen");  // before the model loads
  api::api_keys keys = keys_of(a);
  api::adapter_access access = api::adapter_access::parse(a.adapter_tenants);
  // The adapters' names, as soon as each branch knows them: a rule naming
  // none of them, or a tenant without a key, costs no load.
  std::vector<std::string> adapter_names;
  const sigset_t stop_signals = block_stop_signals();

  const model_config cfg = load_config(a.model);
  std::unique_ptr<tokenizer> tok;
  try {
    tok = load_tokenizer(a.model);
  } catch (const model_error& e) {
    throw model_error(std::string("corolla api needs the model's tokenizer: ") + e.what());
  }
  // A chat template given on the command line must work; the model's own
  // may be missing (a base model), and then only chat requests fail.
  std::optional<api::chat_template> chat;
  std::string chat_error;
  if (!a.chat_template.empty()) {
    chat = api::chat_template::for_model(a.model, a.chat_template);
  } else {
    try {
      chat = api::chat_template::for_model(a.model);
    } catch (const model_error& e) {
      chat_error = e.what();
      spdlog::warn("api: {}; /v1/chat/completions will refuse requests", chat_error);
    }
  }

  const weight_format weights = parse_weights_flag(a.weights);
  // The engine borrows the model or the swarm connection: declared after
  // them, it goes first.
  std::optional<transformer> model;
  swarm_connection swarm;
  std::unique_ptr<api::completion_engine> engine;
  std::optional<api::swarm_watch> watch;
  const std::string model_id = model_id_of(a.model);
  if (a.local) {
    if (!a.adapters.empty() && a.batching != "on")
      throw std::invalid_argument("--adapter serves adapters beside the base model in the batcher's batches: drop "
                                  "--batching off, or merge one into the weights (--merge-adapter DIR)");
    if (std::find(a.adapters.begin(), a.adapters.end(), "*") != a.adapters.end())
      throw std::invalid_argument("--adapter '*' (any adapter the swarm's servers hold) is for --swarm: with --local "
                                  "give NAME=DIR");
    // Loaded (and checked) before the model: a bad flag costs no load.
    std::vector<api::named_adapter> served;
    for (served_adapter& s : load_served_adapters(a.adapters, cfg)) {
      if (s.name == model_id)
        throw std::invalid_argument("--adapter " + s.name + "=" + s.dir + ": the name is the model's own id (requests " +
                                    "naming it get the base model): give the adapter another name");
      spdlog::info("api: serving adapter {}@{} from {}", s.name, s.adapter->digest(), s.dir);
      served.push_back({s.name, s.adapter});
      adapter_names.push_back(s.name);
    }
    access.check(adapter_names, keys);
    Backend& be = backend_for(parse_device(a.device));
    model.emplace(load_for_decoding(a.model, be, weights, "api", a.merge_adapter));
    engine = api::make_local_engine(*model, a.parallel, weights, parse_kv_dtype_flag(a.kv_dtype),
                                    a.batching != "on"          ? api::local_decoding::per_request
                                    : a.isolate_requests        ? api::local_decoding::batched_isolated
                                    : a.prefix_sharing == "on" ? api::local_decoding::batched
                                                               : api::local_decoding::batched_unshared,
                                    served);
  } else {
    if (!a.merge_adapter.empty())
      throw std::invalid_argument("--merge-adapter is for --local: with --swarm the servers hold the weights (name "
                                  "an adapter they hold with --adapter NAME)");
    if (a.adapters.size() > max_span_adapters)
      throw std::invalid_argument("--adapter given " + std::to_string(a.adapters.size()) +
                                  " times: a server holds at most " + std::to_string(max_span_adapters));
    bool discover = false;
    for (const std::string& spec : a.adapters) {
      if (spec == "*") {  // and whatever adapters the swarm holds
        discover = true;
        continue;
      }
      if (spec.find('=') != std::string::npos)
        throw std::invalid_argument("--adapter " + spec +
                                    ": with --swarm give the NAME (or NAME@DIGEST) of an adapter the servers hold "
                                    "(serve --adapter NAME=DIR), not a directory");
      const adapter_ref ref = adapter_ref::parse(spec);
      check_adapter_name(ref.name, spec);
      if (ref.name == model_id)
        throw std::invalid_argument("--adapter " + spec + ": the name is the model's own id (requests naming it get "
                                    "the base model)");
      adapter_names.push_back(ref.name);
    }
    access.check(adapter_names, keys, !discover);
    const device where = a.device == "auto" ? device{} : parse_device(a.device);
    if (where.kind != device_kind::cpu)
      throw std::invalid_argument("--device " + a.device +
                                  ": with --swarm the API's head runs on the cpu; the servers' --device places the blocks");
    Backend& be = backend_for(where);
    swarm = connect_swarm(a.swarm, a.model, cfg.n_layers);
    // The API only embeds and samples: one thread each, unless told
    // otherwise (as generate --swarm): every request runs on its own HTTP
    // thread, and a team of OpenMP threads per HTTP thread would crowd out
    // servers sharing the machine.
    if (a.threads == 0) set_cpu_threads(1);
    head h = head::load(checkpoint::open(a.model), cfg, be);
    engine = api::make_swarm_engine(*swarm.runtime, swarm.options, std::move(h), a.parallel, weights,
                                    a.prefix_sharing == "on" && !a.isolate_requests, a.adapters);
    // The dashboard reads the servers' DHT records (with a list of servers
    // and no DHT it shows only the failovers).
    watch.emplace(model_id_of_swarm(a.swarm, a.model), cfg.n_layers,
                  [members = swarm.members.get(), id = model_id_of_swarm(a.swarm, a.model), n = cfg.n_layers] {
                    return members ? members->get_span(id, 0, n) : std::vector<net::server_record>{};
                  });
  }

  api::api_config config;
  config.model_id = model_id;
  config.keys = std::move(keys);
  config.adapters = std::move(access);
  config.http_threads = std::max(a.http_threads, a.parallel + 2);
  config.request_read_limit = std::chrono::seconds(a.request_read_timeout_s);
  config.swarm = watch ? &*watch : nullptr;
  api::http_api server(*engine, *tok, std::move(chat), chat_error, config);
  const int bound = server.bind(host, port);
  std::string line = "corolla api " + config.model_id + " listening on http://" + host + ":" + std::to_string(bound);
  // (Requests name an adapter as their model: say which, where the
  // operator looks first.)
  // (With --adapter '*', "*" first, then those the swarm holds now.)
  if (auto held = engine->adapters(); !held.empty() || engine->discovers_adapters()) {
    if (engine->discovers_adapters()) held.insert(held.begin(), "*");
    line += " adapters";
    for (std::size_t i = 0; i < held.size(); ++i) line += (i ? "," : " ") + held[i];
  }
  // The same /metrics (and /health) on a listener of its own, answered
  // even while every HTTP thread of the API is busy generating.
  std::unique_ptr<api::metrics_server> metrics;
  if (!a.metrics_listen.empty()) {
    const auto [mhost, mport] = parse_http_listen(a.metrics_listen, "--metrics-listen");
    metrics = std::make_unique<api::metrics_server>([&server] { return server.metrics_text(); });
    line += " metrics http://" + mhost + ":" + std::to_string(metrics->start(mhost, mport));
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  serve_until_stop_signal("api", stop_signals, std::chrono::seconds(a.shutdown_grace_s), [&] { server.run(); },
                          [&] { server.stop(); });
  return 0;
}

}  // namespace

void register_api(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<api_args>();
  auto* cmd = app.add_subcommand("api", "OpenAI-compatible HTTP API (completions, chat, /metrics) over a model or a swarm");
  cmd->add_option("--model", a->model, "HuggingFace model directory (its name is the API's model id)")->required();
  cmd->add_flag("--local", a->local, "Compute in this process (no swarm)");
  add_swarm_flags(cmd, a->swarm);
  cmd->add_option("--listen", a->listen, "HOST:PORT to serve HTTP on (port 0 = any)")->capture_default_str();
  auto* key = cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on /v1 requests")
                  ->check(non_empty());
  cmd->add_option("--api-key-file", a->api_key_file,
                  "Keys of tenants, one 'TENANT KEY' a line: /v1 requests must carry one of them, and tenants never "
                  "share caches")
      ->excludes(key)
      ->check(non_empty());
  cmd->add_option("--chat-template", a->chat_template,
                  "Chat template: " + api::known_chat_templates() +
                      ", or a Jinja file of one of those families (default: tokenizer_config.json's)");
  cmd->add_option("--parallel", a->parallel,
                  "Requests generated at once, 1 to 4096 (with --local batched together unless --batching off; with "
                  "--swarm each its own session); more wait")
      ->check(integer_between(1, 4096))
      ->capture_default_str();
  cmd->add_option("--batching", a->batching,
                  "With --local: on runs the requests' decode steps together (one pass over the weights for all), "
                  "off gives each request a generator of its own")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  auto* sharing = cmd->add_option("--prefix-sharing", a->prefix_sharing,
                  "With --local and batching, or --swarm: on lets requests whose prompts begin alike (a system "
                  "prompt) hold the same KV pages for it and compute it once (with --swarm: on each server, the "
                  "later requests' sessions opened on the first one's route); off makes each compute its own")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--isolate-requests", a->isolate_requests,
                "No request starts on another's cache, running or finished (no pages shared, none kept): "
                "cached_tokens and the time to the first token tell a client nothing of another's prompt; "
                "for clients that must not learn each other's prompts")
      ->excludes(sharing);
  cmd->add_option("--metrics-listen", a->metrics_listen,
                  "HOST:PORT to serve GET /metrics and /health on as well, on threads of their own (answered while "
                  "every HTTP thread is busy; port 0 = any)");
  cmd->add_option("--http-threads", a->http_threads, "HTTP connections served at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--request-read-timeout-s", a->request_read_timeout_s,
                  "How long a request may take to arrive, from its first byte to the end of its body (a slow client "
                  "holds an HTTP thread that long at most; past it, 408), 0 (no bound) to 86400")
      ->check(integer_between(0, 86400))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace-s", a->shutdown_grace_s,
                  "After SIGINT/SIGTERM, how long open connections (generations running, slow clients) may take "
                  "before the process exits without them, 0 to 86400")
      ->check(integer_between(0, 86400))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "auto (cuda:0 when a GPU is visible, else cpu), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--weights", a->weights, "Linear weights decode reads: f32, bf16, int8 or nf4 (with --swarm: the LM head, int8 for nf4)")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache elements with --local: f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--adapter", a->adapters,
                  "A LoRA adapter served beside the base model, repeatable: requests whose model is its NAME compute "
                  "with it (GET /v1/models lists them). With --local: NAME=DIR (a PEFT directory; DIR alone is named "
                  "by its last component), its terms beside the frozen weights, unmerged, in the same batches as "
                  "other requests. With --swarm: NAME or NAME@DIGEST of an adapter servers hold (serve --adapter "
                  "NAME=DIR), or '*': any adapter the servers hold over the whole model (asked every 5 s)");
  cmd->add_option("--adapter-tenants", a->adapter_tenants,
                  "NAME=TENANT[,TENANT...], repeatable: the adapter NAME is private to those tenants of "
                  "--api-key-file; to any other it does not exist (not listed, 404 model_not_found) and the API "
                  "port's /metrics leaves out its series (--metrics-listen shows them). Adapters no rule names are "
                  "every tenant's");
  cmd->add_option("--merge-adapter", a->merge_adapter,
                  "With --local: a LoRA adapter (a PEFT directory) merged into the weights as they load: every "
                  "request computes with it, at no cost per token");
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([a, cmd, &action] {
    action = [a, cmd] {
      refuse_swarm_only_flags(*cmd, a->swarm);
      return run_api(*a);
    };
  });
}

}  // namespace corolla::app
