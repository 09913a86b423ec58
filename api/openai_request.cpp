#include "api/openai_request.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace corolla::api {
namespace {

using json = nlohmann::json;

/// How deep a request body may nest arrays and objects (a chat request
/// needs 5: messages, a message, its content parts, a part).
constexpr int kMaxJsonDepth = 64;

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

/// 2 as "2", 0.5 as "0.5".
std::string plain(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
}

/// The number at `key`, when present and not null.
std::optional<double> number(const json& j, const char* key, double lo, double hi) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  const auto& v = j.at(key);
  if (!v.is_number()) throw invalid_request(std::string(key) + " must be a number, got " + type_name(v), key);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw invalid_request(std::string(key) + " must be in [" + plain(lo) + ", " + plain(hi) + "], got " + v.dump(), key);
  return d;
}

std::optional<std::int64_t> integer(const json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  const auto& v = j.at(key);
  if (!v.is_number_integer())
    throw invalid_request(std::string(key) + " must be an integer, got " + (v.is_number() ? v.dump() : type_name(v)), key);
  // An unsigned value above INT64_MAX reads as negative: compare as unsigned first.
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    throw invalid_request(std::string(key) + " must be at most " + std::to_string(hi) + ", got " + v.dump(), key);
  const auto i = v.get<std::int64_t>();
  if (i < lo || i > hi)
    throw invalid_request(std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "], got " + v.dump(),
                          key);
  return i;
}

/// Parameters that would change the output in ways corolla does not
/// implement: refused rather than ignored.
void refuse_unsupported(const json& j, endpoint to) {
  const auto nonzero = [&](const char* key) {
    return j.contains(key) && !j.at(key).is_null() && !(j.at(key).is_number() && j.at(key).get<double>() == 0.0);
  };
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (nonzero(key)) throw invalid_request(std::string(key) + " is not supported by corolla (only 0)", key);
  if (j.contains("logprobs") && !j.at("logprobs").is_null() && j.at("logprobs") != false)
    throw invalid_request("logprobs is not supported by corolla", "logprobs");
  if (j.contains("logit_bias") && !j.at("logit_bias").is_null() && !j.at("logit_bias").empty())
    throw invalid_request("logit_bias is not supported by corolla", "logit_bias");
  const auto given = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  if (given("top_logprobs") && !(j.at("top_logprobs").is_number() && j.at("top_logprobs").get<double>() == 0.0))
    throw invalid_request("top_logprobs is not supported by corolla (it needs logprobs)", "top_logprobs");
  if (to == endpoint::completions) {
    if (given("echo") && !j.at("echo").is_boolean()) throw invalid_request("echo must be a boolean", "echo");
    if (given("echo") && j.at("echo") == true) throw invalid_request("echo is not supported by corolla", "echo");
    if (j.contains("suffix") && !j.at("suffix").is_null())
      throw invalid_request("suffix is not supported by corolla", "suffix");
    integer(j, "best_of", 1, 1);  // throws for anything but 1
  } else {
    for (const char* key : {"tools", "functions"})
      if (j.contains(key) && !j.at(key).is_null() && !j.at(key).empty())
        throw invalid_request(std::string(key) + " are not supported by corolla", key);
    if (given("response_format")) {
      const json& f = j.at("response_format");
      if (!f.is_object() || (f.contains("type") && !f.at("type").is_string()))
        throw invalid_request("response_format must be an object with a string type, got " +
                                  (f.is_object() ? "a type of " + type_name(f.at("type")) : type_name(f)),
                              "response_format");
      if (f.value("type", "text") != "text")
        throw invalid_request("response_format other than text is not supported by corolla", "response_format");
    }
    // Tool calls and audio: without tools, "none" is the only choice there is.
    for (const char* key : {"tool_choice", "function_call"})
      if (given(key) && j.at(key) != "none")
        throw invalid_request(std::string(key) + " is not supported by corolla (no tools)", key);
    if (given("modalities") && j.at("modalities") != json::array({"text"}))
      throw invalid_request("modalities other than [\"text\"] are not supported by corolla", "modalities");
    if (given("audio")) throw invalid_request("audio output is not supported by corolla", "audio");
  }
}

