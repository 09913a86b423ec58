// OpenAI requests parsed and validated (every refusal names its parameter),
// response and chunk shapes, and stop sequences over streamed text.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "api/openai_request.hpp"
#include "api/stop_text.hpp"

using namespace corolla::api;
using json = nlohmann::json;

namespace {

/// The api_error parse_request throws for `body`.
api_error refusal(const json& body, endpoint to = endpoint::completions) {
  try {
    parse_request(body.dump(), to);
  } catch (const api_error& e) {
    return e;
  }
  FAIL("no error for " << body.dump());
  return api_error(0, "", "");
}

}  // namespace

TEST_CASE("a completion request is parsed with OpenAI's defaults") {
  const auto r = parse_request(R"({"model": "tiny", "prompt": "Hello"})", endpoint::completions);
  CHECK(r.model == "tiny");
  CHECK(r.prompt == "Hello");
  CHECK_FALSE(r.max_tokens.has_value());
  CHECK(r.temperature == 1.0f);
  CHECK(r.top_p == 1.0f);
  CHECK_FALSE(r.stream);
  CHECK(r.stop.empty());

  const auto ids = parse_request(
      R"({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 7,
          "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true}, "n": 1,
          "presence_penalty": 0, "user": "someone", "ignore_eos": true})",
      endpoint::completions);
  CHECK(ids.prompt_ids == std::vector<std::int32_t>{1, 2, 3});
  CHECK(ids.max_tokens == 5);
  CHECK(ids.temperature == 0.0f);
  CHECK(ids.top_p == 0.5f);
  CHECK(ids.seed == 7u);
  CHECK(ids.stop == std::vector<std::string>{"a", "bc"});
  CHECK(ids.stream);
  CHECK(ids.include_usage);
  CHECK(ids.ignore_eos);
  CHECK(parse_request(R"({"model": "m", "prompt": ["only one"], "stop": "x"})", endpoint::completions).stop ==
        std::vector<std::string>{"x"});
}

TEST_CASE("a chat request takes text messages, content parts and the newer field names") {
  const auto r = parse_request(
      R"({"model": "tiny", "messages": [{"role": "developer", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
          "max_completion_tokens": 9})",
      endpoint::chat_completions);
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "Hi there");
  CHECK(r.max_tokens == 9);
}

TEST_CASE("invalid requests are refused with a 400 naming the parameter") {
  const json base = {{"model", "tiny"}, {"prompt", "x"}};
  const auto with = [&](const char* key, json v) {
    json j = base;
    j[key] = std::move(v);
    return j;
  };
  struct refusal_case {
    json body;
    std::string param, message_part;
  };
  const std::vector<refusal_case> cases = {
      {json::object({{"prompt", "x"}}), "model", "model is required"},
      {{{"model", "tiny"}}, "prompt", "prompt is required"},
      {with("prompt", json::array()), "prompt", "empty array"},
      {with("prompt", json::array({"a", "b"})), "prompt", "batch of prompts"},
      {with("prompt", json::array({1, -2})), "prompt", "-2 is not a token id"},
      {with("prompt", 5), "prompt", "got a number"},
      {with("max_tokens", 0), "max_tokens", "must be in [1,"},
      {with("max_tokens", 2.5), "max_tokens", "must be an integer"},
      {with("temperature", 2.5), "temperature", "must be in [0, 2]"},
      {with("temperature", "hot"), "temperature", "must be a number"},
      {with("top_p", 0), "top_p", "(0, 1]"},
      {with("n", 2), "n", "n must be 1"},
      {with("stop", json::array({"a", "b", "c", "d", "e"})), "stop", "at most 4"},
      {with("stop", ""), "stop", "must not be empty"},
      {with("stop", 3), "stop", "string or an array"},
      {with("stream", "yes"), "stream", "boolean"},
      {with("ignore_eos", 1), "ignore_eos", "boolean"},
      {with("stream_options", {{"include_usage", true}}), "stream_options", "only allowed with stream"},
      {with("seed", "x"), "seed", "integer"},
      {with("logprobs", 2), "logprobs", "not supported"},
      {with("presence_penalty", 0.5), "presence_penalty", "not supported"},
      {with("echo", true), "echo", "not supported"},
      {with("best_of", 3), "best_of", "best_of"},
      {with("cache_salt", ""), "cache_salt", "non-empty string, got an empty one"},
      {with("cache_salt", 42), "cache_salt", "non-empty string, got a number"},
      {with("cache_salt", std::string(1025, 's')), "cache_salt", "at most 1024 bytes, got 1025"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body.dump());
    const api_error e = refusal(c.body);
    CHECK(e.status() == 400);
    CHECK(e.type() == "invalid_request_error");
    CHECK(e.param() == c.param);
    CHECK(std::string(e.what()).find(c.message_part) != std::string::npos);
    const json body = e.body();
    CHECK(body["error"]["message"] == e.what());
    CHECK(body["error"]["param"] == c.param);
  }
  // Not JSON, not an object.
  try {
    parse_request("{\"model\": ", endpoint::completions);
    FAIL("accepted broken JSON");
  } catch (const api_error& e) {
    CHECK(e.status() == 400);
    CHECK(std::string(e.what()).find("not valid JSON") != std::string::npos);
    CHECK(e.body()["error"]["param"].is_null());
  }
  CHECK(refusal(json::array({1})).status() == 400);
  // A salt is kept as given; null is none.
  json salted = base;
  salted["cache_salt"] = std::string(1024, 's');
  CHECK(parse_request(salted.dump(), endpoint::completions).cache_salt == std::string(1024, 's'));
  salted["cache_salt"] = nullptr;
  CHECK(parse_request(salted.dump(), endpoint::completions).cache_salt.empty());
  // Chat-specific refusals.
  const auto chat = [](json messages) { return json{{"model", "tiny"}, {"messages", std::move(messages)}}; };
  CHECK(refusal(chat(json::array()), endpoint::chat_completions).param() == "messages");
  CHECK(refusal(chat({{{"role", "tool"}, {"content", "x"}}}), endpoint::chat_completions).param() ==
        "messages[0].role");
  CHECK(refusal(chat({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}), endpoint::chat_completions)
            .param() == "messages[0].content");
  CHECK(refusal(chat({{{"role", "user"}}}), endpoint::chat_completions).param() == "messages[0].content");
  json tools = chat({{{"role", "user"}, {"content", "x"}}});
  tools["tools"] = json::array({{{"type", "function"}}});
  CHECK(refusal(tools, endpoint::chat_completions).param() == "tools");
}

