#include "api/chat_template.hpp"

#include <chrono>
#include <ctime>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/whole_file.hpp"

namespace corolla::api {
namespace {

constexpr std::string_view kFamilies[] = {"llama3", "llama3.1", "chatml", "mistral", "llama2"};

/// Jinja's `trim` and Python's str.strip(): ASCII whitespace at both ends.
std::string trimmed(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\f\v";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

/// A special-token entry of tokenizer_config.json: a string, or an
/// AddedToken object {"content": ...}; "" for null or absent.
std::string token_string(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return {};
  const auto& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return {};
}

/// ChatML templates write their built-in system message as a literal
/// '<|im_start|>system\n...<|im_end|>' (Qwen2, Qwen2.5); the literal is the
/// one whose text up to <|im_end|> holds no template code.
std::string chatml_default_system(const std::string& source) {
  for (const std::string_view head : {std::string_view("<|im_start|>system\\n"), std::string_view("<|im_start|>system\n")}) {
    for (std::size_t at = source.find(head); at != std::string::npos; at = source.find(head, at + 1)) {
      const std::size_t begin = at + head.size();
      const std::size_t end = source.find("<|im_end|>", begin);
      if (end == std::string::npos) continue;
      const std::string_view text(source.data() + begin, end - begin);
      if (text.empty() || text.find_first_of("'\"{}%+") != std::string_view::npos) continue;
      // Jinja string escapes the templates use.
      std::string out;
      for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
          out += '\n';
          ++i;
        } else {
          out += text[i];
        }
      }
      return out;
    }
  }
  return {};
}

/// Llama 3.2+ templates date the system header with strftime_now("%d %b
/// %Y"), which HF provides; Llama 3.1's use the fixed "26 Jul 2024".
std::string today() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

/// `turns` (the messages after a first system message, `first` of them)
/// alternate user and assistant, starting with the user; at least one.
void require_alternation(const std::vector<chat_message>& turns, std::string_view family, std::size_t first) {
  const std::string needs = "the " + std::string(family) +
                            " chat template needs user and assistant messages that alternate, starting with the user "
                            "(after an optional first system message)";
  if (turns.empty()) throw model_error(needs + "; there is no user message");
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const bool user_turn = i % 2 == 0;
    if ((turns[i].role == "user") != user_turn || (!user_turn && turns[i].role != "assistant"))
      throw model_error(needs + "; message " + std::to_string(first + i) + " has role '" + turns[i].role + "'");
  }
}

}  // namespace

std::string_view to_string(chat_family f) { return kFamilies[static_cast<int>(f)]; }

std::string known_chat_templates() {
  std::string out;
  for (auto name : kFamilies) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

chat_template::chat_template(chat_family family, std::string bos, std::string eos, std::string default_system)
    : family_(family), bos_(std::move(bos)), eos_(std::move(eos)), default_system_(std::move(default_system)) {
  if (bos_.empty()) {
    if (family_ == chat_family::llama3 || family_ == chat_family::llama3_1) bos_ = "<|begin_of_text|>";
    if (family_ == chat_family::mistral || family_ == chat_family::llama2) bos_ = "<s>";
  }
  if (eos_.empty()) {
    if (family_ == chat_family::llama3 || family_ == chat_family::llama3_1) eos_ = "<|eot_id|>";
    if (family_ == chat_family::chatml) eos_ = "<|im_end|>";
    if (family_ == chat_family::mistral || family_ == chat_family::llama2) eos_ = "</s>";
  }
}

chat_template chat_template::recognise(const std::string& source, const std::string& origin) {
  const auto has = [&](std::string_view marker) { return source.find(marker) != std::string::npos; };
  if (has("<|start_header_id|>")) {
    chat_template t(has("Cutting Knowledge Date") ? chat_family::llama3_1 : chat_family::llama3);
    t.dated_today_ = has("strftime_now");
    return t;
  }
  if (has("<|im_start|>")) return chat_template(chat_family::chatml, {}, {}, chatml_default_system(source));
  if (has("<<SYS>>")) return chat_template(chat_family::llama2);
  if (has("[INST]")) return chat_template(chat_family::mistral);
  throw model_error("the chat template of " + origin + " is not one corolla knows (known: " + known_chat_templates() +
                    "); pass --chat-template NAME|FILE");
}

chat_template chat_template::for_model(const std::filesystem::path& dir, const std::string& override_spec) {
  const auto config_file = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_file)) {
    try {
      config = nlohmann::json::parse(read_whole_file(config_file));
    } catch (const nlohmann::json::exception& e) {
      throw model_error(config_file.string() + " is not valid JSON: " + e.what());
    }
    if (!config.is_object()) throw model_error(config_file.string() + " is not a JSON object");
  }
  chat_template t(chat_family::chatml);
  if (!override_spec.empty()) {
    bool named = false;
    for (std::size_t i = 0; i < std::size(kFamilies); ++i)
      if (override_spec == kFamilies[i]) t = chat_template(static_cast<chat_family>(i)), named = true;
    if (!named) {
      if (!std::filesystem::is_regular_file(override_spec))
        throw model_error("--chat-template '" + override_spec + "' is neither a known template (" +
                          known_chat_templates() + ") nor a readable file");
      t = recognise(read_whole_file(override_spec, "chat template"), override_spec);
    }
  } else {
    const nlohmann::json* source = nullptr;
    if (config.contains("chat_template")) {
      const auto& v = config.at("chat_template");
      if (v.is_string()) source = &v;
      if (v.is_array())
        for (const auto& named : v)
          if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
              named.at("template").is_string())
            source = &named.at("template");
    }
    if (!source)
      throw model_error("the model in " + dir.string() +
                        " has no chat template (no chat_template in tokenizer_config.json); pass --chat-template "
                        "NAME|FILE (known: " + known_chat_templates() + ")");
    t = recognise(source->get<std::string>(), config_file.string());
  }
  if (auto bos = token_string(config, "bos_token"); !bos.empty()) t.bos_ = bos;
  // Llama 3 instruct's tokenizer_config names <|eot_id|> or
  // <|end_of_text|> as eos_token; a turn ends with <|eot_id|> either way
  // (end_of_turn), so only the other families take it.
  if (auto eos = token_string(config, "eos_token"); !eos.empty() && t.family_ != chat_family::llama3 &&
                                                     t.family_ != chat_family::llama3_1 && t.family_ != chat_family::chatml)
    t.eos_ = eos;
  return t;
}

