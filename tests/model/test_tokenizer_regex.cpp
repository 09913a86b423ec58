// Llama 3's and Qwen's tokenizer.json: the pre-tokenizer's own regex (a
// Split, isolated, on ICU), Qwen's NFC normalizer, Llama 3's ignore_merges,
// special tokens. The expected pre-tokens are worked out by hand from the
// regexes' alternatives, tried in order as the regex engine of HF's
// tokenizers library tries them.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/error.hpp"
#include "model/regex_split.hpp"
#include "model/tokenizer.hpp"
#include "tests/model/tokenizer_json.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using json = nlohmann::json;

namespace {

std::vector<std::string> pieces(const regex_split& s, std::string_view text) {
  std::vector<std::string_view> v;
  s.split(text, v);
  return {v.begin(), v.end()};
}

using list = std::vector<std::string>;

/// A tokenizer.json with Llama 3's (or Qwen's) pre-tokenizer: ids 0..255 are
/// the bytes, then "Ġa", "12", "123", "Ġabc" (no merge builds it), and two
/// special tokens.
json regex_tokenizer_json(const std::string& pattern, bool ignore_merges, bool nfc) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<unsigned char>(b))] = b;
  const std::string G = byte_level_char(' ');
  vocab[G + "a"] = 256;
  vocab["12"] = 257;
  vocab["123"] = 258;
  vocab[G + "abc"] = 259;
  return {{"version", "1.0"},
          {"added_tokens",
           {testing::added_token_json(260, "<|begin_of_text|>"), testing::added_token_json(261, "<|eot_id|>")}},
          {"normalizer", nfc ? json{{"type", "NFC"}} : json(nullptr)},
          {"pre_tokenizer", testing::split_pre_tokenizer_json(pattern)},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", testing::bpe_model_json(vocab, {G + " a", "1 2", "12 3"}, ignore_merges)}};
}

std::unique_ptr<tokenizer> write_and_load(const testing::temp_dir_guard& dir, const json& j) {
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return load_tokenizer(dir.path());
}

}  // namespace

TEST_CASE("Llama 3's pre-tokenizer regex splits contractions, letters, digits in threes, punctuation and whitespace runs") {
  const regex_split s(testing::llama3_pattern, "test");
  CHECK(pieces(s, "Hello world's 12345 abc\n\n  def") ==
        list{"Hello", " world", "'s", " ", "123", "45", " abc", "\n\n", " ", " def"});
  CHECK(pieces(s, "I'M here, you'LL see") == list{"I", "'M", " here", ",", " you", "'LL", " see"});
  CHECK(pieces(s, "a+b=c!!\n") == list{"a", "+b", "=c", "!!\n"});
  CHECK(pieces(s, "x  \ty") == list{"x", "  ", "\ty"});
  // Letters and digits of any script: ï and 東京 are \p{L}, Arabic-Indic digits \p{N}.
  CHECK(pieces(s, "naïve 東京 ١٢٣٤") == list{"naïve", " 東京", " ", "١٢٣", "٤"});
  CHECK(pieces(s, "trailing  ") == list{"trailing", "  "});
  CHECK(pieces(s, "").empty());
}

TEST_CASE("Qwen2's pre-tokenizer regex splits digits one at a time") {
  const regex_split s(testing::qwen2_pattern, "test");
  CHECK(pieces(s, "year 2024!") == list{"year", " ", "2", "0", "2", "4", "!"});
  CHECK_THROWS_AS(regex_split("(unclosed", "bad.json"), model_error);
}

