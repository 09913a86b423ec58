// The OpenAI-compatible server driven by a real HTTP client over loopback:
// greedy text equals local generation, streaming equals non-streaming, stop
// sequences, concurrent requests, every error status, a client that goes
// away mid-stream, and /metrics moving with the traffic.
#include <doctest/doctest.h>

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "api/completion_engine.hpp"
#include "api/http_bind.hpp"
#include "api/openai_request.hpp"
#include "api/server_metrics.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/safetensors.hpp"
#include "tests/api/api_test_util.hpp"
#include "tests/api/prometheus_text.hpp"
#include "tests/api/raw_http.hpp"
#include "tests/support/eventually.hpp"

using namespace corolla;
using namespace corolla::api;
using json = nlohmann::json;

namespace {

/// Greedy generation in this process, as text without the end token.
struct reference_output {
  std::vector<std::int32_t> tokens;
  std::string text;
  stop_reason reason;
};

reference_output greedy(transformer& model, const tokenizer& tok, const std::vector<std::int32_t>& prompt,
                        int max_tokens) {
  generator g(model);
  generation_params p;
  p.max_new_tokens = max_tokens;
  p.eos_id = model.config().eos_token_id >= 0 ? model.config().eos_token_id : tok.eos_id();
  const auto r = g.generate(prompt, p);
  std::vector<std::int32_t> shown = r.tokens;
  if (r.reason == stop_reason::eos) shown.pop_back();
  return {r.tokens, tok.decode(shown), r.reason};
}

httplib::Client client_for(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  return c;
}

json post(httplib::Client& c, const std::string& path, const json& body, int want_status = 200,
          const httplib::Headers& headers = {}) {
  auto res = c.Post(path, headers, body.dump(), "application/json");
  REQUIRE_MESSAGE(res, "no response to " << path);
  INFO(res->body);
  CHECK(res->status == want_status);
  CHECK(res->get_header_value("Content-Type").find("application/json") == 0);
  return json::parse(res->body);
}

/// The data events of a server-sent event stream, without the final [DONE]
/// (which must be there, last).
std::vector<json> stream_events(httplib::Client& c, const std::string& path, const json& body) {
  std::string raw;
  auto res = c.Post(path, {}, body.dump(), "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == "text/event-stream");
  raw = res->body;
  std::vector<json> events;
  bool done = false;
  std::size_t at = 0;
  while (at < raw.size()) {
    const std::size_t end = raw.find("\n\n", at);
    REQUIRE_MESSAGE(end != std::string::npos, "an event without its blank line: " << raw.substr(at));
    const std::string event = raw.substr(at, end - at);
    at = end + 2;
    REQUIRE(event.rfind("data: ", 0) == 0);
    CHECK_FALSE(done);
    if (event == "data: [DONE]")
      done = true;
    else
      events.push_back(json::parse(event.substr(6)));
  }
  CHECK(done);
  return events;
}

/// The streamed text of completion or chat chunks, and the finish reason.
std::pair<std::string, std::string> streamed_text(const std::vector<json>& events) {
  std::string text, finish;
  for (const auto& e : events) {
    if (e["choices"].empty()) continue;
    const auto& c = e["choices"][0];
    if (c.contains("text")) text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) {
      CHECK(finish.empty());
      finish = c["finish_reason"];
    }
  }
  return {text, finish};
}

double metric(int port, const std::string& series) {
  auto c = client_for(port);
  auto res = c.Get("/metrics");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  const auto samples = parse_prometheus_text(res->body);
  const auto it = samples.find(series);
  return it == samples.end() ? 0.0 : it->second;
}

/// The local engine, slowed down per generated token, so a test can act
/// while a generation runs.
class slow_engine final : public completion_engine {
 public:
  slow_engine(completion_engine& inner, std::chrono::milliseconds per_token) : inner_(inner), per_token_(per_token) {}
  const model_config& config() const override { return inner_.config(); }
  void check_ready() override { inner_.check_ready(); }
  engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                         const token_callback& on_token, const std::string& cache_domain,
                         const std::string& adapter) override {
    return inner_.generate(
        prompt, p,
        [&](std::int32_t id) {
          std::this_thread::sleep_for(per_token_);
          on_token(id);
        },
        cache_domain, adapter);
  }
  std::vector<std::string> adapters() const override { return inner_.adapters(); }
  int busy() const override { return inner_.busy(); }
  int slots() const override { return inner_.slots(); }

 private:
  completion_engine& inner_;
  std::chrono::milliseconds per_token_;
};

/// The local engine, each generation held until the test releases them
/// all (`entered` counts those waiting).
class held_engine final : public completion_engine {
 public:
  held_engine(completion_engine& inner, std::shared_future<void> released, std::atomic<int>& entered)
      : inner_(inner), released_(std::move(released)), entered_(entered) {}
  const model_config& config() const override { return inner_.config(); }
  void check_ready() override { inner_.check_ready(); }
  engine_result generate(std::span<const std::int32_t> prompt, const generation_params& p,
                         const token_callback& on_token, const std::string& cache_domain,
                         const std::string& adapter) override {
    ++entered_;
    released_.wait();
    return inner_.generate(prompt, p, on_token, cache_domain, adapter);
  }
  std::vector<std::string> adapters() const override { return inner_.adapters(); }
  int busy() const override { return inner_.busy(); }
  int slots() const override { return inner_.slots(); }