std::vector<prompt_piece> chat_template::render(const std::vector<chat_message>& messages) const {
  if (messages.empty()) throw model_error("messages is empty: give at least one message");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      throw model_error("message " + std::to_string(i) + " has role '" + r + "': expected system, user or assistant");
  }
  std::vector<prompt_piece> out;
  const auto text = [&](std::string s) {
    if (!out.empty() && out.back().what == prompt_piece::kind::text)
      out.back().text += s;
    else
      out.push_back({prompt_piece::kind::text, std::move(s)});
  };
  const auto bos = [&] { out.push_back({prompt_piece::kind::bos, {}}); };
  const auto eos = [&] { out.push_back({prompt_piece::kind::eos, {}}); };

  const bool leading_system = messages.front().role == "system";
  const std::vector<chat_message> turns(messages.begin() + (leading_system ? 1 : 0), messages.end());
  switch (family_) {
    case chat_family::llama3:
      bos();
      for (const auto& m : messages) text("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trimmed(m.content) + "<|eot_id|>");
      text("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    case chat_family::llama3_1: {
      bos();
      const std::string date = dated_today_ ? today() : "26 Jul 2024";
      text("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " + date +
           "\n\n" + (leading_system ? trimmed(messages.front().content) : std::string()) + "<|eot_id|>");
      for (const auto& m : turns) text("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trimmed(m.content) + "<|eot_id|>");
      text("<|start_header_id|>assistant<|end_header_id|>\n\n");
      break;
    }
    case chat_family::chatml:
      if (!leading_system && !default_system_.empty()) text("<|im_start|>system\n" + default_system_ + "<|im_end|>\n");
      for (const auto& m : messages) text("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n");
      text("<|im_start|>assistant\n");
      break;
    case chat_family::mistral:
      require_alternation(turns, "mistral", leading_system ? 1 : 0);
      bos();
      for (std::size_t i = 0; i < turns.size(); ++i) {
        if (turns[i].role == "user") {
          const std::string content =
              i == 0 && leading_system ? messages.front().content + "\n\n" + turns[i].content : turns[i].content;
          text("[INST] " + content + " [/INST]");
        } else {
          text(turns[i].content);
          eos();
        }
      }
      break;
    case chat_family::llama2:
      require_alternation(turns, "llama2", leading_system ? 1 : 0);
      for (std::size_t i = 0; i < turns.size(); ++i) {
        std::string content = turns[i].content;
        if (i == 0 && leading_system)
          content = "<<SYS>>\n" + messages.front().content + "\n<</SYS>>\n\n" + content;
        if (turns[i].role == "user") {
          bos();
          text("[INST] " + trimmed(content) + " [/INST]");
        } else {
          text(" " + trimmed(content) + " ");
          eos();
        }
      }
      break;
  }
  return out;
}

std::string chat_template::render_text(const std::vector<chat_message>& messages) const {
  std::string s;
  for (const auto& p : render(messages)) s += p.what == prompt_piece::kind::bos ? bos_ : p.what == prompt_piece::kind::eos ? eos_ : p.text;
  return s;
}

std::vector<std::int32_t> chat_template::encode(const std::vector<chat_message>& messages, const tokenizer& tok) const {
  std::vector<std::int32_t> ids;
  const auto append_text = [&](const std::string& s) {
    if (s.empty()) return;
    const auto part = tok.encode(s, false);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  for (const auto& p : render(messages)) {
    if (p.what == prompt_piece::kind::text) {
      append_text(p.text);
    } else {
      const int id = p.what == prompt_piece::kind::bos ? tok.bos_id() : tok.eos_id();
      if (id >= 0)
        ids.push_back(id);
      else
        append_text(p.what == prompt_piece::kind::bos ? bos_ : eos_);
    }
  }
  return ids;
}

std::string chat_template::end_of_turn() const {
  switch (family_) {
    case chat_family::llama3:
    case chat_family::llama3_1: return "<|eot_id|>";
    case chat_family::chatml: return "<|im_end|>";
    default: return eos_;
  }
}

std::optional<std::int32_t> single_token_id(const tokenizer& tok, const std::string& text) {
  if (text.empty()) return std::nullopt;
  const auto ids = tok.encode(text, false);
  if (ids.size() != 1) return std::nullopt;
  return ids.front();
}

}  // namespace corolla::api
