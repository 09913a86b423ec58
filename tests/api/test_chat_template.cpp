// Chat templates rendered natively, byte for byte as HF's Jinja templates
// render them (the expected strings below were written from each family's
// template source), recognised from tokenizer_config.json, and encoded with
// BOS/EOS as token ids.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/chat_template.hpp"
#include "model/error.hpp"
#include "model/tokenizer.hpp"
#include "tests/api/api_test_util.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::api;
using json = nlohmann::json;

namespace {

const std::vector<chat_message> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi there "},
    {"assistant", " Hello! "},
    {"user", "Tell me a joke."},
};

// The Jinja sources as the model repositories ship them (the Qwen2.5 one
// shortened to its non-tool branch; its literals keep Jinja's \n escapes).
const std::string kLlama3Source =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
const std::string kLlama31Source =
    "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif "
    "%}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December "
    "2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}";
const std::string kQwen25Source =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- "
    "messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.' }}\n    {%- endif %}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        "
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- "
    "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n "
    "   {%- endif %}\n{%- endif %}";
const std::string kQwen3Source =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
const std::string kMistralSource =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";
const std::string kLlama2Source =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
    "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
    "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif "
    "%}{% endfor %}";

void write_config(const std::filesystem::path& dir, const json& j) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << j.dump(2);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("each chat template family renders a conversation as HF's template does") {
  CHECK(chat_template(chat_family::llama3).render_text(kConversation) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(chat_template::recognise(kLlama31Source, "t").render_text(kConversation) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Llama 3.1 without a system message still writes the system header.
  CHECK(chat_template(chat_family::llama3_1).render_text({{"user", "Hi"}}) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(chat_template(chat_family::chatml).render_text(kConversation) ==
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n"
        "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(chat_template(chat_family::mistral).render_text(kConversation) ==
        "<s>[INST] You are terse.\n\nHi there  [/INST] Hello! </s>[INST] Tell me a joke. [/INST]");
  CHECK(chat_template(chat_family::llama2).render_text(kConversation) ==
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello! </s><s>[INST] Tell me a joke. "
        "[/INST]");
}

TEST_CASE("templates are recognised from their Jinja source, with ChatML's default system message") {
  CHECK(chat_template::recognise(kLlama3Source, "t").family() == chat_family::llama3);
  CHECK(chat_template::recognise(kLlama31Source, "t").family() == chat_family::llama3_1);
  CHECK(chat_template::recognise(kMistralSource, "t").family() == chat_family::mistral);
  CHECK(chat_template::recognise(kLlama2Source, "t").family() == chat_family::llama2);
  const auto qwen25 = chat_template::recognise(kQwen25Source, "t");
  CHECK(qwen25.family() == chat_family::chatml);
  CHECK(qwen25.default_system() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(qwen25.render_text({{"user", "Hi"}}) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // A system message of the caller's replaces the default.
  CHECK(qwen25.render_text({{"system", "S"}, {"user", "Hi"}}) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto qwen3 = chat_template::recognise(kQwen3Source, "t");
  CHECK(qwen3.default_system().empty());
  CHECK(qwen3.render_text({{"user", "Hi"}}) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  const std::string e = error_of([] { chat_template::recognise("{{ messages }}", "model/tokenizer_config.json"); });
  CHECK(e.find("model/tokenizer_config.json") != std::string::npos);
  CHECK(e.find("llama3, llama3.1, chatml, mistral, llama2") != std::string::npos);
  CHECK(e.find("--chat-template") != std::string::npos);
}

TEST_CASE("a model directory's template comes from tokenizer_config.json or --chat-template") {
  testing::temp_dir_guard dir("chat-template");
  SUBCASE("a string template, with bos and eos tokens as AddedToken objects") {
    write_config(dir.path(), {{"chat_template", kLlama2Source},
                              {"bos_token", {{"content", "<BOS>"}, {"lstrip", false}}},
                              {"eos_token", "<EOS>"}});
    const auto t = chat_template::for_model(dir.path());
    CHECK(t.family() == chat_family::llama2);
    CHECK(t.render_text({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}) ==
          "<BOS>[INST] a [/INST] b <EOS><BOS>[INST] c [/INST]");
    CHECK(t.end_of_turn() == "<EOS>");
  }
  SUBCASE("a list of named templates takes the default one") {
    write_config(dir.path(), {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "{{ x }}"}},
                                                              {{"name", "default"}, {"template", kQwen3Source}}})}});
    CHECK(chat_template::for_model(dir.path()).family() == chat_family::chatml);
  }
  SUBCASE("no template: a clear error naming the way out") {
    write_config(dir.path(), {{"bos_token", "<s>"}});
    const std::string e = error_of([&] { chat_template::for_model(dir.path()); });
    CHECK(e.find("has no chat template") != std::string::npos);
    CHECK(e.find("--chat-template NAME|FILE") != std::string::npos);
  }
  SUBCASE("--chat-template by name or by file overrides the model's") {
    write_config(dir.path(), {{"chat_template", kLlama2Source}});
    CHECK(chat_template::for_model(dir.path(), "chatml").family() == chat_family::chatml);
    std::ofstream(dir / "t.jinja") << kLlama3Source;
    CHECK(chat_template::for_model(dir.path(), (dir / "t.jinja").string()).family() == chat_family::llama3);
    const std::string e = error_of([&] { chat_template::for_model(dir.path(), "vicuna"); });
    CHECK(e.find("'vicuna' is neither a known template (llama3, llama3.1, chatml, mistral, llama2)") !=
          std::string::npos);
  }
  SUBCASE("a tokenizer_config.json that is not JSON") {
    std::filesystem::create_directories(dir.path());
    std::ofstream(dir / "tokenizer_config.json") << "{\"chat_template\": ";
    CHECK(error_of([&] { chat_template::for_model(dir.path()); }).find("is not valid JSON") != std::string::npos);
  }
}

TEST_CASE("conversations a template cannot render are refused with the reason") {
  const chat_template mistral(chat_family::mistral);
  CHECK(error_of([&] { mistral.render({}); }).find("messages is empty") != std::string::npos);
  CHECK(error_of([&] { mistral.render({{"user", "a"}, {"user", "b"}}); }).find("alternate") != std::string::npos);
  CHECK(error_of([&] { mistral.render({{"assistant", "a"}}); }).find("starting with the user") != std::string::npos);
  CHECK(error_of([&] { chat_template(chat_family::llama2).render({{"user", "a"}, {"system", "s"}}); })
            .find("alternate") != std::string::npos);
  CHECK(error_of([&] { chat_template(chat_family::chatml).render({{"tool", "x"}}); })
            .find("role 'tool'") != std::string::npos);
  // Messages are counted as the request gives them, a first system one included.
  CHECK(error_of([&] { mistral.render({{"system", "s"}, {"user", "a"}, {"user", "b"}}); })
            .find("message 2 has role 'user'") != std::string::npos);
  CHECK(error_of([&] { mistral.render({{"system", "s"}, {"assistant", "a"}}); })
            .find("message 1 has role 'assistant'") != std::string::npos);
  // A system message alone renders no turn: said so, not an empty prompt.
  for (const chat_family f : {chat_family::llama2, chat_family::mistral})
    CHECK(error_of([&] { chat_template(f).render({{"system", "s"}}); }).find("there is no user message") !=
          std::string::npos);
}

TEST_CASE("encoding a conversation puts BOS and EOS as the tokenizer's ids and special tokens as one id") {
  testing::temp_dir_guard dir("chat-encode");
  SUBCASE("SentencePiece (Llama 2): BOS and EOS ids between the text pieces") {
    testing::train_sentencepiece(dir / "tokenizer.model", 128);
    const auto tok = load_tokenizer(dir.path());
    const chat_template t(chat_family::llama2);
    const auto ids = t.encode({{"user", "the cat"}, {"assistant", "a dog"}, {"user", "the end"}}, *tok);
    std::vector<std::int32_t> want{tok->bos_id()};
    const auto append = [&](const std::string& s) {
      const auto part = tok->encode(s, false);
      want.insert(want.end(), part.begin(), part.end());
    };
    // HF splits the rendered text on the special tokens and encodes each
    // stretch between them whole.
    append("[INST] the cat [/INST] a dog ");
    want.push_back(tok->eos_id());
    want.push_back(tok->bos_id());
    append("[INST] the end [/INST]");
    const auto show = [](const std::vector<std::int32_t>& v) {
      std::string s;
      for (auto i : v) s += std::to_string(i) + " ";
      return s;
    };
    CHECK_MESSAGE(ids == want, show(ids) << "vs " << show(want));
  }
  SUBCASE("byte-level BPE (ChatML): <|im_start|> and <|im_end|> are single ids") {
    write_chatml_bpe(dir.path());
    const auto tok = load_tokenizer(dir.path());
    const chat_template t(chat_family::chatml);
    const auto ids = t.encode({{"user", "hi"}}, *tok);
    // <|im_start|> u s e r \n h i <|im_end|> \n <|im_start|> a s s i s t a n t \n
    std::vector<std::int32_t> want{kImStart, 'u', 's', 'e', 'r', kNewline, 'h', 'i', kImEnd, kNewline, kImStart};
    for (char c : std::string("assistant")) want.push_back(c);
    want.push_back(kNewline);
    CHECK(ids == want);
    CHECK(single_token_id(*tok, t.end_of_turn()) == kImEnd);
    CHECK_FALSE(single_token_id(*tok, "hi").has_value());
  }
}