 private:
  completion_engine& inner_;
  std::shared_future<void> released_;
  std::atomic<int>& entered_;
};

/// An engine that fails the way a bug would (500).
class broken_engine final : public completion_engine {
 public:
  explicit broken_engine(completion_engine& inner) : inner_(inner) {}
  const model_config& config() const override { return inner_.config(); }
  void check_ready() override {}
  engine_result generate(std::span<const std::int32_t>, const generation_params&, const token_callback&,
                         const std::string&, const std::string&) override {
    throw std::logic_error("something impossible happened");
  }
  int busy() const override { return 0; }
  int slots() const override { return 1; }

 private:
  completion_engine& inner_;
};

/// A prompt whose greedy continuation has at least `min_chars` of text (the
/// tiny random model may end early on some prompts).
std::string long_running_prompt(local_api_server& s, std::size_t min_chars) {
  for (const char* p : {"the cat", "a dog and", "once upon", "we the people", "in the"}) {
    const auto ids = s.tok().encode(p, s.tok().prepends_bos());
    if (greedy(s.model(), s.tok(), ids, 24).text.size() >= min_chars) return p;
  }
  FAIL("no prompt with a long enough greedy continuation");
  return {};
}

}  // namespace

TEST_CASE("greedy completions equal local generation, for text and token-id prompts") {
  testing::temp_dir_guard dir("api-greedy");
  write_chat_model(dir.path());
  local_api_server s(dir.path());
  auto c = client_for(s.port());

  auto models = c.Get("/v1/models");
  REQUIRE(models);
  CHECK(models->status == 200);
  CHECK(json::parse(models->body)["data"][0]["id"] == "tiny");
  CHECK(c.Get("/v1/models/tiny")->status == 200);
  CHECK(json::parse(c.Get("/v1/models/other")->body)["error"]["code"] == "model_not_found");

  for (const std::string prompt : {"the cat", "once upon a time"}) {
    CAPTURE(prompt);
    const auto ids = s.tok().encode(prompt, s.tok().prepends_bos());
    const auto want = greedy(s.model(), s.tok(), ids, 12);
    const json r = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
    CHECK(r["object"] == "text_completion");
    CHECK(r["model"] == "tiny");
    CHECK(r["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(r["choices"][0]["text"] == want.text);
    CHECK(r["choices"][0]["finish_reason"] == (want.reason == stop_reason::eos ? "stop" : "length"));
    CHECK(r["usage"]["prompt_tokens"] == ids.size());
    CHECK(r["usage"]["completion_tokens"] == want.tokens.size());
    const json by_ids = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}});
    CHECK(by_ids["choices"][0]["text"] == want.text);
  }
  // Without max_tokens a completion is 16 tokens at most (the API's default).
  const json dflt = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the"}, {"temperature", 0}});
  CHECK(dflt["usage"]["completion_tokens"].get<int>() <= 16);
  // Sampling with a seed repeats itself.
  const json sampled = {{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", 42}};
  CHECK(post(c, "/v1/completions", sampled)["choices"][0]["text"] ==
        post(c, "/v1/completions", sampled)["choices"][0]["text"]);
}

TEST_CASE("chat completions apply the model's template and equal local generation") {
  testing::temp_dir_guard dir("api-chat");
  write_chat_model(dir.path());
  local_api_server s(dir.path());
  auto c = client_for(s.port());
  const std::vector<chat_message> messages = {{"system", "be short."}, {"user", "the cat and the dog"}};
  const auto ids = chat_template::for_model(dir.path()).encode(messages, s.tok());
  CHECK(ids.front() == s.tok().bos_id());
  const auto want = greedy(s.model(), s.tok(), ids, 20);
  const json body = {{"model", "tiny"},
                     {"messages", {{{"role", "system"}, {"content", "be short."}}, {{"role", "user"}, {"content", "the cat and the dog"}}}},
                     {"max_tokens", 20},
                     {"temperature", 0}};
  const json r = post(c, "/v1/chat/completions", body);
  CHECK(r["object"] == "chat.completion");
  CHECK(r["choices"][0]["message"]["role"] == "assistant");
  CHECK(r["choices"][0]["message"]["content"] == want.text);
  CHECK(r["usage"]["prompt_tokens"] == ids.size());
  CHECK(r["usage"]["completion_tokens"] == want.tokens.size());
  CHECK(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);  // the first request

  json streamed = body;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  const auto events = stream_events(c, "/v1/chat/completions", streamed);
  REQUIRE(events.size() >= 3);
  CHECK(events.front()["choices"][0]["delta"]["role"] == "assistant");
  const auto [text, finish] = streamed_text(events);
  CHECK(text == want.text);
  CHECK(finish == r["choices"][0]["finish_reason"]);
  CHECK(events.back()["choices"].empty());
  // The same counts; the same prompt again continues from the first
  // request's cache (all of it but the last token, whose logits are needed).
  json usage = events.back()["usage"];
  CHECK(usage["prompt_tokens_details"]["cached_tokens"] == ids.size() - 1);
  usage["prompt_tokens_details"]["cached_tokens"] = 0;
  CHECK(usage == r["usage"]);
  CHECK(metric(s.port(), "corolla_api_prompt_tokens_cached_total") == ids.size() - 1);
  for (const auto& e : events) CHECK(e["id"] == events.front()["id"]);
  // Asked for usage, every chunk before the last says "usage": null.
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    REQUIRE(events[i].contains("usage"));
    CHECK(events[i]["usage"].is_null());
  }

  // A conversation the template cannot render is a 400, not a dropped connection.
  const json bad = post(c, "/v1/chat/completions",
                        {{"model", "tiny"}, {"messages", {{{"role", "assistant"}, {"content", "x"}}}}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("alternate") != std::string::npos);
  CHECK(bad["error"]["param"] == "messages");
  const json system_only = post(c, "/v1/chat/completions",
                                {{"model", "tiny"}, {"messages", {{{"role", "system"}, {"content", "be short."}}}}}, 400);
  CHECK(system_only["error"]["message"].get<std::string>().find("there is no user message") != std::string::npos);
  CHECK(system_only["error"]["param"] == "messages");
}

TEST_CASE("streaming equals non-streaming, and stop sequences cut both alike") {
  testing::temp_dir_guard dir("api-stream");
  write_chat_model(dir.path());
  local_api_server s(dir.path());
  auto c = client_for(s.port());
  const std::string prompt = long_running_prompt(s, 8);
  const json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
  const json whole = post(c, "/v1/completions", body);
  const std::string full = whole["choices"][0]["text"];
  json streaming = body;
  streaming["stream"] = true;
  const auto [text, finish] = streamed_text(stream_events(c, "/v1/completions", streaming));
  CHECK(text == full);
  CHECK(finish == whole["choices"][0]["finish_reason"]);
  // A client that accepts gzip (OpenAI's Python SDK does) gets the events
  // uncompressed: a compressor would hold them back until it had a block.
  auto gz = c.Post("/v1/completions", {{"Accept-Encoding", "gzip, deflate"}}, streaming.dump(), "application/json");
  REQUIRE(gz);
  CHECK(gz->status == 200);
  CHECK(gz->get_header_value("Content-Encoding").empty());
  CHECK(gz->body.rfind("data: {", 0) == 0);

  // A stop sequence from the middle of the text: both answers end before
  // its first occurrence, with finish_reason "stop".
  const std::string stop = full.substr(full.size() / 2, 2);
  const std::string cut = full.substr(0, full.find(stop));
  json stopped = body;
  stopped["stop"] = json::array({"\x01never", stop});
  const json r = post(c, "/v1/completions", stopped);
  CHECK(r["choices"][0]["text"] == cut);
  CHECK(r["choices"][0]["finish_reason"] == "stop");
  // Generation ended at the stop sequence, not at max_tokens.
  CHECK(r["usage"]["completion_tokens"].get<int>() < whole["usage"]["completion_tokens"].get<int>());
  stopped["stream"] = true;
  const auto [stext, sfinish] = streamed_text(stream_events(c, "/v1/completions", stopped));
  CHECK(stext == cut);
  CHECK(sfinish == "stop");
}

TEST_CASE("concurrent requests each get the answer they would get alone") {
  testing::temp_dir_guard dir("api-concurrent");
  write_chat_model(dir.path());
  // Decode steps batched (the default) or a generator per request.
  local_decoding decoding = local_decoding::batched;
  SUBCASE("batched") {}
  SUBCASE("a generator per request") { decoding = local_decoding::per_request; }
  local_api_server s(dir.path(), {}, 3, {}, decoding);  // 3 slots for 6 requests: some wait
  const std::vector<std::string> prompts = {"the cat", "a dog", "once", "in the", "we", "the end of"};
  std::vector<std::string> alone;
  for (const auto& p : prompts)
    alone.push_back(greedy(s.model(), s.tok(), s.tok().encode(p, s.tok().prepends_bos()), 16).text);
  std::vector<std::future<std::string>> answers;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = client_for(s.port());
      json body = {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 16}, {"temperature", 0}};
      if (i % 2 == 1) {
        body["stream"] = true;
        auto res = c.Post("/v1/completions", body.dump(), "application/json");
        if (!res || res->status != 200) return std::string("(failed)");
        std::string text;
        std::size_t at = 0;
        while ((at = res->body.find("data: {", at)) != std::string::npos) {
          const auto end = res->body.find("\n\n", at);
          text += json::parse(res->body.substr(at + 6, end - at - 6))["choices"][0]["text"].get<std::string>();
          at = end;
        }
        return text;
      }
      auto res = c.Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) return std::string("(failed)");
      return json::parse(res->body)["choices"][0]["text"].get<std::string>();
    }));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(prompts[i]);
    CHECK(answers[i].get() == alone[i]);
  }
  CHECK(metric(s.port(), "corolla_api_requests_in_flight") == 0);
  // Only a batching engine reports batches; every step went through one.
  const double steps = metric(s.port(), "corolla_api_batched_steps_total");
  if (decoding == local_decoding::batched) {
    CHECK(steps > 0);
    CHECK(metric(s.port(), "corolla_api_batches_total") <= steps);
    CHECK(metric(s.port(), "corolla_api_batch_max") >= 1);
    // The finished requests' caches stay (for prompts that begin alike):
    // their pages are held; none is shared (the prompts have under a page
    // in common, which is copied, not shared).
    CHECK(metric(s.port(), "corolla_api_kv_pages") > 0);
    CHECK(metric(s.port(), "corolla_api_kv_shared_pages") == 0);
  } else {
    CHECK(steps == 0);
  }
}