TEST_CASE("a pattern that backtracks catastrophically gives up with a clear error instead of hanging") {
  // (a+)+$ on a's followed by a b tries every partition of the a's: 2^40 of them.
  regex_bounds tight;
  tight.base_steps = 50;
  tight.steps_per_kib = 0;
  const regex_split evil("(a+)+$", "evil.json", tight);
  std::vector<std::string_view> out;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(evil.split(std::string(40, 'a') + "b", out),
                       doctest::Contains("the pattern backtracks too much on this input"), model_error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  // The same bounds leave ordinary input alone, and the default bounds a
  // megabyte of text through Llama 3's pattern.
  out.clear();
  evil.split("aaa", out);
  CHECK(out == std::vector<std::string_view>{"aaa"});
  const regex_split llama(testing::llama3_pattern, "test");
  std::string big;
  while (big.size() < (1u << 20)) big += "The quick brown fox's 12345 jumps,\n over  the lazy dog. ";
  out.clear();
  llama.split(big, out);
  std::size_t total = 0;
  for (std::string_view p : out) total += p.size();
  CHECK(total == big.size());
}

TEST_CASE("a Llama 3 tokenizer.json encodes with its regex, ignore_merges and special tokens, and decodes back") {
  testing::temp_dir_guard dir("tok-llama3");
  auto tok = write_and_load(dir, regex_tokenizer_json(testing::llama3_pattern, true, false));
  const std::string text = "<|begin_of_text|>x 1234 abc<|eot_id|>";
  // " " alone, "123" and "4" (digits in threes), " abc" whole: ignore_merges
  // takes a pre-token found in the vocabulary though no merge builds it.
  const std::vector<std::int32_t> want = {260, 'x', ' ', 258, '4', 259, 261};
  CHECK(tok->encode(text, false) == want);
  CHECK(tok->decode(want) == text);
  // Without ignore_merges " abc" is merged by rank: "Ġa" then b, c.
  auto plain = write_and_load(dir, regex_tokenizer_json(testing::llama3_pattern, false, false));
  CHECK(plain->encode(" abc", false) == std::vector<std::int32_t>{256, 'b', 'c'});
  // Any text round-trips, multi-byte characters included.
  for (const std::string s : {"naïve café — 日本語\n\n  x", "it's 3.14159, don't!", "\t\tlead"})
    CHECK(tok->decode(tok->encode(s, false)) == s);
}

TEST_CASE("a Qwen tokenizer.json applies NFC before splitting, and its digits never merge") {
  testing::temp_dir_guard dir("tok-qwen");
  auto tok = write_and_load(dir, regex_tokenizer_json(testing::qwen2_pattern, false, true));
  // e + combining acute becomes é (U+00E9: bytes C3 A9).
  CHECK(tok->encode("e\xcc\x81", false) == std::vector<std::int32_t>{0xc3, 0xa9});
  CHECK(tok->decode(tok->encode("e\xcc\x81", false)) == "\xc3\xa9");
  // "123" is in the vocabulary, but the pre-tokens are single digits.
  CHECK(tok->encode("123", false) == std::vector<std::int32_t>{'1', '2', '3'});
}

TEST_CASE("tokenizer.json pre-tokenizers, normalizers and added-token flags corolla does not run are one clear error") {
  testing::temp_dir_guard dir("tok-regex-bad");
  auto error_of = [&](const json& j) {
    std::ofstream(dir / "tokenizer.json") << j.dump();
    try {
      load_tokenizer(dir.path());
    } catch (const model_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["normalizer"] = {{"type", "NFKC"}};
  CHECK(error_of(j).find("normalizer {\"type\":\"NFKC\"} is not supported (only none or NFC)") != std::string::npos);
  j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  CHECK(error_of(j).find("is not supported (only ByteLevel with GPT-2's pattern, or a Sequence") != std::string::npos);
  j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  CHECK(error_of(j).find("does not compile") != std::string::npos);
  // Added-token flags corolla does not run (lstrip and rstrip it does).
  j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["added_tokens"][0]["single_word"] = true;
  CHECK(error_of(j).find("added token '<|begin_of_text|>' is single_word, which corolla does not support") !=
        std::string::npos);
  j = regex_tokenizer_json(testing::qwen2_pattern, false, true);
  j["added_tokens"].push_back({{"id", 262}, {"content", "e\xcc\x81"}, {"normalized", true}, {"special", false}});
  CHECK(error_of(j).find("is matched on normalized text and NFC changes it") != std::string::npos);
  // A field of the wrong JSON type is an error naming the file, not a bare JSON exception.
  j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}}}}}},
                         {"special_tokens", 7}};
  CHECK(error_of(j).find("tokenizer.json: a field has the wrong JSON type") != std::string::npos);
}

TEST_CASE("a Llama 3 post-processor template prepends <|begin_of_text|>, as HF's tokenizer does") {
  testing::temp_dir_guard dir("tok-llama3-bos");
  json j = regex_tokenizer_json(testing::llama3_pattern, true, false);
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {260}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  auto tok = write_and_load(dir, j);
  CHECK(tok->prepends_bos());
  CHECK(tok->bos_id() == 260);
  CHECK(tok->encode("x", tok->prepends_bos()) == std::vector<std::int32_t>{260, 'x'});
  // Without a template nothing is prepended (Qwen).
  auto plain = write_and_load(dir, regex_tokenizer_json(testing::qwen2_pattern, false, true));
  CHECK_FALSE(plain->prepends_bos());
}
