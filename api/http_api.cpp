#include "api/http_api.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <memory>
#include <chrono>
#include <random>
#include <stdexcept>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "api/dashboard.hpp"
#include "api/http_bind.hpp"
#include "api/http_framing.hpp"
#include "api/http_server.hpp"
#include "api/openai_request.hpp"
#include "api/stop_text.hpp"
#include "model/error.hpp"

namespace corolla::api {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

const char* endpoint_label(endpoint e) { return e == endpoint::completions ? "completions" : "chat_completions"; }

/// Text longer than this many bytes a token of the context cannot fit it
/// whatever it encodes to, unless the tokenizer has a longer piece
/// (bytes_per_token_bound).
constexpr std::size_t kMaxBytesPerToken = 256;

/// The most bytes of text one token of `tok` can stand for: its longest
/// piece, plus the space a piece may gain in context (SentencePiece's
/// marker), and at least kMaxBytesPerToken.
std::size_t bytes_per_token_bound(const tokenizer& tok) {
  std::size_t longest = 0;
  for (std::int32_t id = 0; id < tok.vocab_size(); ++id) {
    try {
      longest = std::max(longest, tok.decode(std::span<const std::int32_t>(&id, 1)).size());
    } catch (const std::exception&) {  // an id without a piece stands for nothing
    }
  }
  return std::max(kMaxBytesPerToken, longest + 1);
}
/// The largest request body read: 413 beyond it (prompts are bounded by
/// the context long before this).
constexpr std::size_t kMaxBodyBytes = 16u << 20;

/// Names of the API's metrics.
constexpr const char* kRequests = "corolla_api_requests_total";
constexpr const char* kDuration = "corolla_api_request_duration_seconds";
constexpr const char* kFirstToken = "corolla_api_time_to_first_token_seconds";
constexpr const char* kPerToken = "corolla_api_time_per_output_token_seconds";
constexpr const char* kPromptTokens = "corolla_api_prompt_tokens_total";
constexpr const char* kCompletionTokens = "corolla_api_completion_tokens_total";
constexpr const char* kInFlight = "corolla_api_requests_in_flight";
constexpr const char* kSlotsBusy = "corolla_api_slots_busy";
constexpr const char* kSlots = "corolla_api_slots";
constexpr const char* kFailovers = "corolla_api_failovers_total";
constexpr const char* kDisconnects = "corolla_api_client_disconnects_total";
constexpr const char* kBatches = "corolla_api_batches_total";
constexpr const char* kBatchedSteps = "corolla_api_batched_steps_total";
constexpr const char* kBatchMax = "corolla_api_batch_max";
constexpr const char* kKvPages = "corolla_api_kv_pages";
constexpr const char* kKvSharedPages = "corolla_api_kv_shared_pages";
constexpr const char* kCachedPromptTokens = "corolla_api_prompt_tokens_cached_total";
constexpr const char* kAdapterRequests = "corolla_api_adapter_requests_total";
constexpr const char* kAdapterTokens = "corolla_api_adapter_completion_tokens_total";

void declare_metrics(metrics_registry& m) {
  using k = metrics_registry::kind;
  const std::vector<double> seconds{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  m.declare(kRequests, k::counter, "Requests answered, by endpoint and HTTP status.");
  m.declare(kDuration, k::histogram, "Seconds from a completion request's arrival to its last byte.", seconds);
  m.declare(kFirstToken, k::histogram, "Seconds from a completion request's arrival to its first generated token.",
            seconds);
  m.declare(kPerToken, k::histogram, "Seconds per generated token after the first (decode steps).",
            {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
  m.declare(kPromptTokens, k::counter, "Prompt tokens of the completion requests run.");
  m.declare(kCachedPromptTokens, k::counter,
            "Prompt tokens another request's cache held (continued or shared; not computed again).");
  m.declare(kCompletionTokens, k::counter, "Tokens generated.");
  m.declare(kAdapterRequests, k::counter, "Completion requests run with a LoRA adapter (their model), by adapter.");
  m.declare(kAdapterTokens, k::counter, "Tokens generated with a LoRA adapter, by adapter.");
  m.declare(kInFlight, k::gauge, "Completion requests being answered (running or waiting for a slot).");
  m.declare(kSlotsBusy, k::gauge, "Engine slots generating now.");
  m.declare(kSlots, k::gauge, "Engine slots (requests generated at once).");
  m.declare(kFailovers, k::counter, "Swarm server failures recovered during requests.");
  m.declare(kDisconnects, k::counter, "Streamed requests whose client went away before the end.");
  m.declare(kBatches, k::counter, "Batches of steps run together (a local engine that batches requests).");
  m.declare(kBatchedSteps, k::counter, "Steps (prompts and decode steps) in those batches; over the batches: the mean batch.");
  m.declare(kBatchMax, k::gauge, "Most steps one batch held so far.");
  m.declare(kKvPages, k::gauge, "KV cache pages held now (a page several requests share counts once).");
  m.declare(kKvSharedPages, k::gauge, "KV cache pages more than one request holds now (a shared prompt prefix).");
}

/// Everything one completion needs once validated, and its progress.
struct completion_job {
  completion_request request;
  response_header header;
  std::vector<std::int32_t> prompt;
  generation_params params;
  std::vector<std::int32_t> end_ids;  ///< ids that end generation; never shown as text
  clock_type::time_point arrived;
  /// Whose caches its prompt may start on: its key's tenant and its
  /// cache_salt (completion_engine::generate).
  std::string cache_domain;
  /// The LoRA adapter the request's `model` names ("": the base model).
  std::string adapter;
};

/// The cache domain of a request of `tenant` with `salt`: the same for
/// the same pair only (the tenant's length first, so that no tenant and
/// salt run together into another's).
std::string cache_domain_of(const std::string& tenant, const std::string& salt) {
  return std::to_string(tenant.size()) + ":" + tenant + salt;
}

/// The outcome of running a job.
struct completion_outcome {
  std::string finish_reason;  ///< "stop" or "length"
  usage counts;
  bool disconnected = false;
};

std::string random_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) << 32));
  static constexpr char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += digits[rng() % (sizeof digits - 1)];
  return id;
}

}  // namespace

