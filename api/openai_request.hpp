// api/openai_request.hpp — the OpenAI API's completion and chat-completion
// requests (validated), its error objects, and the JSON of its responses
// and stream chunks.
//
// Shapes follow the OpenAI API reference (Completions, Chat Completions,
// Error codes). Parameters corolla cannot honour (n > 1, logprobs, penalties,
// tools) are refused with a 400 naming the parameter instead of being
// silently ignored; unknown fields are ignored, as the OpenAI API does for
// fields newer than the client.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/chat_template.hpp"

namespace corolla::api {

/// An error the API answers with: HTTP status and OpenAI's error object
/// {"error": {"message", "type", "param", "code"}}.
class api_error : public std::runtime_error {
 public:
  api_error(int status, std::string type, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  /// The error object, as the body of the response.
  nlohmann::json body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

/// 400 invalid_request_error about `param`.
api_error invalid_request(std::string message, std::string param = {}, std::string code = {});

/// Which endpoint a request came to.
enum class endpoint { completions, chat_completions };

/// A validated request to /v1/completions or /v1/chat/completions.
struct completion_request {
  endpoint to = endpoint::completions;
  std::string model;
  /// completions: the prompt as text, or as token ids (prompt_ids
  /// non-empty).
  std::string prompt;
  std::vector<std::int32_t> prompt_ids;
  /// chat completions: the conversation.
  std::vector<chat_message> messages;
  /// max_tokens (or max_completion_tokens); absent: 16 for completions (the
  /// API's default), up to the context for chat.
  std::optional<int> max_tokens;
  float temperature = 1.0f;  ///< [0, 2]; 0 = greedy
  float top_p = 1.0f;        ///< (0, 1]
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;  ///< at most 4 non-empty strings
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  /// Extension (vLLM's name): keep generating past the end-of-sequence and
  /// end-of-turn tokens, up to max_tokens (for benchmarks).
  bool ignore_eos = false;
  /// Extension (vLLM's name): the request's cache domain. Its prompt starts
  /// on, or waits for, the caches of requests with the same salt only (none:
  /// those without one), so that `cached_tokens` and the time to the first
  /// token tell no client of another salt anything of their prompts. At most
  /// kMaxCacheSaltBytes; "" = none.
  std::string cache_salt;
};

/// The longest cache_salt accepted, in bytes.
inline constexpr std::size_t kMaxCacheSaltBytes = 1024;

/// Parses and validates a request body. Throws api_error (400, naming the
/// parameter) for invalid JSON, a missing or mistyped field, a value out of
/// range, or a parameter corolla does not support.
completion_request parse_request(const std::string& body, endpoint to);

/// Usage figures of a response.
struct usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  /// Prompt tokens whose cache came from an earlier request (OpenAI's
  /// prompt_tokens_details.cached_tokens).
  int cached_tokens = 0;
};

/// The fields every response and chunk of one request shares.
struct response_header {
  std::string id;  ///< "cmpl-..." or "chatcmpl-..."
  std::int64_t created = 0;  ///< Unix seconds
  std::string model;
  endpoint to = endpoint::completions;
  /// stream_options.include_usage: every chunk carries "usage": null, the
  /// last one (usage_chunk_json) the counts, as OpenAI's do.
  bool include_usage = false;
};

nlohmann::json usage_json(const usage& u);
/// A whole (non-streamed) response: text_completion or chat.completion.
nlohmann::json response_json(const response_header& h, const std::string& text, const std::string& finish_reason,
                             const usage& u);
/// One stream chunk carrying `text`; `first` adds the chat delta's role;
/// `finish_reason` "" is null; "usage": null with h.include_usage.
nlohmann::json chunk_json(const response_header& h, const std::string& text, const std::string& finish_reason,
                          bool first);
/// The last chunk of a stream with stream_options.include_usage: no
/// choices, the usage.
nlohmann::json usage_chunk_json(const response_header& h, const usage& u);

/// `j` as a response body. Generated text may hold invalid UTF-8 (a model
/// is free to sample bytes that form no character): such bytes become
/// U+FFFD, as OpenAI-compatible servers do, instead of failing the answer.
std::string to_body(const nlohmann::json& j);
/// One server-sent event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
/// The event that ends an OpenAI stream: "data: [DONE]\n\n".
std::string sse_done();

}  // namespace corolla::api