TEST_CASE("isolated requests start on no other's cache, running or finished") {
  testing::temp_dir_guard dir("api-isolated");
  write_chat_model(dir.path());
  // The default (a finished request's cache continued, pages shared) as
  // the control, then --isolate-requests.
  local_decoding decoding = local_decoding::batched;
  SUBCASE("shared") {}
  SUBCASE("isolated") { decoding = local_decoding::batched_isolated; }
  const bool isolated = decoding == local_decoding::batched_isolated;
  local_api_server s(dir.path(), {}, 4, {}, decoding);
  auto c = client_for(s.port());
  const std::string system = "the cat and the dog went to the park, and once upon a time we the people";
  const auto ids = s.tok().encode(system, s.tok().prepends_bos());
  REQUIRE(ids.size() > 32);  // two whole pages in common
  const auto ask = [&](httplib::Client& client, const std::string& prompt) {
    return post(client, "/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  };
  const json first = ask(c, system);
  CHECK(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  // The same prompt again: continued from the first one's cache, unless isolated.
  const json again = ask(c, system);
  CHECK(again["choices"][0]["text"] == first["choices"][0]["text"]);
  CHECK(again["usage"]["prompt_tokens_details"]["cached_tokens"] == (isolated ? 0 : ids.size() - 1));
  // Prompts that begin alike, at once: each the text it gets alone.
  const std::vector<std::string> tails = {" said", " ran home", " and then", " went"};
  std::vector<std::future<json>> answers;
  for (const auto& t : tails)
    answers.push_back(std::async(std::launch::async, [&, t] {
      auto own = client_for(s.port());
      return ask(own, system + t);
    }));
  double cached = 0;
  for (std::size_t i = 0; i < tails.size(); ++i) {
    const json r = answers[i].get();
    CAPTURE(tails[i]);
    CHECK(r["choices"][0]["text"] ==
          greedy(s.model(), s.tok(), s.tok().encode(system + tails[i], s.tok().prepends_bos()), 6).text);
    cached += r["usage"]["prompt_tokens_details"]["cached_tokens"].get<double>();
  }
  if (isolated) {
    CHECK(cached == 0);
    CHECK(metric(s.port(), "corolla_api_prompt_tokens_cached_total") == 0);
    // Nothing is kept once every request is done.
    CHECK(metric(s.port(), "corolla_api_kv_pages") == 0);
  } else {
    CHECK(cached >= 32 * tails.size());
    CHECK(metric(s.port(), "corolla_api_kv_pages") > 0);
  }
}

TEST_CASE("requests of different cache_salt values never start on each other's caches, and those of one do") {
  testing::temp_dir_guard dir("api-salted");
  write_chat_model(dir.path());
  local_api_server s(dir.path());
  auto c = client_for(s.port());
  const std::string system = "the cat and the dog went to the park, and once upon a time we the people";
  const auto ids = s.tok().encode(system, s.tok().prepends_bos());
  REQUIRE(ids.size() > 32);
  const auto ask = [&](const std::string& prompt, const json& salt) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}};
    if (!salt.is_null()) body["cache_salt"] = salt;
    return post(c, "/v1/completions", body);
  };
  const auto cached = [](const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); };
  const json alice = ask(system, "alice-3f9c");
  CHECK(cached(alice) == 0);
  // The same prompt under another salt, and under none: computed whole,
  // the same text.
  const json mallory = ask(system, "mallory-77a1");
  CHECK(cached(mallory) == 0);
  CHECK(mallory["choices"][0]["text"] == alice["choices"][0]["text"]);
  CHECK(cached(ask(system, nullptr)) == 0);
  // Under its own salt, a later request (a longer prompt too) starts on the salt's cache.
  CHECK(cached(ask(system, "alice-3f9c")) == static_cast<int>(ids.size()) - 1);
  CHECK(cached(ask(system + " said", "mallory-77a1")) >= 32);
  CHECK(cached(ask(system, nullptr)) == static_cast<int>(ids.size()) - 1);
  // Chat completions take it too.
  const json chat = post(c, "/v1/chat/completions",
                         {{"model", "tiny"},
                          {"messages", {{{"role", "user"}, {"content", system}}}},
                          {"max_tokens", 4},
                          {"cache_salt", "carol"}});
  CHECK(cached(chat) == 0);
}