struct http_api::impl {
  completion_engine& engine;
  const tokenizer& tok;
  std::optional<chat_template> chat;
  std::string chat_error;
  api_config config;
  metrics_registry metrics;
  http_server server{config.request_read_limit};
  http_listener listener{server};
  /// Text of more than this many bytes per token of the context is refused unencoded.
  std::size_t bytes_per_token = bytes_per_token_bound(tok);
  std::int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();

  impl(completion_engine& e, const tokenizer& t, std::optional<chat_template> c, std::string ce, api_config cfg)
      : engine(e), tok(t), chat(std::move(c)), chat_error(std::move(ce)), config(std::move(cfg)) {
    // (Adapters a swarm engine finds later are checked as they come: one
    // named like the model is never served, see served_adapters.)
    const bool discovering = engine.discovers_adapters();
    const std::vector<std::string> fixed = discovering ? std::vector<std::string>() : engine.adapters();
    for (const auto& a : fixed)
      if (a == config.model_id)
        throw std::invalid_argument("an adapter is named '" + a + "', the model's own id: requests naming it would "
                                    "get the base model");
    config.adapters.check(fixed, config.keys, !discovering);
    declare_metrics(metrics);
    metrics.set(kSlots, {}, engine.slots());
    routes();
  }

  static void send_error(httplib::Response& res, const api_error& e) {
    res.status = e.status();
    res.set_content(to_body(e.body()), "application/json");
  }

  /// `e`, then the connection is closed (a refusal on the headers).
  static void send_error_and_close(httplib::Response& res, const api_error& e) {
    answer_and_close(res, e.status(), to_body(e.body()), "application/json");
  }