TEST_CASE("a hostile audit's requests: deep nesting, odd types and unsupported fields are 400s naming them") {
  // Nested 100,000 deep: a copy or a dump of it would overflow the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& body :
       {R"({"model": "m", "prompt": [1, )" + deep + "]}",
        R"({"model": "m", "messages": [{"role": "user", "content": )" + deep + "}]}"}) {
    for (endpoint to : {endpoint::completions, endpoint::chat_completions}) {
      try {
        parse_request(body, to);
        FAIL("accepted a body nested 100,000 deep");
      } catch (const api_error& e) {
        CHECK(e.status() == 400);
        CHECK(std::string(e.what()) == "the body nests arrays and objects deeper than 64 levels");
      }
    }
  }
  // 64 levels are fine (and refused for what they are), 65 are not.
  const auto nested = [](int n) {  // the body object, the prompt array and n more
    return R"({"model": "m", "prompt": [1, )" + std::string(n, '[') + "7" + std::string(n, ']') + "]}";
  };
  CHECK(refusal(json::parse(nested(62))).param() == "prompt");
  try {
    parse_request(nested(63), endpoint::completions);
    FAIL("accepted a body nested 65 deep");
  } catch (const api_error& e) {
    CHECK(std::string(e.what()) == "the body nests arrays and objects deeper than 64 levels");
  }
  // JSON errors without nlohmann's exception ids.
  try {
    parse_request("{\"model\": x}", endpoint::completions);
    FAIL("accepted broken JSON");
  } catch (const api_error& e) {
    CHECK(std::string(e.what()).rfind("the body is not valid JSON: parse error at line 1", 0) == 0);
    CHECK(std::string(e.what()).find("[json.exception") == std::string::npos);
  }
  const json base = {{"model", "tiny"}, {"prompt", "x"}};
  const json chat = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  const auto with = [](json j, const char* key, json v) {
    j[key] = std::move(v);
    return j;
  };
  struct refusal_case {
    json body;
    endpoint to;
    std::string param, message_part;
  };
  const auto c = endpoint::completions, ch = endpoint::chat_completions;
  for (const auto& r : std::vector<refusal_case>{
           // A 500 with the JSON library's text before.
           {with(chat, "messages", {{{"role", "user"}, {"content", {{{"type", 5}, {"text", "x"}}}}}}), ch,
            "messages[0].content", "only text parts"},
           {with(chat, "response_format", {{"type", 5}}), ch, "response_format",
            "must be an object with a string type, got a type of a number"},
           // Ignored before.
           {with(chat, "response_format", "json_object"), ch, "response_format", "got a string"},
           {with(chat, "response_format", json::array()), ch, "response_format", "got an array"},
           {with(base, "echo", 1), c, "echo", "echo must be a boolean"},
           {with(base, "echo", "true"), c, "echo", "echo must be a boolean"},
           {with(base, "top_logprobs", 2), c, "top_logprobs", "not supported"},
           {with(chat, "tool_choice", "required"), ch, "tool_choice", "not supported by corolla (no tools)"},
           {with(chat, "function_call", "auto"), ch, "function_call", "not supported"},
           {with(chat, "modalities", {"text", "audio"}), ch, "modalities", "not supported"},
           {with(chat, "audio", {{"voice", "alloy"}}), ch, "audio", "not supported"},
           // 0 as the sampler's float.
           {with(base, "top_p", 1e-300), c, "top_p", "(0 as the sampler's 32-bit float)"},
       }) {
    CAPTURE(r.body.dump());
    const api_error e = refusal(r.body, r.to);
    CHECK(e.status() == 400);
    CHECK(e.param() == r.param);
    CHECK(std::string(e.what()).find(r.message_part) != std::string::npos);
  }
  // What is allowed stays allowed: the defaults written out.
  json fine = chat;
  fine["tool_choice"] = "none";
  fine["modalities"] = {"text"};
  fine["response_format"] = {{"type", "text"}};
  fine["top_logprobs"] = 0;
  CHECK(parse_request(fine.dump(), ch).messages.size() == 1);
  CHECK(parse_request(with(base, "echo", false).dump(), c).prompt == "x");
  CHECK(parse_request(with(base, "top_p", 1e-30).dump(), c).top_p > 0.0f);
}

