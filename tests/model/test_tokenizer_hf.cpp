// corolla's tokenizer.json support against HuggingFace's tokenizers library
// itself: its Rust core through the official Node binding (npm
// `tokenizers`, pinned in tests/web/package-lock.json; tests/web/
// hf_tokenize.mjs). Three byte-level BPE tokenizers shaped like Llama 3's,
// Qwen2's and GPT-2's files, with a few hundred merges learned here from a
// multilingual corpus, encode a fixed list of edge cases and 400 random texts
// (letters of several scripts, digits ASCII and not, whitespace runs of every
// kind, punctuation, contractions, emoji, decomposed accents, special and
// non-special added tokens, some taking the whitespace beside them);
// the ids (with and without the special tokens the post-processor adds) and
// the decoded text must be HF's, text for text.
//
// The Node tools are part of the test set-up (scripts/setup.sh runs `npm
// ci` in tests/web); missing, the test fails saying what to install, unless
// COROLLA_SKIP_BROWSER_TESTS=1 (the switch of the other Node-driven test).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/regex_split.hpp"
#include "model/tokenizer.hpp"
#include "tests/model/tokenizer_json.hpp"
#include "tests/support/process.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using json = nlohmann::json;
using testing::added_token_json;
namespace fs = std::filesystem;

namespace {

/// Text the merges are learned from: several scripts, numbers, code.
const char* const kCorpus =
    "The quick brown fox jumps over the lazy dog. It's the 3rd time they've met; we'll see "
    "what the 2024 results say: 12,345 tokens at 99.5% accuracy! Don't forget the swarm's "
    "servers, the pipeline's stages and the tokenizer's merges.\n\n"
    "def forward(self, x):\n    return self.linear(x) + 1\n\tif (a == b) { c = d; }\n"
    "Le café était naïve et déjà très élégant. Ça coûte 3,50 € — n'est-ce pas ?\n"
    "Привет, мир! Как дела? Всё хорошо, спасибо.\n"
    "日本語のテキストと中文文本。東京は大きい都市です。\n"
    "مرحبا بالعالم ١٢٣ and ½ cup, Ⅻ o'clock, ０１２ ...\n"
    "the the the and and of of to to in in is is that that with with for for on on\n"
    "tokenization tokenizer tokens token tokenize detokenize retokenize\n";

/// `byte_level_char` of each byte of `s`, one symbol per byte.
std::vector<std::string> byte_symbols(std::string_view s) {
  std::vector<std::string> out;
  for (unsigned char c : s) out.push_back(byte_level_char(c));
  return out;
}

/// A byte-level BPE vocabulary and merges learned from kCorpus, split with
/// `pattern` (the most frequent pair first; ties by the pair's text, so the
/// result never varies).
struct learned_bpe {
  json vocab = json::object();
  json merges = json::array();
  int next_id = 0;
};

learned_bpe learn(const std::string& pattern, int n_merges) {
  learned_bpe b;
  for (int c = 0; c < 256; ++c) b.vocab[byte_level_char(static_cast<unsigned char>(c))] = b.next_id++;
  const regex_split split(pattern, "corpus");
  std::vector<std::string_view> pieces;
  split.split(kCorpus, pieces);
  std::map<std::string, int> counts;
  for (auto p : pieces) ++counts[std::string(p)];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : counts) words.push_back({byte_symbols(w), n});
  for (int m = 0; m < n_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& [syms, n] : words)
      for (std::size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += n;
    if (pairs.empty()) break;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [l, r] = best->first;
    b.merges.push_back(l + " " + r);
    if (!b.vocab.contains(l + r)) b.vocab[l + r] = b.next_id++;
    for (auto& [syms, n] : words) {
      std::vector<std::string> merged;
      for (std::size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == l && syms[i + 1] == r) {
          merged.push_back(l + r);
          ++i;
        } else {
          merged.push_back(syms[i]);
        }
      }
      syms = std::move(merged);
    }
  }
  return b;
}