void parse_prompt(const json& j, completion_request& r) {
  if (!j.contains("prompt")) throw invalid_request("prompt is required", "prompt");
  const auto& p = j.at("prompt");
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
    return;
  }
  if (p.is_array()) {
    if (p.empty()) throw invalid_request("prompt is an empty array", "prompt");
    if (p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
      return;
    }
    if (p[0].is_string() || p[0].is_array())
      throw invalid_request("a batch of prompts is not supported by corolla: send one prompt per request", "prompt");
    for (const auto& id : p) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
        throw invalid_request("prompt must be a string or an array of token ids; " + id.dump() + " is not a token id",
                              "prompt");
      r.prompt_ids.push_back(id.get<std::int32_t>());
    }
    return;
  }
  throw invalid_request("prompt must be a string or an array of token ids, got " + type_name(p), "prompt");
}

void parse_messages(const json& j, completion_request& r) {
  if (!j.contains("messages")) throw invalid_request("messages is required", "messages");
  const auto& ms = j.at("messages");
  if (!ms.is_array() || ms.empty()) throw invalid_request("messages must be a non-empty array", "messages");
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const auto& m = ms[i];
    if (!m.is_object()) throw invalid_request(where + " must be an object", where);
    if (!m.contains("role") || !m.at("role").is_string()) throw invalid_request(where + ".role must be a string", where + ".role");
    chat_message msg{m.at("role").get<std::string>(), {}};
    // "developer" is the newer name of the system role.
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      throw invalid_request(where + ".role '" + msg.role + "' is not supported (system, user, assistant)", where + ".role");
    static const json none;
    const json& content = m.contains("content") ? m.at("content") : none;  // not copied: it may be large
    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (const auto& part : content) {
        if (!part.is_object() || !part.contains("type") || part.at("type") != "text" || !part.contains("text") ||
            !part.at("text").is_string())
          throw invalid_request(where + ".content: only text parts are supported", where + ".content");
        msg.content += part.at("text").get<std::string>();
      }
    } else {
      throw invalid_request(where + ".content must be a string or an array of text parts", where + ".content");
    }
    r.messages.push_back(std::move(msg));
  }
}

}  // namespace

api_error::api_error(int status, std::string type, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

json api_error::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? json() : json(param_)},
            {"code", code_.empty() ? json() : json(code_)}}}};
}