TEST_CASE("each API key is a tenant's: tenants never share caches, a tenant's keys do, and a wrong key is a 401") {
  testing::temp_dir_guard dir("api-tenants");
  write_chat_model(dir.path());
  local_api_server s(dir.path(), {}, 4, {}, local_decoding::batched, 16, [](api_config& c) {
    c.keys = api_keys::parse("acme sk-acme-1\nacme sk-acme-2\nglobex sk-globex\n", "keys");
  });
  auto c = client_for(s.port());
  const std::string system = "the cat and the dog went to the park, and once upon a time we the people";
  const auto ids = s.tok().encode(system, s.tok().prepends_bos());
  const auto ask = [&](const std::string& key, const json& salt, int status = 200) {
    json body = {{"model", "tiny"}, {"prompt", system}, {"max_tokens", 4}, {"temperature", 0}};
    if (!salt.is_null()) body["cache_salt"] = salt;
    return post(c, "/v1/completions", body, status, {{"Authorization", "Bearer " + key}});
  };
  const auto cached = [](const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(); };
  CHECK(cached(ask("sk-acme-1", nullptr)) == 0);
  // Another tenant, with no salt or with the same salt as another tenant: nothing cached.
  CHECK(cached(ask("sk-globex", nullptr)) == 0);
  CHECK(cached(ask("sk-globex", "shared-salt")) == 0);
  CHECK(cached(ask("sk-acme-1", "shared-salt")) == 0);
  // The same tenant, through its other key: its cache.
  CHECK(cached(ask("sk-acme-2", nullptr)) == static_cast<int>(ids.size()) - 1);
  CHECK(cached(ask("sk-globex", "shared-salt")) == static_cast<int>(ids.size()) - 1);
  const json refused = ask("sk-acme-3", nullptr, 401);
  CHECK(refused["error"]["code"] == "invalid_api_key");
  // /health and /metrics stay open.
  CHECK(c.Get("/health")->status == 200);
}