TEST_CASE("responses and stream chunks have the OpenAI shapes") {
  const response_header c{"cmpl-1", 1700000000, "tiny", endpoint::completions};
  const json r = response_json(c, "hello", "length", {3, 2});
  CHECK(r["object"] == "text_completion");
  CHECK(r["choices"][0]["text"] == "hello");
  CHECK(r["choices"][0]["finish_reason"] == "length");
  CHECK(r["usage"]["total_tokens"] == 5);
  const json chunk = chunk_json(c, "he", "", false);
  CHECK(chunk["choices"][0]["finish_reason"].is_null());

  const response_header h{"chatcmpl-1", 1700000000, "tiny", endpoint::chat_completions};
  const json chat = response_json(h, "hi", "stop", {1, 1});
  CHECK(chat["object"] == "chat.completion");
  CHECK(chat["choices"][0]["message"]["role"] == "assistant");
  CHECK(chat["choices"][0]["message"]["content"] == "hi");
  const json first = chunk_json(h, "", "", true);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["delta"]["content"] == "");
  const json last = chunk_json(h, "", "stop", false);
  CHECK(last["choices"][0]["delta"].empty());
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  const json u = usage_chunk_json(h, {4, 6});
  CHECK(u["choices"].empty());
  CHECK(u["usage"]["completion_tokens"] == 6);
  // Without include_usage chunks have no usage; with it, null until the last.
  CHECK_FALSE(first.contains("usage"));
  response_header counted = h;
  counted.include_usage = true;
  const json before_last = chunk_json(counted, "x", "", false);
  REQUIRE(before_last.contains("usage"));
  CHECK(before_last["usage"].is_null());
  CHECK(sse_event(json{{"a", 1}}) == "data: {\"a\":1}\n\n");
  CHECK(sse_done() == "data: [DONE]\n\n");
  // Bytes a model sampled that form no UTF-8 character become U+FFFD
  // instead of failing the answer.
  CHECK(to_body(json("ok \xff\xfe!")) == "\"ok \xEF\xBF\xBD\xEF\xBF\xBD!\"");
  CHECK(sse_event(json{{"text", "\xc3"}}) == "data: {\"text\":\"\xEF\xBF\xBD\"}\n\n");
}

TEST_CASE("stop sequences cut streamed text where the whole text would be cut") {
  const auto streamed = [](std::vector<std::string> stops, const std::vector<std::string>& pieces, bool* matched) {
    stop_text s(std::move(stops));
    std::string out;
    for (const auto& p : pieces) out += s.push(p);
    out += s.finish();
    if (matched) *matched = s.matched();
    return out;
  };
  bool matched = false;
  // A stop sequence split over pieces is still found, and nothing of it leaks.
  CHECK(streamed({"END"}, {"abc E", "N", "D tail"}, &matched) == "abc ");
  CHECK(matched);
  // A partial match that does not complete is released.
  CHECK(streamed({"END"}, {"abc EN", "x", " more"}, &matched) == "abc ENx more");
  CHECK_FALSE(matched);
  // A held-back tail at the end of generation comes out.
  CHECK(streamed({"END"}, {"abc E"}, &matched) == "abc E");
  // The earliest of several sequences wins.
  CHECK(streamed({"world", "lo w"}, {"hello world"}, &matched) == "hel");
  // Multi-byte characters are never split.
  CHECK(streamed({"é!"}, {"caf", "é", "!", " no"}, &matched) == "caf");
  CHECK(streamed({"日本"}, {"x日", "本語"}, &matched) == "x");
  // Without stop sequences text passes straight through.
  stop_text none({});
  CHECK(none.push("abc") == "abc");
  // Text is released as soon as no sequence can start in it.
  stop_text s({"xyz"});
  CHECK(s.push("abcx") == "abc");
  CHECK(s.push("y") == "");
  CHECK(s.push("q") == "xyq");
  CHECK(s.push("x") == "");
  CHECK(s.push("yz after") == "");
  CHECK(s.matched());
  CHECK(s.push("more") == "");
  CHECK(s.finish() == "");
}
