// tests/api/api_test_util.hpp — what the API tests share: a tiny byte-level
// BPE tokenizer with ChatML's special tokens, and an in-process `corolla
// api` server over a tiny local model.
#pragma once

#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "api/http_api.hpp"
#include "kernels/backend.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla::api {

/// Ids of write_chatml_bpe's tokenizer: byte b is id b (so '\n' is 10).
inline constexpr std::int32_t kNewline = 10, kImStart = 256, kImEnd = 257, kEndOfText = 258;

/// Writes a tokenizer.json of 256 byte tokens (no merges) and the added
/// tokens <|im_start|>, <|im_end|>, <|endoftext|> into `dir`.
inline void write_chatml_bpe(const std::filesystem::path& dir) {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<unsigned char>(b))] = b;
  json added = json::array();
  const std::pair<const char*, int> specials[] = {{"<|im_start|>", kImStart}, {"<|im_end|>", kImEnd}, {"<|endoftext|>", kEndOfText}};
  for (const auto& [text, id] : specials) {
    vocab[text] = id;
    added.push_back({{"id", id}, {"content", text}, {"special", true}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"single_word", false}});
  }
  const json tok = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}}},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tok.dump();
}

/// A tiny Llama with a trained SentencePiece tokenizer (vocab 128) and a
/// Llama 2 chat template in tokenizer_config.json, written into `dir`.
inline testing::tiny_model_options write_chat_model(const std::filesystem::path& dir, int max_positions = 128) {
  testing::tiny_model_options o;
  o.vocab = 128;
  o.max_positions = max_positions;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(dir, o);
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"chat_template", "{% if messages[0]['role'] == 'system' %}<<SYS>>{% endif %}[INST]"},
                        {"bos_token", "<s>"},
                        {"eos_token", "</s>"}}
             .dump();
  return o;
}

/// Makes the engine a test server uses from the local one (e.g. a wrapper
/// that slows it down or fails).
using engine_wrapper = std::function<std::unique_ptr<completion_engine>(completion_engine& local)>;

/// `corolla api --local` in this process, on a free loopback port.
class local_api_server {
 public:
  explicit local_api_server(const std::filesystem::path& model_dir, std::string api_key = {}, int slots = 4,
                            const engine_wrapper& wrap = {}, local_decoding decoding = local_decoding::batched,
                            int http_threads = 16, const std::function<void(api_config&)>& configure = {})
      : model_(transformer::load(model_dir, cpu_backend())),
        tok_(load_tokenizer(model_dir)),
        local_(make_local_engine(model_, slots, weight_format::f32, dtype::f32, decoding)) {
    if (wrap) wrapped_ = wrap(*local_);
    api_config c;
    c.model_id = "tiny";
    if (!api_key.empty()) c.keys = api_keys::single(std::move(api_key));
    if (configure) configure(c);
    c.http_threads = http_threads;
    server_ = std::make_unique<http_api>(engine(), *tok_, chat_template::for_model(model_dir), "", c);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~local_api_server() {
    server_->stop();
    thread_.join();
  }
  int port() const { return port_; }
  transformer& model() { return model_; }
  const tokenizer& tok() const { return *tok_; }
  http_api& server() { return *server_; }
  completion_engine& engine() { return wrapped_ ? *wrapped_ : *local_; }

 private:
  transformer model_;
  std::unique_ptr<tokenizer> tok_;
  std::unique_ptr<completion_engine> local_;
  std::unique_ptr<completion_engine> wrapped_;
  std::unique_ptr<http_api> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace corolla::api