TEST_CASE("a local engine refuses weights its model does not hold, and a KV cache of no float type") {
  testing::temp_dir_guard dir("api-engine-refusals");
  write_chat_model(dir.path());
  transformer lean = transformer::load_inference(dir.path(), cpu_backend(), weight_format::int8);
  transformer full = transformer::load(dir.path(), cpu_backend());
  for (const local_decoding d : {local_decoding::batched, local_decoding::per_request}) {
    CAPTURE(static_cast<int>(d));
    CHECK_THROWS_WITH_AS(make_local_engine(lean, 2, weight_format::bf16, dtype::f32, d),
                         doctest::Contains("i8 weights for inference only; it decodes with those, not bf16"), model_error);
    CHECK_THROWS_WITH_AS(make_local_engine(full, 2, weight_format::f32, dtype::i32, d),
                         doctest::Contains("f32, bf16 or f16"), model_error);
    // Its own format is served.
    CHECK(make_local_engine(lean, 2, weight_format::int8, dtype::f32, d)->slots() == 2);
  }
}

TEST_CASE("every error is an OpenAI error object with its status") {
  testing::temp_dir_guard dir("api-errors");
  write_chat_model(dir.path(), 32);
  local_api_server s(dir.path(), "sekrit");
  auto c = client_for(s.port());
  const json ok = {{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 2}};
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};

  // 401: no key, a wrong key; the right one works.
  CHECK(post(c, "/v1/completions", ok, 401)["error"]["code"] == "invalid_api_key");
  CHECK(post(c, "/v1/completions", ok, 401, {{"Authorization", "Bearer wrong"}})["error"]["message"] ==
        "Incorrect API key provided.");
  CHECK(c.Get("/v1/models")->status == 401);
  post(c, "/v1/completions", ok, 200, auth);
  // 400: broken JSON, a bad parameter, a prompt beyond the context.
  auto broken = c.Post("/v1/completions", auth, "{\"model\":", "application/json");
  REQUIRE(broken);
  CHECK(broken->status == 400);
  CHECK(json::parse(broken->body)["error"]["type"] == "invalid_request_error");
  json hot = ok;
  hot["temperature"] = 9;
  CHECK(post(c, "/v1/completions", hot, 400, auth)["error"]["param"] == "temperature");
  json too_long = ok;
  too_long["prompt"] = std::vector<int>(40, 5);
  const json ctx = post(c, "/v1/completions", too_long, 400, auth);
  CHECK(ctx["error"]["code"] == "context_length_exceeded");
  CHECK(ctx["error"]["message"].get<std::string>().find("maximum context length is 32 tokens") != std::string::npos);
  json out_of_vocab = ok;
  out_of_vocab["prompt"] = {1, 100000};
  CHECK(post(c, "/v1/completions", out_of_vocab, 400, auth)["error"]["message"].get<std::string>().find(
            "outside the vocabulary") != std::string::npos);
  // Streamed, the same id is a 400 too, not an error event after a 200.
  out_of_vocab["stream"] = true;
  CHECK(post(c, "/v1/completions", out_of_vocab, 400, auth)["error"]["param"] == "prompt");
  // 404: an unknown model, an unknown route.
  json other = ok;
  other["model"] = "gpt-4";
  CHECK(post(c, "/v1/completions", other, 404, auth)["error"]["code"] == "model_not_found");
  auto route = c.Get("/v1/nothing", auth);
  REQUIRE(route);
  CHECK(route->status == 404);
  CHECK(json::parse(route->body)["error"]["message"] == "Unknown route GET /v1/nothing");
  // /metrics needs no key; the refusals were counted by status.
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"401\"}") == 2);
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"400\"}") == 5);
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"404\"}") == 1);
}