  /// The key on the headers of a /v1/ request, before its body is read:
  /// false (and the 401 in `res`, the connection to be closed) when wrong.
  bool authorized_before_body(const httplib::Request& req, httplib::Response& res) {
    try {
      if (const auto why = framing_error(req)) throw api_error(400, "invalid_request_error", *why);
      if (req.path.rfind("/v1/", 0) == 0) authorize(req);
      return true;
    } catch (const api_error& e) {
      send_error_and_close(res, e);
      metrics.add(kRequests, {{"endpoint", path_label(req.path)}, {"status", std::to_string(e.status())}});
      return false;
    }
  }

  /// The request counter's `endpoint` label of a request for `path`.
  static const char* path_label(const std::string& path) {
    return path == "/v1/completions"        ? "completions"
           : path == "/v1/chat/completions" ? "chat_completions"
           : path.rfind("/v1/models", 0) == 0 ? "models"
           : path == "/health"                ? "health"
           : path == "/metrics"               ? "metrics"
                                              : "other";
  }

  /// The tenant of the key the request carries ("" when no key is
  /// required). Throws the 401 when keys are required and it carries none
  /// of them.
  std::string authorize(const httplib::Request& req) const {
    if (!config.keys.required()) return {};
    const std::string header = req.get_header_value("Authorization");
    // The scheme's case does not matter (RFC 9110, 11.1): "bearer KEY" too.
    std::string scheme = header.substr(0, 7);
    std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::string given = scheme == "bearer " ? header.substr(7) : std::string();
    // Compared in constant time: keys are secrets.
    const auto tenant = config.keys.tenant_of(given);
    if (!tenant || scheme != "bearer ")
      throw api_error(401, "invalid_request_error",
                      header.empty() ? "You didn't provide an API key: send it as 'Authorization: Bearer KEY'."
                                    : "Incorrect API key provided.",
                      {}, "invalid_api_key");
    return *tenant;
  }

  /// The metrics' text, the engine's gauges read now.
  std::string metrics_text(bool public_port = false) {
    metrics.set(kSlotsBusy, {}, engine.busy());
    if (const auto b = engine.batching()) {
      metrics.set_total(kBatches, {}, static_cast<double>(b->batches));
      metrics.set_total(kBatchedSteps, {}, static_cast<double>(b->steps));
      metrics.set(kBatchMax, {}, static_cast<double>(b->max_batch));
      metrics.set(kKvPages, {}, static_cast<double>(b->kv_pages_in_use));
      metrics.set(kKvSharedPages, {}, static_cast<double>(b->kv_pages_shared));
    }
    if (!public_port || !config.adapters.any()) return metrics.render();
    // The API port's /metrics is open to anyone: no private adapter's name.
    return metrics.render([this](const metric_labels& labels) {
      for (const auto& [k, v] : labels)
        if (k == "adapter" && config.adapters.is_private(v)) return true;
      return false;
    });
  }

  /// The model (`id` the base's), or a LoRA adapter over it (vLLM's shape:
  /// `parent` names the base).
  json model_object(const std::string& id) const {
    json o = {{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "corolla"}};
    if (id != config.model_id) o["parent"] = config.model_id;
    return o;
  }

  /// The adapters `tenant` may name, sorted (not one named as the model:
  /// its name means the base model).
  std::vector<std::string> served_adapters(const std::string& tenant) const {
    std::vector<std::string> out = config.adapters.visible(engine.adapters(), tenant);
    std::erase(out, config.model_id);
    return out;
  }