/// Llama 3's shape: its regex, ignore_merges, a template that prepends
/// <|begin_of_text|>. Whole pre-tokens no merge builds are in the
/// vocabulary too (ignore_merges takes them as they are).
json llama3_json() {
  learned_bpe b = learn(testing::llama3_pattern, 300);
  // The extra whole-word tokens, spelt in byte-level characters.
  for (const std::string w : {" swarm", " corolla", "ization", "Tokenizer", " quickly"}) {
    std::string spelt;
    for (auto& c : byte_symbols(w)) spelt += c;
    if (!b.vocab.contains(spelt)) b.vocab[spelt] = b.next_id++;
  }
  const int bos = b.next_id, eot = b.next_id + 1;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {added_token_json(bos, "<|begin_of_text|>"), added_token_json(eot, "<|eot_id|>"),
            added_token_json(eot + 1, "<mask>", true, false), added_token_json(eot + 2, "<tool>", false, true, false),
            added_token_json(eot + 3, "<sep>", true, true)}},
          {"normalizer", nullptr},
          {"pre_tokenizer", testing::split_pre_tokenizer_json(testing::llama3_pattern)},
          {"post_processor",
           {{"type", "Sequence"},
            {"processors",
             {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
              {{"type", "TemplateProcessing"},
               {"single",
                {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
               {"pair",
                {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                 {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}},
                 {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
               {"special_tokens",
                {{"<|begin_of_text|>",
                  {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", testing::bpe_model_json(b.vocab, b.merges, true)}};
}

/// Qwen2's shape: NFC, its regex (digits one by one), merges by rank, no
/// template.
json qwen2_json() {
  learned_bpe b = learn(testing::qwen2_pattern, 300);
  const int eot = b.next_id;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {added_token_json(eot, "<|endoftext|>"), added_token_json(eot + 1, "<|im_start|>"),
            added_token_json(eot + 2, "<|im_end|>"), added_token_json(eot + 3, "<tool_call>", false, true, false),
            added_token_json(eot + 4, "<|fim|>", true, false)}},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", testing::split_pre_tokenizer_json(testing::qwen2_pattern)},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"model", testing::bpe_model_json(b.vocab, b.merges, false)}};
}

/// GPT-2's shape: the ByteLevel pre-tokenizer with its own regex.
json gpt2_json() {
  learned_bpe b = learn(testing::gpt2_pattern, 300);
  const int eot = b.next_id;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {added_token_json(eot, "<|endoftext|>")}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", testing::bpe_model_json(b.vocab, b.merges, false)}};
}

/// Edge cases written out, then random texts made of fragments of every
/// kind the pre-tokenizers treat differently.
std::vector<std::string> texts(const std::vector<std::string>& specials, std::uint64_t seed) {
  std::vector<std::string> out = {
      "", " ", "  ", "\n", "\r\n", "a", " a", "  leading", "trailing  ", "a\n\n\nb", "x  \t y", "tab\tsep",
      "it's", "IT'S", "they'Re", "we'LL", "o'clock", "''s", "12345678", "1 22 333 4444", "3.14159",
      "naïve café", "e\xcc\x81", "A\xcc\x8a", "\xe2\x84\xab", "日本語のテキスト", "Привет, мир!",
      "١٢٣ ０１２ Ⅻ ½", "👍🏽 🙂🙂", "— … « » 。、", "a\xc2\xa0" "b", "a\xe3\x80\x80" "b", "\xc2\xa0\xc2\xa0x",
      "The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x\n", " swarm corolla Tokenizer",
      "tokenization quickly", "!!!\n\n", "a  \n  b", "   \n"};
  for (const auto& s : specials) {
    out.push_back(s);
    out.push_back(s + "hello" + s);
    out.push_back(" " + s + " x");
    out.push_back("a \t\n " + s + " \n\xc2\xa0" "b");
    out.push_back(s + "  " + s + "  ");
  }
  const std::vector<std::string> words = {"the", "The", "quick", "fox", "tokenizer", "tokenization", "swarm",
                                          "corolla", "café", "déjà", "naïve", "мир", "Привет", "東京", "中文",
                                          "テキスト", "مرحبا", "quickly", "élégant", "x", "Q", "return"};
  const std::vector<std::string> spaces = {" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t \t",
                                           "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\x83", "\n   ", "\x0b", "\x0c",
                                           "\x1c", "\xc2\x85", "\xe2\x80\xa8", "\xe2\x80\x8b"};
  const std::vector<std::string> punct = {".", ",", "!?", "...", "—", "…", "«", "»", "。", "、", "(", ")",
                                          "\"", "'", "-", "$", "%", "@#", "{}", "==", "::", "€", "\xe2\x80\x99"};
  const std::vector<std::string> contractions = {"'s", "'t", "'re", "'VE", "'M", "'ll", "'D", "'x", "'S"};
  const std::vector<std::string> other = {"e\xcc\x81", "A\xcc\x8a", "\xe2\x84\xab", "🙂", "👍🏽", "١٢٣",
                                          "１２３", "Ⅻ", "½", "ﬁ", "\xef\xbc\x8c", "ß", "İ"};
  std::mt19937_64 rng(seed);
  auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  for (int t = 0; t < 400; ++t) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 14);
    for (int f = 0; f < n; ++f) {
      switch (rng() % 8) {
        case 0: s += pick(words); break;
        case 1: s.append(" ").append(pick(words)); break;
        case 2: s += std::to_string(rng() % 100000000 >> (rng() % 24)); break;
        case 3: s += pick(spaces); break;
        case 4: s += pick(punct); break;
        case 5: s += pick(contractions); break;
        case 6: s += pick(other); break;
        default: s += specials.empty() || rng() % 3 ? pick(words) : pick(specials); break;
      }
    }
    out.push_back(s);
  }
  return out;
}

/// Why the HF cross-check cannot run here ("" when it can).
std::string missing_node_tools(const fs::path& web) {
  if (!fs::exists("/usr/bin/node")) return "node (apt-get install nodejs)";
  if (!fs::exists(web / "node_modules" / "tokenizers")) return "tokenizers (cd tests/web && npm ci)";
  return "";
}

/// Encodes and decodes every text with corolla and with HF, and compares.
void check_against_hf(const std::string& name, const json& tokenizer_json, const std::vector<std::string>& specials) {
  const fs::path web = fs::path(COROLLA_SOURCE_DIR) / "tests" / "web";
  if (const std::string missing = missing_node_tools(web); !missing.empty()) {
    const char* skip = std::getenv("COROLLA_SKIP_BROWSER_TESTS");
    if (skip && std::string(skip) == "1") {
      MESSAGE("skipped: no " << missing);
      return;
    }
    FAIL("the HF tokenizers cross-check needs " << missing << " (or set COROLLA_SKIP_BROWSER_TESTS=1)");
  }
  testing::temp_dir_guard dir("tok-hf-" + name);
  std::ofstream(dir / "tokenizer.json") << tokenizer_json.dump();
  const std::vector<std::string> cases = texts(specials, 0x70c0 + name.size());
  std::ofstream(dir / "texts.json") << json(cases).dump();
  const testing::process_result r = testing::run_process(
      "/usr/bin/node",
      {(web / "hf_tokenize.mjs").string(), (dir / "tokenizer.json").string(), (dir / "texts.json").string()},
      std::chrono::seconds(120));
  INFO("node stderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  const json hf = json::parse(r.out);
  REQUIRE(hf["plain"].size() == cases.size());

  const auto tok = load_tokenizer(dir.path());
  int same = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::vector<std::int32_t> plain = tok->encode(cases[i], false);
    const std::vector<std::int32_t> special = tok->encode(cases[i], tok->prepends_bos());
    const auto want_plain = hf["plain"][i].get<std::vector<std::int32_t>>();
    const auto want_special = hf["special"][i].get<std::vector<std::int32_t>>();
    INFO(name << " text " << i << ": " << json(cases[i]).dump());
    CHECK(plain == want_plain);
    CHECK(special == want_special);
    CHECK(tok->decode(want_plain) == hf["decoded"][i].get<std::string>());
    same += plain == want_plain && special == want_special;
  }
  MESSAGE(name << ": " << same << " of " << cases.size() << " texts encode as HF's tokenizers does");
}

}  // namespace

TEST_CASE("a Llama 3 tokenizer.json encodes and decodes as HF's tokenizers library does") {
  check_against_hf("llama3", llama3_json(), {"<|begin_of_text|>", "<|eot_id|>", "<mask>", "<tool>", "<sep>"});
}

TEST_CASE("a Qwen2 tokenizer.json encodes and decodes as HF's tokenizers library does") {
  check_against_hf("qwen2", qwen2_json(), {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<|fim|>"});
}

TEST_CASE("a GPT-2 tokenizer.json encodes and decodes as HF's tokenizers library does") {
  check_against_hf("gpt2", gpt2_json(), {"<|endoftext|>"});
}
