// LoRA adapters served per request by the local engine (`corolla api --local
// --adapter NAME=DIR`, vLLM's --lora-modules): requests of the base model
// and of two adapters generate together in the batcher's batches and each
// equals local generation with its adapter merged; caches never cross
// adapters; a request's `model` names its adapter over HTTP, and
// /v1/models lists them.
#include <doctest/doctest.h>

#include <httplib.h>

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/completion_engine.hpp"
#include "api/http_api.hpp"
#include "kernels/backend.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "tests/api/api_test_util.hpp"
#include "tests/support/random_lora.hpp"

using namespace corolla;
using namespace corolla::api;
using json = nlohmann::json;

namespace {

/// A tiny chat model and two adapters of it, with the greedy tokens each
/// (and the base) generates after `prompt` in this process.
struct adapted_model {
  testing::temp_dir_guard dir{"api-adapters"};
  testing::tiny_model_options opts = write_chat_model(dir.path());
  transformer model = transformer::load(dir.path(), cpu_backend());
  std::shared_ptr<const lora_adapter> a = std::make_shared<lora_adapter>(testing::random_lora(model.config(), 3, 0.4f));
  std::shared_ptr<const lora_adapter> b = std::make_shared<lora_adapter>(testing::random_lora(model.config(), 4, 0.4f));
  std::vector<std::int32_t> prompt{5, 17, 9, 33, 2, 40, 11};
  generation_params params = [] {
    generation_params p;
    p.max_new_tokens = 8;
    p.ignore_eos = true;
    return p;
  }();

  /// Greedy tokens with `adapter` (null: none) merged as the model loads.
  std::vector<std::int32_t> merged(const std::shared_ptr<const lora_adapter>& adapter) const {
    transformer m = transformer::load(dir.path(), cpu_backend(), {}, adapter);
    generator g(m);
    return g.generate(prompt, params).tokens;
  }
};

/// An http_api serving on a thread of its own, stopped and joined when this ends.
struct running_api {
  http_api& server;
  int port = server.bind("127.0.0.1", 0);
  std::thread thread{[this] { server.run(); }};
  ~running_api() {
    server.stop();
    thread.join();
  }
};

/// The text a completion of `ids` shows: end-of-sequence ids left out
/// (generation goes on past them).
std::string completion_text(const model_config& cfg, const tokenizer& tok, std::vector<std::int32_t> ids) {
  std::erase_if(ids, [&](std::int32_t id) {
    return id == cfg.eos_token_id || id == tok.eos_id() ||
           std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), id) != cfg.eos_token_ids.end();
  });
  return tok.decode(ids);
}

}  // namespace

TEST_CASE("a local engine's requests of two adapters and of none, batched together, equal each merged model") {
  adapted_model m;
  const auto want_base = m.merged(nullptr), want_a = m.merged(m.a), want_b = m.merged(m.b);
  REQUIRE(want_a != want_base);
  REQUIRE(want_b != want_base);
  REQUIRE(want_a != want_b);
  auto engine = make_local_engine(m.model, 4, weight_format::f32, dtype::f32, local_decoding::batched,
                                  {{"b", m.b}, {"a", m.a}});
  CHECK(engine->adapters() == std::vector<std::string>{"a", "b"});

  // Together (two of "a": their pages shared within the adapter only).
  const std::vector<std::string> which = {"a", "", "b", "a"};
  std::vector<std::future<engine_result>> running;
  for (const auto& adapter : which)
    running.push_back(std::async(std::launch::async, [&, adapter] {
      return engine->generate(m.prompt, m.params, {}, {}, adapter);
    }));
  for (std::size_t i = 0; i < which.size(); ++i) {
    CAPTURE(which[i]);
    CHECK(running[i].get().result.tokens == (which[i] == "a" ? want_a : which[i] == "b" ? want_b : want_base));
  }
  const auto stats = engine->batching();
  REQUIRE(stats);
  CHECK(stats->max_batch >= 2);  // some steps of different adapters ran in one batch
}