  /// The adapter a request of `tenant` names as its `model`: "" for the
  /// base model, else one of the engine's adapters the tenant may use;
  /// anything else (another tenant's private adapter too) is the same 404,
  /// naming what the tenant may use.
  std::string adapter_of(const std::string& model, const std::string& tenant) const {
    if (model == config.model_id) return {};
    const std::vector<std::string> held = served_adapters(tenant);
    if (std::binary_search(held.begin(), held.end(), model)) return model;
    std::string served = "'" + config.model_id + "'";
    for (std::size_t i = 0; i < held.size() && i < 8; ++i) served += ", '" + held[i] + "'";
    if (held.size() > 8) served += " and " + std::to_string(held.size() - 8) + " more adapters";
    throw api_error(404, "invalid_request_error",
                    "The model '" + model + "' does not exist; this server serves " + served + " (GET /v1/models).",
                    "model", "model_not_found");
  }

  void routes() {
    // Every /v1/ route's key was checked before routing (authorized_before_body).
    server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, "models", [&] {
        json data = json::array({model_object(config.model_id)});
        for (const auto& a : served_adapters(authorize(req))) data.push_back(model_object(a));
        res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
      });
    });
    server.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, "models", [&] {
        const std::string id = req.matches[1].str();
        adapter_of(id, authorize(req));  // 404 unless served to this tenant
        res.set_content(model_object(id).dump(), "application/json");
      });
    });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, endpoint::completions);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res, endpoint::chat_completions);
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(true), "text/plain; version=0.0.4; charset=utf-8");
    });
    // The dashboard (api/dashboard.hpp): public like /metrics, since the
    // swarm's records are public in its DHT anyway.
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(dashboard_html(), "text/html; charset=utf-8");
    });
    server.Get("/swarm.json", [this](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(swarm_body(config.swarm, config.model_id, engine.config().n_layers), "application/json");
    });
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"status", "ok"}, {"model", config.model_id}, {"slots", engine.slots()}, {"busy", engine.busy()}}
                          .dump(),
                      "application/json");
    });
    // Unknown routes and methods get an error object too.
    server.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                         httplib::Response& res) {
      // An answer of our own: a body, or one that a content provider writes.
      if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
      // Reads cut off by the server (httplib says 400).
      if (http_server::read_limit_passed() || http_server::request_too_large()) {
        res.set_header("Connection", "close");
        const api_error e = http_server::read_limit_passed()
                                ? api_error(408, "invalid_request_error",
                                            "The request did not arrive within " + server.read_limit_text() + ".")
                                : api_error(413, "invalid_request_error",
                                            "The request is larger than " + std::to_string(kMaxBodyBytes >> 20) +
                                                " MiB (its body, sent chunked, or its headers).");
        send_error(res, e);
        metrics.add(kRequests, {{"endpoint", path_label(req.path)}, {"status", std::to_string(e.status())}});
        return httplib::Server::HandlerResponse::Handled;
      }
      const int status = res.status;
      // The server's own refusals (413 past the body limit, 404, a
      // malformed request) count as requests too.
      metrics.add(kRequests, {{"endpoint", path_label(req.path)}, {"status", std::to_string(status)}});
      send_error(res, api_error(status, "invalid_request_error",
                                status == 404 ? "Unknown route " + req.method + " " + req.path
                                              : "The request failed with HTTP status " + std::to_string(status)));
      return httplib::Server::HandlerResponse::Handled;
    }));
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, api_error(500, "server_error", "internal error: " + what));
    });
  }

  /// Runs `body`, turning exceptions into error responses, and counts the
  /// request under `label` with its final status.
  template <typename F>
  void guarded(httplib::Response& res, const char* label, F&& body) {
    try {
      body();
    } catch (const api_error& e) {
      send_error(res, e);
    } catch (const model_error& e) {
      send_error(res, invalid_request(e.what()));
    } catch (const std::exception& e) {
      spdlog::error("api: {}", e.what());
      send_error(res, api_error(500, "server_error", e.what()));
    }
    metrics.add(kRequests, {{"endpoint", label}, {"status", std::to_string(res.status == -1 ? 200 : res.status)}});
  }

  /// Validates a request into a job (throws api_error / model_error).
  std::shared_ptr<completion_job> prepare(const httplib::Request& req, endpoint to) {
    auto job = std::make_shared<completion_job>();
    job->arrived = clock_type::now();
    job->request = parse_request(req.body, to);
    const completion_request& r = job->request;
    // (The key was checked on the headers already: this only names its tenant.)
    const std::string tenant = authorize(req);
    job->cache_domain = cache_domain_of(tenant, r.cache_salt);
    job->adapter = adapter_of(r.model, tenant);
    const model_config& cfg = engine.config();
    // Text is encoded whole before its tokens are counted: text that cannot
    // fit the context however it encodes is refused before that work (a
    // 10 MB prompt took 22 s and 0.9 GB to find too long).
    {
      std::size_t bytes = r.prompt.size();
      for (const chat_message& m : r.messages) bytes += m.content.size();
      const std::size_t most = bytes_per_token * static_cast<std::size_t>(cfg.max_positions);
      // Every message renders to at least one token (its role's markers).
      if (r.messages.size() > static_cast<std::size_t>(cfg.max_positions))
        throw invalid_request("This model's maximum context length is " + std::to_string(cfg.max_positions) +
                                  " tokens; " + std::to_string(r.messages.size()) + " messages cannot fit.",
                              "messages", "context_length_exceeded");
      if (bytes > most)
        throw invalid_request("This model's maximum context length is " + std::to_string(cfg.max_positions) +
                                  " tokens; the prompt's " + std::to_string(bytes) + " bytes of text cannot fit (at most " +
                                  std::to_string(most) + ").",
                              to == endpoint::chat_completions ? "messages" : "prompt", "context_length_exceeded");
    }
    if (to == endpoint::chat_completions) {
      // The reason (chat_error, in the server's log) names the model's
      // directory on the server: not for clients.
      if (!chat)
        throw invalid_request("The model '" + config.model_id +
                                  "' has no chat template, so this server answers no chat requests (its operator can "
                                  "give one with --chat-template); /v1/completions works.",
                              "messages");
      try {
        job->prompt = chat->encode(r.messages, tok);
      } catch (const model_error& e) {  // a conversation the template cannot render
        throw invalid_request(e.what(), "messages");
      }
      if (auto end = single_token_id(tok, chat->end_of_turn())) job->end_ids.push_back(*end);
    } else if (!r.prompt_ids.empty()) {
      job->prompt = r.prompt_ids;
    } else {
      job->prompt = tok.encode(r.prompt, tok.prepends_bos());
    }
    const char* prompt_param = to == endpoint::chat_completions ? "messages" : "prompt";
    if (job->prompt.empty()) throw invalid_request("the prompt is empty: it encodes to no tokens", prompt_param);
    // Generation checks this too, but a stream has sent its 200 by then:
    // ids from the client are checked here, so a bad one is a 400 either way.
    for (std::int32_t id : r.prompt_ids)
      if (id >= cfg.vocab_size)
        throw invalid_request("prompt id " + std::to_string(id) + " is outside the vocabulary (" +
                                  std::to_string(cfg.vocab_size) + " tokens)",
                              prompt_param);
    const auto n = static_cast<int>(job->prompt.size());
    if (n >= cfg.max_positions)
      throw invalid_request("This model's maximum context length is " + std::to_string(cfg.max_positions) +
                                " tokens; the prompt has " + std::to_string(n) + " tokens and leaves no room to generate.",
                            prompt_param, "context_length_exceeded");
    generation_params& p = job->params;
    p.max_new_tokens = r.max_tokens ? *r.max_tokens : to == endpoint::completions ? 16 : cfg.max_positions - n;
    p.sampling.temperature = r.temperature;
    p.sampling.top_p = r.top_p;
    p.sampling.seed = r.seed ? *r.seed : std::random_device{}();
    p.ignore_eos = r.ignore_eos;
    // Every end-of-sequence id of the model (config.json's list and
    // generation_config.json's: Llama 3.1 instruct ends turns with
    // <|eot_id|>) ends generation and is left out of the text.
    for (int id : cfg.eos_token_ids)
      if (std::find(job->end_ids.begin(), job->end_ids.end(), id) == job->end_ids.end()) job->end_ids.push_back(id);
    p.stop_ids = job->end_ids;
    // As corolla generate: the tokenizer's EOS when config.json names none.
    p.eos_id = cfg.eos_token_id >= 0 ? cfg.eos_token_id : tok.eos_id();
    if (p.eos_id >= 0) job->end_ids.push_back(p.eos_id);
    job->header = {random_id(to == endpoint::completions ? "cmpl-" : "chatcmpl-"),
                   std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                       .count(),
                   r.model, to, job->request.include_usage};
    return job;
  }

  /// Generates `job`, handing each piece of releasable text to `emit`;
  /// `gone` says the client went away (generation stops there).
  completion_outcome run(completion_job& job, const std::function<void(const std::string&)>& emit,
                         const std::function<bool()>& gone) {
    stream_decoder text(tok);
    stop_text stops(job.request.stop);
    bool disconnected = false;
    bool first = true;
    const auto end_label = endpoint_label(job.request.to);
    generation_params p = job.params;
    p.should_stop = [&] {
      if (!disconnected && gone && gone()) disconnected = true;
      return disconnected || stops.matched();
    };
    const auto on_token = [&](std::int32_t id) {
      if (first) {
        metrics.observe(kFirstToken, {{"endpoint", end_label}}, seconds_since(job.arrived));
        first = false;
      }
      if (std::find(job.end_ids.begin(), job.end_ids.end(), id) != job.end_ids.end()) return;
      const std::string piece = stops.push(text.push(id));
      if (!piece.empty()) emit(piece);
    };
    engine_result r = engine.generate(job.prompt, p, on_token, job.cache_domain, job.adapter);
    if (!disconnected) {
      std::string tail = stops.push(text.flush());
      tail += stops.finish();
      if (!tail.empty()) emit(tail);
    }
    completion_outcome out;
    out.disconnected = disconnected;
    out.finish_reason = r.result.reason == stop_reason::max_tokens || r.result.reason == stop_reason::context ? "length"
                                                                                                                : "stop";
    out.counts = {static_cast<int>(job.prompt.size()), static_cast<int>(r.result.tokens.size()), r.cached_tokens};
    metrics.add(kPromptTokens, {}, out.counts.prompt_tokens);
    metrics.add(kCachedPromptTokens, {}, out.counts.cached_tokens);
    metrics.add(kCompletionTokens, {}, out.counts.completion_tokens);
    if (!job.adapter.empty()) {  // (at most 64 adapters: the label's values are bounded)
      metrics.add(kAdapterRequests, {{"adapter", job.adapter}});
      metrics.add(kAdapterTokens, {{"adapter", job.adapter}}, out.counts.completion_tokens);
    }
    if (r.failovers > 0) {
      metrics.add(kFailovers, {}, r.failovers);
      if (config.swarm)
        config.swarm->note_failover(std::to_string(r.failovers) + " server failure(s) recovered during a request");
    }
    if (r.result.decode_steps > 0) metrics.observe(kPerToken, {}, r.result.decode_seconds / r.result.decode_steps);
    if (disconnected) metrics.add(kDisconnects);
    return out;
  }

  void complete(const httplib::Request& req, httplib::Response& res, endpoint to) {
    const char* label = endpoint_label(to);
    // Counts the request in flight until the last owner lets go: this
    // handler, or the stream's content provider (which httplib may also
    // drop unrun when the client is already gone).
    struct in_flight_count {
      metrics_registry& m;
      explicit in_flight_count(metrics_registry& r) : m(r) { m.add(kInFlight, {}, 1); }
      ~in_flight_count() { m.add(kInFlight, {}, -1); }
    };
    std::shared_ptr<void> in_flight = std::make_shared<in_flight_count>(metrics);
    guarded(res, label, [&] {
      auto job = prepare(req, to);
      engine.check_ready();
      if (job->request.stream) {
        stream(res, job, in_flight);
        return;
      }
      std::string text;
      const completion_outcome out = run(*job, [&](const std::string& piece) { text += piece; }, {});
      res.set_content(to_body(response_json(job->header, text, out.finish_reason, out.counts)), "application/json");
      metrics.observe(kDuration, {{"endpoint", label}}, seconds_since(job->arrived));
    });
  }

  /// Answers with server-sent events, generated as the client reads them.
  void stream(httplib::Response& res, std::shared_ptr<completion_job> job, std::shared_ptr<void> in_flight) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, job, in_flight](std::size_t,
                                                                                   httplib::DataSink& sink) mutable {
      bool open = true;
      const auto write = [&](const std::string& event) {
        if (open && !sink.write(event.data(), event.size())) open = false;
      };
      bool first = true;
      const auto label = endpoint_label(job->request.to);
      try {
        if (job->request.to == endpoint::chat_completions) {
          write(sse_event(chunk_json(job->header, "", "", true)));
          first = false;
        }
        const completion_outcome out = run(
            *job,
            [&](const std::string& piece) {
              write(sse_event(chunk_json(job->header, piece, "", first)));
              first = false;
            },
            [&] { return !open || (sink.is_writable && !sink.is_writable()); });
        if (!out.disconnected) {
          write(sse_event(chunk_json(job->header, "", out.finish_reason, first)));
          if (job->request.include_usage) write(sse_event(usage_chunk_json(job->header, out.counts)));
          write(sse_done());
        }
      } catch (const api_error& e) {
        write(sse_event(e.body()));
        write(sse_done());
      } catch (const std::exception& e) {
        write(sse_event(api_error(500, "server_error", e.what()).body()));
        write(sse_done());
      }
      metrics.observe(kDuration, {{"endpoint", label}}, seconds_since(job->arrived));
      // Done before the stream's end reaches the client: a scrape after its
      // [DONE] never counts it in flight (the provider itself lives on in
      // the response until the connection is done with it).
      in_flight.reset();
      if (open) sink.done();
      return open;
    });
  }
};