TEST_CASE("the key is checked before the body is read, bodies and prompt text are bounded, and a port is one server's") {
  testing::temp_dir_guard dir("api-hostile");
  write_chat_model(dir.path(), 32);
  local_api_server s(dir.path(), "sekrit");
  auto c = client_for(s.port());
  const json ok = {{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 2}};
  // The scheme's case does not matter; the key's does.
  post(c, "/v1/completions", ok, 200, {{"Authorization", "bearer sekrit"}});
  post(c, "/v1/completions", ok, 401, {{"Authorization", "Bearer SEKRIT"}});
  post(c, "/v1/completions", ok, 401, {{"Authorization", "sekrit"}});
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  // Without the key, the answer comes on the headers alone, and the
  // connection ends (its body is never read): `request` written on a
  // keep-alive connection, everything read until the server closes it.
  const auto exchange = [&](const std::string& request) { return raw_exchange(s.port(), request); };
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n"
                           "Content-Type: application/json\r\n";
  // 17 MiB announced, none sent.
  const std::string announced = exchange(head + "Content-Length: " + std::to_string(17u << 20) + "\r\n\r\n");
  CHECK(announced.rfind("HTTP/1.1 401", 0) == 0);
  // A body that would read as a request of its own: one answer, then the end.
  const std::string smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string one = exchange(head + "Content-Length: " + std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  CHECK(one.rfind("HTTP/1.1 401", 0) == 0);
  CHECK(one.find("HTTP/1.1", 1) == std::string::npos);
  CHECK(one.find("invalid_api_key") != std::string::npos);
  // A body whose length is ambiguous or invalid is a 400 on the headers,
  // key or not, and the connection ends: nothing after it is read as a
  // request. So is a body on a GET, which the server would not read.
  const std::string keyed_head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Authorization: Bearer sekrit\r\nContent-Type: application/json\r\n";
  const std::string keyed = keyed_head + "Connection: keep-alive\r\n";
  const std::vector<std::pair<std::string, std::string>> framings = {
      {keyed + "Content-Length: 2\r\nContent-Length: 36\r\n", "2 different values"},
      {keyed + "Content-Length: 2, 36\r\n", "2 different values"},
      {keyed + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", "both Content-Length and Transfer-Encoding"},
      {keyed + "Content-Length: +2\r\n", "'+2' is not a length"},
      {keyed + "Transfer-Encoding: gzip, chunked\r\n", "'gzip, chunked' is not 'chunked'"},
      {"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Length: 2\r\n",
       "a GET request carries a body"}};
  for (const auto& [framing, why] : framings) {
    CAPTURE(framing);
    const std::string ambiguous = exchange(framing + "\r\n{}" + smuggled);
    CHECK(ambiguous.rfind("HTTP/1.1 400", 0) == 0);
    CHECK(ambiguous.find(why) != std::string::npos);
    CHECK(ambiguous.find("HTTP/1.1", 1) == std::string::npos);
  }
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"400\"}") == 5);
  // A HEAD's refusal has no body to say why, and ends its connection too:
  // a request sent once its answer came is never answered.
  {
    const int fd = raw_connect(s.port());
    const std::string refused_head =
        "HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}";
    REQUIRE(::send(fd, refused_head.data(), refused_head.size(), MSG_NOSIGNAL) > 0);
    const timeval limit{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    std::string answer;
    char buf[4096];
    while (answer.find("\r\n\r\n") == std::string::npos) {
      const ssize_t got = ::recv(fd, buf, sizeof buf, 0);
      if (got <= 0) break;
      answer.append(buf, static_cast<std::size_t>(got));
    }
    CHECK(answer.rfind("HTTP/1.1 400", 0) == 0);
    (void)::send(fd, smuggled.data(), smuggled.size(), MSG_NOSIGNAL);  // fails once the server closed
    std::string after;
    ssize_t got = 0;
    while ((got = ::recv(fd, buf, sizeof buf, 0)) > 0) after.append(buf, static_cast<std::size_t>(got));
    ::close(fd);
    CHECK(after.find("HTTP/1.1") == std::string::npos);
    CHECK((got == 0 || errno == ECONNRESET));  // closed, not a timeout
  }
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"health\",status=\"400\"}") == 2);
  // The same length twice, or with an empty item, is no ambiguity.
  for (const std::string& extra : {std::string("Content-Length: {n}\r\n"), std::string("Content-Length: {n},\r\n")}) {
    const std::string body = ok.dump();
    std::string twice = "Content-Length: " + std::to_string(body.size()) + "\r\n" + extra + "Connection: close\r\n";
    twice.replace(twice.find("{n}"), 3, std::to_string(body.size()));
    const std::string answered = exchange(keyed_head + twice + "\r\n" + body);
    CHECK(answered.rfind("HTTP/1.1 200", 0) == 0);
  }
  // Asked first (Expect: 100-continue): a 401, not a 100.
  const std::string asked =
      exchange(head + "Expect: 100-continue\r\nContent-Length: " + std::to_string(17u << 20) + "\r\n\r\n");
  CHECK(asked.rfind("HTTP/1.1 401", 0) == 0);
  // With it, past 16 MiB is a 413, sent with a length or chunked (which
  // httplib 0.11 would read into memory however long).
  const std::string huge(17u << 20, ' ');
  {
    auto c2 = client_for(s.port());
    auto r = c2.Post("/v1/completions", auth, huge, "application/json");
    REQUIRE(r);
    CHECK(r->status == 413);
    std::string chunks = keyed_head + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < 18 * 16; ++i) chunks += "10000\r\n" + std::string(1 << 16, ' ') + "\r\n";
    const std::string chunked = exchange(chunks + "0\r\n\r\n");
    CHECK(chunked.rfind("HTTP/1.1 413", 0) == 0);
    CHECK(chunked.find("larger than 16 MiB") != std::string::npos);
  }
  // Text that cannot fit the 32-token context however it encodes is
  // refused before it is encoded.
  json long_text = ok;
  long_text["prompt"] = std::string(256 * 32 + 1, 'a');
  const json refused = post(c, "/v1/completions", long_text, 400, auth);
  CHECK(refused["error"]["code"] == "context_length_exceeded");
  CHECK(refused["error"]["message"] ==
        "This model's maximum context length is 32 tokens; the prompt's 8193 bytes of text cannot fit (at most 8192).");
  json long_chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", std::string(9000, 'a')}}}}};
  CHECK(post(c, "/v1/chat/completions", long_chat, 400, auth)["error"]["param"] == "messages");
  json many = {{"model", "tiny"}, {"messages", json::array()}};
  for (int i = 0; i < 40; ++i) many["messages"].push_back({{"role", "user"}, {"content", "a"}});
  CHECK(post(c, "/v1/chat/completions", many, 400, auth)["error"]["message"] ==
        "This model's maximum context length is 32 tokens; 40 messages cannot fit.");
  // A body nested 100,000 deep is a 400, and the server goes on.
  const std::string deep = R"({"model": "tiny", "prompt": [1, )" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  auto nested = c.Post("/v1/completions", auth, deep, "application/json");
  REQUIRE(nested);
  CHECK(nested->status == 400);
  post(c, "/v1/completions", ok, 200, auth);
  // The refusals were counted.
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"401\"}") == 5);
  CHECK(metric(s.port(), "corolla_api_requests_total{endpoint=\"completions\",status=\"413\"}") == 2);
  // A second server on the same address fails to bind instead of sharing
  // the port (httplib's default SO_REUSEPORT would let it).
  httplib::Server second;
  CHECK_THROWS_AS(bind_http(second, "127.0.0.1", s.port()), std::runtime_error);
}