TEST_CASE("a local engine's caches never cross adapters") {
  adapted_model m;
  const auto want_base = m.merged(nullptr), want_a = m.merged(m.a), want_b = m.merged(m.b);
  auto engine = make_local_engine(m.model, 3, weight_format::f32, dtype::f32, local_decoding::batched,
                                  {{"a", m.a}, {"b", m.b}});
  // One after another: each finished request's cache is kept (three, one
  // per slot) for a later prompt that starts the same way, of its own
  // adapter only.
  engine_result r = engine->generate(m.prompt, m.params, {}, {}, "a");
  CHECK(r.result.tokens == want_a);
  CHECK(r.cached_tokens == 0);
  r = engine->generate(m.prompt, m.params, {}, {}, "b");
  CHECK(r.result.tokens == want_b);
  CHECK(r.cached_tokens == 0);
  r = engine->generate(m.prompt, m.params, {}, {}, "");
  CHECK(r.result.tokens == want_base);
  CHECK(r.cached_tokens == 0);
  r = engine->generate(m.prompt, m.params, {}, {}, "a");
  CHECK(r.result.tokens == want_a);
  CHECK(r.cached_tokens == static_cast<int>(m.prompt.size()) - 1);
  r = engine->generate(m.prompt, m.params, {}, {}, "b");
  CHECK(r.result.tokens == want_b);
  CHECK(r.cached_tokens == static_cast<int>(m.prompt.size()) - 1);

  // Refusals: an adapter not served; adapters with a generator per
  // request; an adapter of another model; a name given twice.
  CHECK_THROWS_WITH_AS(engine->generate(m.prompt, m.params, {}, {}, "c"),
                       "no adapter 'c' is served here (these are: a, b)", model_error);
  CHECK_THROWS_WITH_AS(
      make_local_engine(m.model, 2, weight_format::f32, dtype::f32, local_decoding::per_request, {{"a", m.a}}),
      doctest::Contains("adapters are served by batched decoding"), model_error);
  testing::tiny_model_options deeper = m.opts;
  deeper.layers = m.opts.layers + 1;
  testing::temp_dir_guard other("api-adapters-other");
  testing::write_tiny_model(other.path(), deeper);
  const model_config other_cfg = transformer::load(other.path(), cpu_backend()).config();
  auto wrong = std::make_shared<const lora_adapter>(testing::random_lora(other_cfg, 5));
  CHECK_THROWS_WITH_AS(make_local_engine(m.model, 2, weight_format::f32, dtype::f32, local_decoding::batched,
                                         {{"w", wrong}}),
                       doctest::Contains("was made for another model"), model_error);
  CHECK_THROWS_WITH_AS(make_local_engine(m.model, 2, weight_format::f32, dtype::f32, local_decoding::batched,
                                         {{"a", m.a}, {"a", m.b}}),
                       doctest::Contains("held already"), model_error);
}

TEST_CASE("over HTTP a request's model names its adapter, and /v1/models lists the adapters under the base") {
  adapted_model m;
  const auto want_base = m.merged(nullptr), want_a = m.merged(m.a);
  auto engine =
      make_local_engine(m.model, 2, weight_format::f32, dtype::f32, local_decoding::batched, {{"style", m.a}});
  auto tok = load_tokenizer(m.dir.path());
  api_config c;
  c.model_id = "style";  // an adapter may not take the model's id
  CHECK_THROWS_WITH_AS(http_api(*engine, *tok, std::nullopt, "", c), doctest::Contains("the model's own id"),
                       std::invalid_argument);
  c.model_id = "tiny";
  http_api server(*engine, *tok, chat_template::for_model(m.dir.path()), "", c);
  const running_api running{server};
  httplib::Client h("127.0.0.1", running.port);
  h.set_read_timeout(60, 0);

  auto models = h.Get("/v1/models");
  REQUIRE(models);
  const json listed = json::parse(models->body)["data"];
  REQUIRE(listed.size() == 2u);
  CHECK(listed[0]["id"] == "tiny");
  CHECK_FALSE(listed[0].contains("parent"));
  CHECK(listed[1]["id"] == "style");
  CHECK(listed[1]["parent"] == "tiny");
  auto one = h.Get("/v1/models/style");
  REQUIRE(one);
  CHECK(one->status == 200);
  CHECK(json::parse(one->body)["parent"] == "tiny");
  CHECK(h.Get("/v1/models/styles")->status == 404);
  CHECK(json::parse(h.Get("/v1/models/styles")->body)["error"]["message"] ==
        "The model 'styles' does not exist; this server serves 'tiny', 'style' (GET /v1/models).");

  const auto complete = [&](const std::string& model) {
    auto res = h.Post("/v1/completions", json{{"model", model}, {"prompt", m.prompt}, {"max_tokens", 8},
                                              {"temperature", 0}, {"ignore_eos", true}}
                                             .dump(),
                      "application/json");
    REQUIRE(res);
    return std::make_pair(res->status, json::parse(res->body));
  };
  const auto text_of = [&](const std::vector<std::int32_t>& ids) { return completion_text(m.model.config(), *tok, ids); };
  const auto [status_a, body_a] = complete("style");
  CHECK(status_a == 200);
  CHECK(body_a["model"] == "style");
  CHECK(body_a["choices"][0]["text"] == text_of(want_a));
  const auto [status_base, body_base] = complete("tiny");
  CHECK(status_base == 200);
  CHECK(body_base["model"] == "tiny");
  CHECK(body_base["choices"][0]["text"] == text_of(want_base));
  CHECK(text_of(want_a) != text_of(want_base));
  const std::string scraped = server.metrics_text();
  CHECK(scraped.find("corolla_api_adapter_requests_total{adapter=\"style\"} 1") != std::string::npos);
  CHECK(scraped.find("corolla_api_adapter_completion_tokens_total{adapter=\"style\"} 8") != std::string::npos);
  const auto [status_none, body_none] = complete("nope");
  CHECK(status_none == 404);
  CHECK(body_none["error"]["code"] == "model_not_found");
  CHECK(body_none["error"]["message"] ==
        "The model 'nope' does not exist; this server serves 'tiny', 'style' (GET /v1/models).");
}