http_api::http_api(completion_engine& engine, const tokenizer& tok, std::optional<chat_template> chat,
                   std::string chat_error, api_config config)
    : impl_(std::make_unique<impl>(engine, tok, std::move(chat), std::move(chat_error), std::move(config))) {
  const int threads = std::max(impl_->config.http_threads, 2);
  impl_->server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
  // Stream chunks leave as soon as they are written, not held back by
  // Nagle's algorithm until the client acknowledges the previous segment.
  impl_->server.set_tcp_nodelay(true);
  // A streamed answer can pause for as long as a swarm failover takes.
  impl_->server.set_write_timeout(60, 0);
  impl_->server.set_payload_max_length(kMaxBodyBytes);
  // The key is checked on the headers, before a body is read: without
  // it, nobody makes the server read (and hold) hundreds of megabytes.
  // A client that asks before sending its body (Expect: 100-continue, as
  // curl does for large bodies) is told no the same way.
  check_on_headers(impl_->server, [this](const httplib::Request& req, httplib::Response& res) {
    return impl_->authorized_before_body(req, res);
  });
}

http_api::~http_api() { stop(); }

int http_api::bind(const std::string& host, int port) {
  const int bound = bind_http(impl_->server, host, port);
  return bound;
}

void http_api::run() { impl_->listener.run(); }

void http_api::stop() {
  if (impl_) impl_->listener.stop();
}

metrics_registry& http_api::metrics() { return impl_->metrics; }

std::string http_api::metrics_text() { return impl_->metrics_text(); }

}  // namespace corolla::api
