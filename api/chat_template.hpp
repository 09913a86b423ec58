// api/chat_template.hpp — chat messages to prompt tokens, the way a model's
// HuggingFace chat template renders them.
//
// HF ships chat templates as Jinja source in tokenizer_config.json. Debian
// packages no C++ Jinja engine, so corolla recognises the template families
// of the models it serves and renders them natively, byte for byte as HF's
// apply_chat_template(messages, add_generation_prompt=True) does for
// messages of the roles each family supports:
//   llama3    Llama 3.0 instruct: <|start_header_id|>role<|end_header_id|>\n\n
//             content (trimmed) <|eot_id|>, bos first
//   llama3.1  Llama 3.1/3.2/3.3 instruct: as llama3, and a system header
//             always first ("Cutting Knowledge Date: December 2023\nToday
//             Date: 26 Jul 2024\n\n" before the system message, if any)
//   chatml    Qwen2 / Qwen2.5 / Qwen3: <|im_start|>role\ncontent<|im_end|>\n;
//             the template's default system message (Qwen2.5's "You are
//             Qwen, created by Alibaba Cloud. ...") when the first message
//             is not a system one
//   mistral   Mistral / Mixtral instruct: bos [INST] user [/INST]assistant
//             eos ...; a system message is put in front of the first user
//             message with a blank line (the v0.1 template refuses one)
//   llama2    Llama 2 chat: bos [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser
//             [/INST] assistant eos ...
// Tool calls, images and the templates' other branches are not rendered.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.hpp"

namespace corolla::api {

/// One message of a conversation.
struct chat_message {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;  ///< UTF-8 text
};

/// The template families corolla renders natively.
enum class chat_family { llama3, llama3_1, chatml, mistral, llama2 };

/// "llama3", "llama3.1", "chatml", "mistral", "llama2".
std::string_view to_string(chat_family f);
/// The names above, comma-separated (for error messages and --help).
std::string known_chat_templates();

/// A piece of a rendered conversation: text, or the tokenizer's BOS / EOS
/// (which SentencePiece cannot produce from their text "<s>" / "</s>").
struct prompt_piece {
  enum class kind { text, bos, eos } what = kind::text;
  std::string text;  ///< for kind::text
};

/// A chat template family with the tokens it needs.
class chat_template {
 public:
  /// `bos` / `eos`: the tokenizer_config.json strings ("" = the family's
  /// usual ones). `default_system`: a ChatML template's built-in system
  /// message ("" = none).
  explicit chat_template(chat_family family, std::string bos = {}, std::string eos = {},
                         std::string default_system = {});

  /// Recognises the family of Jinja `source` (the chat_template string of a
  /// tokenizer_config.json, or a .jinja file) by the markers it emits.
  /// Throws model_error naming `origin` and the known families when none
  /// matches.
  static chat_template recognise(const std::string& source, const std::string& origin);

  /// The template of a model directory: `override_spec` when given (a
  /// family name, or a file holding a Jinja template), else the
  /// chat_template of `dir`/tokenizer_config.json (also when it is a list of
  /// named templates: the "default" one). BOS/EOS strings come from the
  /// same file. Throws model_error for a missing or unknown template,
  /// naming the known families and --chat-template.
  static chat_template for_model(const std::filesystem::path& dir, const std::string& override_spec = {});

  chat_family family() const { return family_; }
  const std::string& default_system() const { return default_system_; }

  /// The conversation as the template renders it, ending with the prompt of
  /// the assistant's turn. Throws model_error (shown to the API client as a
  /// 400) for an empty conversation, an unknown role, a system message that
  /// is not first, or (mistral, llama2) user and assistant turns that do not
  /// alternate starting with the user.
  std::vector<prompt_piece> render(const std::vector<chat_message>& messages) const;

  /// render() as one string, BOS and EOS written as their token strings
  /// (what HF's apply_chat_template(tokenize=False) returns).
  std::string render_text(const std::vector<chat_message>& messages) const;

  /// Token ids of the rendered conversation: text pieces encoded without a
  /// BOS of their own (special tokens inside them split out by the
  /// tokenizer), BOS / EOS pieces as the tokenizer's ids.
  std::vector<std::int32_t> encode(const std::vector<chat_message>& messages, const tokenizer& tok) const;

  /// The token string that ends an assistant turn (Llama 3's <|eot_id|>,
  /// ChatML's <|im_end|>, the EOS string for the others): generation stops
  /// there.
  std::string end_of_turn() const;

 private:
  chat_family family_;
  std::string bos_, eos_, default_system_;
  /// llama3.1: the system header carries today's date (Llama 3.2+ templates
  /// call strftime_now), not Llama 3.1's fixed "26 Jul 2024".
  bool dated_today_ = false;
};

/// The id of `text` when the tokenizer encodes it as exactly one token
/// (a special token), else nullopt.
std::optional<std::int32_t> single_token_id(const tokenizer& tok, const std::string& text);

}  // namespace corolla::api