TEST_CASE("prompt text is bounded by the tokenizer's longest piece where it is longer than 256 bytes") {
  testing::temp_dir_guard dir("api-long-piece");
  testing::tiny_model_options o;
  o.vocab = 260;
  o.max_positions = 32;
  testing::write_tiny_model(dir.path(), o);
  // Byte tokens, and one added token of 300 bytes (id 259, not special:
  // text holding it encodes to it).
  write_chatml_bpe(dir.path());
  const std::string piece(300, 'x');
  {
    std::ifstream in(dir / "tokenizer.json");
    json tok = json::parse(in);
    tok["added_tokens"].push_back({{"id", 259}, {"content", piece}, {"special", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"single_word", false}});
    tok["model"]["vocab"][piece] = 259;
    std::ofstream(dir / "tokenizer.json") << tok.dump();
    std::ofstream(dir / "tokenizer_config.json") << json{{"chat_template", "<|im_start|>"}}.dump();
  }
  local_api_server s(dir.path());
  auto c = client_for(s.port());
  // 30 tokens of 9000 bytes: past 256 bytes a token of the 32, and it fits.
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += piece;
  const json fits = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 1}}, 200);
  CHECK(fits["usage"]["prompt_tokens"] == 30);
  // Past the longest piece a token, it is refused unencoded.
  const json refused = post(c, "/v1/completions",
                            {{"model", "tiny"}, {"prompt", std::string(301 * 32 + 1, 'x')}, {"max_tokens", 1}}, 400);
  CHECK(refused["error"]["code"] == "context_length_exceeded");
  CHECK(refused["error"]["message"].get<std::string>().find("at most 9632") != std::string::npos);
}

TEST_CASE("an engine failure is a 500 with an error object, before and during a stream") {
  testing::temp_dir_guard dir("api-500");
  write_chat_model(dir.path());
  local_api_server s(dir.path(), {}, 1,
                     [](completion_engine& local) { return std::make_unique<broken_engine>(local); });
  auto c = client_for(s.port());
  const json e = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the"}}, 500);
  CHECK(e["error"]["type"] == "server_error");
  CHECK(e["error"]["message"].get<std::string>().find("something impossible happened") != std::string::npos);
  // In a stream the status is already sent: the error comes as an event.
  const auto events = stream_events(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the"}, {"stream", true}});
  REQUIRE_FALSE(events.empty());
  CHECK(events.back()["error"]["type"] == "server_error");
}

TEST_CASE("a swarm with no server covering the blocks answers 503") {
  testing::temp_dir_guard dir("api-503");
  write_chat_model(dir.path());
  auto runtime = node::start({});
  REQUIRE(runtime);
  swarm_client_options o;
  o.servers = {"tcp://127.0.0.1:1"};  // nothing listens there
  o.connect_timeout = std::chrono::milliseconds(300);
  o.model = "tiny";
  const model_config cfg = load_config(dir.path());
  auto engine = make_swarm_engine(**runtime, o, head::load(checkpoint::open(dir.path()), cfg, cpu_backend()), 2);
  const auto tok = load_tokenizer(dir.path());
  api_config ac;
  ac.model_id = "tiny";
  http_api server(*engine, *tok, std::nullopt, "this model has no chat template", ac);
  const int port = server.bind("127.0.0.1", 0);
  std::thread serving([&] { server.run(); });
  auto c = client_for(port);
  const json e = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the"}}, 503);
  CHECK(e["error"]["code"] == "swarm_unavailable");
  // No chat template: chat requests are refused, naming the model (the
  // reason given to the server, which names its directory, stays there).
  const json chat = post(c, "/v1/chat/completions",
                         {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}, 400);
  CHECK(chat["error"]["message"] ==
        "The model 'tiny' has no chat template, so this server answers no chat requests (its operator can give one "
        "with --chat-template); /v1/completions works.");
  server.stop();
  serving.join();
}

TEST_CASE("a client that goes away mid-stream ends its generation and frees its slot") {
  testing::temp_dir_guard dir("api-disconnect");
  write_chat_model(dir.path());
  local_api_server s(dir.path(), {}, 1, [](completion_engine& local) {
    return std::make_unique<slow_engine>(local, std::chrono::milliseconds(25));
  });
  {
    auto c = client_for(s.port());
    int chunks = 0;
    const json body = {{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 100}, {"temperature", 0},
                       {"stream", true}, {"stop", "\x01"}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) { return ++chunks < 2; };
    c.send(req);  // ends with an error: the receiver gave up
    CHECK(chunks == 2);
  }
  // The server notices at its next write and stops generating.
  testing::eventually([&] { return metric(s.port(), "corolla_api_client_disconnects_total") >= 1; },
                      std::chrono::seconds(20), std::chrono::milliseconds(50));
  CHECK(metric(s.port(), "corolla_api_client_disconnects_total") == 1);
  CHECK(metric(s.port(), "corolla_api_requests_in_flight") == 0);
  CHECK(s.engine().busy() == 0);
  CHECK(metric(s.port(), "corolla_api_completion_tokens_total") < 100);
  // The one slot serves the next request.
  auto c = client_for(s.port());
  post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 2}});
}