TEST_CASE("an adapter private to a tenant exists for that tenant only: listing, requests, 404s and /metrics") {
  adapted_model m;
  const auto want_a = m.merged(m.a), want_b = m.merged(m.b);
  auto engine = make_local_engine(m.model, 2, weight_format::f32, dtype::f32, local_decoding::batched,
                                  {{"acme-style", m.a}, {"open", m.b}});
  auto tok = load_tokenizer(m.dir.path());
  api_config c;
  c.model_id = "tiny";
  // Rules are checked against what is served and the keys' tenants.
  c.keys = api_keys::parse("acme sk-acme\nglobex sk-globex\n", "keys");
  c.adapters = adapter_access::parse({"acme-styles=acme"});
  CHECK_THROWS_WITH_AS(http_api(*engine, *tok, std::nullopt, "", c),
                       doctest::Contains("no adapter 'acme-styles' is served (these are: acme-style, open)"),
                       std::invalid_argument);
  c.adapters = adapter_access::parse({"acme-style=acme,initech"});
  CHECK_THROWS_WITH_AS(http_api(*engine, *tok, std::nullopt, "", c),
                       doctest::Contains("the tenant 'initech' holds no key"), std::invalid_argument);
  c.keys = api_keys::single("sk-one");
  c.adapters = adapter_access::parse({"acme-style=acme"});
  CHECK_THROWS_WITH_AS(http_api(*engine, *tok, std::nullopt, "", c), doctest::Contains("give --api-key-file"),
                       std::invalid_argument);
  c.keys = api_keys::parse("acme sk-acme\nglobex sk-globex\n", "keys");
  http_api server(*engine, *tok, std::nullopt, "no chat", c);
  const running_api running{server};
  httplib::Client h("127.0.0.1", running.port);
  h.set_read_timeout(60, 0);
  const auto as = [](const std::string& key) { return httplib::Headers{{"Authorization", "Bearer " + key}}; };
  const auto listed = [&](const std::string& key) {
    auto res = h.Get("/v1/models", as(key));
    REQUIRE(res);
    REQUIRE(res->status == 200);
    std::vector<std::string> ids;
    const json body = json::parse(res->body);
    for (const json& o : body["data"]) ids.push_back(o["id"]);
    return ids;
  };
  CHECK(listed("sk-acme") == std::vector<std::string>{"tiny", "acme-style", "open"});
  CHECK(listed("sk-globex") == std::vector<std::string>{"tiny", "open"});
  CHECK(h.Get("/v1/models/acme-style", as("sk-acme"))->status == 200);
  auto hidden = h.Get("/v1/models/acme-style", as("sk-globex"));
  REQUIRE(hidden);
  CHECK(hidden->status == 404);
  // The same answer as for a name nobody serves: nothing tells globex it exists.
  const std::string not_served = "The model '%' does not exist; this server serves 'tiny', 'open' (GET /v1/models).";
  const auto message_for = [&](const std::string& model) {
    std::string s = not_served;
    return s.replace(s.find('%'), 1, model);
  };
  CHECK(json::parse(hidden->body)["error"]["message"] == message_for("acme-style"));
  CHECK(json::parse(h.Get("/v1/models/acme-styles", as("sk-globex"))->body)["error"]["message"] ==
        message_for("acme-styles"));

  const auto complete = [&](const std::string& key, const std::string& model) {
    auto res = h.Post("/v1/completions", as(key),
                      json{{"model", model}, {"prompt", m.prompt}, {"max_tokens", 8}, {"temperature", 0},
                           {"ignore_eos", true}}
                          .dump(),
                      "application/json");
    REQUIRE(res);
    return std::make_pair(res->status, json::parse(res->body));
  };
  const auto text_of = [&](const std::vector<std::int32_t>& ids) { return completion_text(m.model.config(), *tok, ids); };
  const auto [acme_status, acme_body] = complete("sk-acme", "acme-style");
  CHECK(acme_status == 200);
  CHECK(acme_body["choices"][0]["text"] == text_of(want_a));
  const auto [open_status, open_body] = complete("sk-globex", "open");
  CHECK(open_status == 200);
  CHECK(open_body["choices"][0]["text"] == text_of(want_b));
  const auto [globex_status, globex_body] = complete("sk-globex", "acme-style");
  CHECK(globex_status == 404);
  CHECK(globex_body["error"]["code"] == "model_not_found");
  CHECK(globex_body["error"]["message"] == message_for("acme-style"));

  // The API port's /metrics is open to all: the private adapter's series
  // are left out there, not from the operator's (--metrics-listen's) text.
  auto scraped = h.Get("/metrics");
  REQUIRE(scraped);
  CHECK(scraped->body.find("acme-style") == std::string::npos);
  CHECK(scraped->body.find("corolla_api_adapter_requests_total{adapter=\"open\"} 1") != std::string::npos);
  const std::string operator_text = server.metrics_text();
  CHECK(operator_text.find("corolla_api_adapter_requests_total{adapter=\"acme-style\"} 1") != std::string::npos);
  CHECK(operator_text.find("corolla_api_adapter_completion_tokens_total{adapter=\"acme-style\"} 8") !=
        std::string::npos);
}