api_error invalid_request(std::string message, std::string param, std::string code) {
  return api_error(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

completion_request parse_request(const std::string& body, endpoint to) {
  json j;
  try {
    // A bound on nesting, checked as the parser goes: the parser keeps its
    // own stack, but a copy or a dump of a value nested 100,000 deep
    // recurses once a level and overflows the thread's stack.
    // `depth` is how many containers enclose the one an array or object
    // starts: the 65th nested one starts at depth 64.
    j = json::parse(body, [](int depth, json::parse_event_t event, json&) {
      const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
      if (opens && depth >= kMaxJsonDepth)
        throw invalid_request("the body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) +
                              " levels");
      return true;
    });
  } catch (const json::exception& e) {
    // nlohmann's "[json.exception.parse_error.101] parse error at ...": the
    // bracketed id says nothing to a client.
    std::string what = e.what();
    if (const auto end = what.find("] "); what.rfind("[json.exception.", 0) == 0 && end != std::string::npos)
      what = what.substr(end + 2);
    throw invalid_request("the body is not valid JSON: " + what);
  }
  if (!j.is_object()) throw invalid_request("the body must be a JSON object");
  completion_request r;
  r.to = to;
  if (!j.contains("model") || !j.at("model").is_string()) throw invalid_request("model is required (a string)", "model");
  r.model = j.at("model").get<std::string>();
  refuse_unsupported(j, to);
  if (to == endpoint::completions)
    parse_prompt(j, r);
  else
    parse_messages(j, r);
  constexpr std::int64_t kMaxTokens = 1 << 24;
  auto max_tokens = integer(j, "max_tokens", 1, kMaxTokens);
  if (to == endpoint::chat_completions)
    if (auto newer = integer(j, "max_completion_tokens", 1, kMaxTokens)) max_tokens = newer;
  if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);
  if (auto t = number(j, "temperature", 0.0, 2.0)) r.temperature = static_cast<float>(*t);
  if (auto p = number(j, "top_p", 0.0, 1.0)) {
    // What the sampler gets is a float: 1e-300 would be 0 there.
    if (static_cast<float>(*p) == 0.0f)
      throw invalid_request("top_p must be in (0, 1], got " + j.at("top_p").dump() +
                                (*p == 0.0 ? "" : " (0 as the sampler's 32-bit float)"),
                            "top_p");
    r.top_p = static_cast<float>(*p);
  }
  if (auto n = integer(j, "n", 1, std::numeric_limits<std::int64_t>::max()); n && *n != 1)
    throw invalid_request("n must be 1 (corolla returns one choice per request)", "n");
  if (j.contains("seed") && !j.at("seed").is_null()) {
    const auto& s = j.at("seed");
    if (!s.is_number_integer()) throw invalid_request("seed must be an integer", "seed");
    r.seed = s.is_number_unsigned() ? s.get<std::uint64_t>() : static_cast<std::uint64_t>(s.get<std::int64_t>());
  }
  if (j.contains("stop") && !j.at("stop").is_null()) {
    const auto& s = j.at("stop");
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) throw invalid_request("stop holds at most 4 sequences, got " + std::to_string(s.size()), "stop");
      for (const auto& x : s) {
        if (!x.is_string()) throw invalid_request("stop must be a string or an array of strings", "stop");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw invalid_request("stop must be a string or an array of strings, got " + type_name(s), "stop");
    }
    for (const auto& x : r.stop)
      if (x.empty()) throw invalid_request("stop sequences must not be empty", "stop");
  }
  if (j.contains("stream") && !j.at("stream").is_null()) {
    if (!j.at("stream").is_boolean()) throw invalid_request("stream must be a boolean", "stream");
    r.stream = j.at("stream").get<bool>();
  }
  if (j.contains("ignore_eos") && !j.at("ignore_eos").is_null()) {
    if (!j.at("ignore_eos").is_boolean()) throw invalid_request("ignore_eos must be a boolean", "ignore_eos");
    r.ignore_eos = j.at("ignore_eos").get<bool>();
  }
  if (j.contains("cache_salt") && !j.at("cache_salt").is_null()) {
    const auto& salt = j.at("cache_salt");
    if (!salt.is_string() || salt.get_ref<const std::string&>().empty())
      throw invalid_request("cache_salt must be a non-empty string, got " +
                                (salt.is_string() ? std::string("an empty one") : type_name(salt)),
                            "cache_salt");
    if (salt.get_ref<const std::string&>().size() > kMaxCacheSaltBytes)
      throw invalid_request("cache_salt holds at most " + std::to_string(kMaxCacheSaltBytes) + " bytes, got " +
                                std::to_string(salt.get_ref<const std::string&>().size()),
                            "cache_salt");
    r.cache_salt = salt.get<std::string>();
  }
  if (j.contains("stream_options") && !j.at("stream_options").is_null()) {
    const auto& so = j.at("stream_options");
    if (!so.is_object()) throw invalid_request("stream_options must be an object", "stream_options");
    if (!r.stream) throw invalid_request("stream_options is only allowed with stream: true", "stream_options");
    if (so.contains("include_usage")) {
      if (!so.at("include_usage").is_boolean())
        throw invalid_request("stream_options.include_usage must be a boolean", "stream_options.include_usage");
      r.include_usage = so.at("include_usage").get<bool>();
    }
  }
  return r;
}

json usage_json(const usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json header_json(const response_header& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

json finish(const std::string& reason) { return reason.empty() ? json() : json(reason); }

/// The one choice of an answer: `key` ("text", "message" or "delta") holds
/// `content`.
json one_choice(const char* key, json content, const std::string& finish_reason) {
  return json::array(
      {{{key, std::move(content)}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish(finish_reason)}}});
}

}  // namespace

json response_json(const response_header& h, const std::string& text, const std::string& finish_reason,
                   const usage& u) {
  json r;
  if (h.to == endpoint::completions) {
    r = header_json(h, "text_completion");
    r["choices"] = one_choice("text", text, finish_reason);
  } else {
    r = header_json(h, "chat.completion");
    r["choices"] = one_choice("message", {{"role", "assistant"}, {"content", text}}, finish_reason);
  }
  r["usage"] = usage_json(u);
  return r;
}

json chunk_json(const response_header& h, const std::string& text, const std::string& finish_reason, bool first) {
  json r;
  if (h.to == endpoint::completions) {
    r = header_json(h, "text_completion");
    r["choices"] = one_choice("text", text, finish_reason);
  } else {
    r = header_json(h, "chat.completion.chunk");
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    r["choices"] = one_choice("delta", std::move(delta), finish_reason);
  }
  if (h.include_usage) r["usage"] = nullptr;
  return r;
}

json usage_chunk_json(const response_header& h, const usage& u) {
  json r = header_json(h, h.to == endpoint::completions ? "text_completion" : "chat.completion.chunk");
  r["choices"] = json::array();
  r["usage"] = usage_json(u);
  return r;
}

std::string to_body(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + to_body(j) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace corolla::api