TEST_CASE("/metrics on a listener of its own answers while every HTTP thread is busy") {
  testing::temp_dir_guard dir("api-metrics-listen");
  write_chat_model(dir.path());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> entered{0};
  // Released on the way out too, so that a failed check ends the test
  // instead of holding the server's threads.
  struct releaser {
    std::promise<void>& p;
    bool done = false;
    void now() {
      if (!std::exchange(done, true)) p.set_value();
    }
    ~releaser() { now(); }
  };
  // Two HTTP threads (the least), both held by a generation.
  local_api_server s(
      dir.path(), {}, 4,
      [&](completion_engine& local) { return std::make_unique<held_engine>(local, released, entered); },
      local_decoding::batched, 2);
  metrics_server own([&s] { return s.server().metrics_text(); });
  const int port = own.start("127.0.0.1", 0);
  releaser go{release};
  std::vector<std::future<int>> held;
  for (int i = 0; i < 2; ++i)
    held.push_back(std::async(std::launch::async, [&] {
      auto c = client_for(s.port());
      auto r = c.Post("/v1/completions", json{{"model", "tiny"}, {"prompt", "the"}, {"max_tokens", 2}}.dump(),
                      "application/json");
      return r ? r->status : -1;
    }));
  CHECK(testing::eventually([&] { return entered == 2; }, std::chrono::seconds(20)));
  // The API's threads are both taken; its metrics still answer here.
  httplib::Client m("127.0.0.1", port);
  m.set_read_timeout(20, 0);
  auto scraped = m.Get("/metrics");
  REQUIRE(scraped);
  CHECK(scraped->status == 200);
  CHECK(parse_prometheus_text(scraped->body).at("corolla_api_requests_in_flight") == 2);
  auto health = m.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  go.now();
  for (auto& h : held) CHECK(h.get() == 200);
  CHECK(testing::eventually(
      [&] {
        auto r = m.Get("/metrics");
        return r && parse_prometheus_text(r->body).at("corolla_api_requests_in_flight") == 0;
      },
      std::chrono::seconds(20)));
}

TEST_CASE("/metrics counts requests, tokens and latencies") {
  testing::temp_dir_guard dir("api-metrics");
  write_chat_model(dir.path());
  local_api_server s(dir.path());
  auto c = client_for(s.port());
  int completion_tokens = 0, prompt_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    const json r = post(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the cat"}, {"max_tokens", 5}});
    completion_tokens += r["usage"]["completion_tokens"].get<int>();
    prompt_tokens += r["usage"]["prompt_tokens"].get<int>();
  }
  stream_events(c, "/v1/completions", {{"model", "tiny"}, {"prompt", "the cat"}, {"max_tokens", 5}, {"stream", true}});
  // The stream's request leaves the in-flight gauge once its provider
  // returns, which may be a moment after the client read [DONE].
  std::map<std::string, double> m;
  for (int i = 0; i < 200; ++i) {
    auto res = c.Get("/metrics");
    REQUIRE(res);
    CHECK(res->get_header_value("Content-Type").find("text/plain; version=0.0.4") == 0);
    m = parse_prometheus_text(res->body);
    if (m.at("corolla_api_requests_in_flight") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(m.at("corolla_api_requests_total{endpoint=\"completions\",status=\"200\"}") == 4);
  CHECK(m.at("corolla_api_prompt_tokens_total") == prompt_tokens + prompt_tokens / 3);
  CHECK(m.at("corolla_api_completion_tokens_total") >= completion_tokens + 1);
  CHECK(m.at("corolla_api_request_duration_seconds_count{endpoint=\"completions\"}") == 4);
  CHECK(m.at("corolla_api_time_to_first_token_seconds_count{endpoint=\"completions\"}") == 4);
  CHECK(m.at("corolla_api_slots") == 4);
  CHECK(m.at("corolla_api_requests_in_flight") == 0);
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(json::parse(health->body)["status"] == "ok");
}
