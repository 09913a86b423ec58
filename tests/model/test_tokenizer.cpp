// Tests for model/tokenizer: SentencePiece (trained here) and byte-level BPE
// (hand-written tokenizer.json and vocab.json + merges.txt) round trips,
// known merges, GPT-2 pre-tokenisation, streaming decode and errors.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.hpp"
#include "model/error.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kRoundTrip = {
    "Hello, World!",
    "the quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789 and 3.14159, 1,000,000!",
    "Punctuation: \"quoted\" (paren) [bracket] {brace} <angle> a+b=c; x|y \\ / ~ ` @ # $ % ^ & * _ -",
    "it's, we'll, they've, I'm, you'd, don't",
    "whitespace  runs   of    spaces",
    " leading space",
    "two\nlines\n\nand a blank one\n",
    "trailing spaces  ",
    "naïve café — 日本語",
    "a naïve señor über straße …",
    "",
};

/// GPT-2's bytes_to_unicode, written out independently of the tokenizer's.
std::vector<std::string> byte_chars() {
  std::vector<int> bs, cs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xa1; b <= 0xac; ++b) bs.push_back(b);
  for (int b = 0xae; b <= 0xff; ++b) bs.push_back(b);
  cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  std::vector<std::string> out(256);
  for (std::size_t i = 0; i < bs.size(); ++i) {
    int cp = cs[i];
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    out[static_cast<std::size_t>(bs[i])] = s;
  }
  return out;
}

/// A small byte-level BPE: ids 0..255 are the bytes (id == byte value),
/// then merges building " hello" and "ll", then <|endoftext|>.
struct tiny_bpe {
  json vocab = json::object();
  std::vector<std::pair<std::string, std::string>> merges;
  static constexpr int eot = 263;

  tiny_bpe() {
    auto chars = byte_chars();
    for (int b = 0; b < 256; ++b) vocab[chars[static_cast<std::size_t>(b)]] = b;
    const std::string G = chars[' '];  // "Ġ"
    auto merge = [&](const std::string& a, const std::string& b, int id) {
      merges.emplace_back(a, b);
      vocab[a + b] = id;
    };
    merge("l", "l", 256);
    merge(G, "h", 257);
    merge(G + "h", "e", 258);
    merge(G + "he", "ll", 259);
    merge(G + "hell", "o", 260);
    merge("w", "o", 261);
    merge("wo", "r", 262);
    vocab["<|endoftext|>"] = eot;
  }

  json tokenizer_json(bool pair_merges) const {
    json m = json::array();
    for (const auto& [a, b] : merges) {
      if (pair_merges) m.push_back({a, b});
      else m.push_back(a + " " + b);
    }
    return {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}, {"lstrip", false},
           {"rstrip", false}, {"normalized", true}, {"single_word", false}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
          {"use_regex", true}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
        {"model",
         {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
          {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""},
          {"fuse_unk", false}, {"vocab", vocab}, {"merges", m}}}};
  }

  void write_vocab_merges(const fs::path& dir) const {
    std::ofstream(dir / "vocab.json") << vocab.dump();
    std::ofstream out(dir / "merges.txt");
    out << "#version: 0.2\n";
    for (const auto& [a, b] : merges) out << a << " " << b << "\n";
  }
};

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += n;
  }
  return true;
}

/// Streams `ids` through a stream_decoder; checks no chunk splits a
/// character and returns the concatenation.
std::string stream(const tokenizer& tok, const std::vector<std::int32_t>& ids) {
  stream_decoder sd(tok);
  std::string all;
  for (auto id : ids) {
    std::string part = sd.push(id);
    CHECK(valid_utf8(part));
    all += part;
  }
  all += sd.flush();
  return all;
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (auto v : gpt2_pretokenize(text)) out.emplace_back(v);
  return out;
}

}  // namespace

TEST_CASE("sentencepiece tokenizer trained by the fixture round-trips text") {
  testing::temp_dir_guard dir("tok-sp");
  testing::tiny_model_options o;
  o.vocab = 256;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(dir.path(), o);
  CHECK_FALSE(fs::exists(dir / "tokenizer-corpus.txt"));

  auto tok = load_tokenizer(dir.path());
  CHECK(tok->vocab_size() == 256);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  model_config c = load_config(dir.path());
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_id == 2);

  for (const auto& text : kRoundTrip) {
    CAPTURE(text);
    auto ids = tok->encode(text, false);
    for (auto id : ids) {
      CHECK(id >= 0);
      CHECK(id < 256);
      CHECK(id != 0);  // nothing unknown
    }
    CHECK(tok->decode(ids) == text);
    auto with_bos = tok->encode(text, true);
    REQUIRE(with_bos.size() == ids.size() + 1);
    CHECK(with_bos[0] == 1);
    CHECK(tok->decode(with_bos) == text);  // control tokens decode to nothing
    CHECK(stream(*tok, with_bos) == text);
  }
  // Merges are learned: common words take fewer tokens than characters.
  CHECK(tok->encode("the the the the", false).size() < 15);
  CHECK_THROWS_AS(tok->decode(std::vector<std::int32_t>{256}), model_error);
  CHECK_THROWS_AS(tok->decode(std::vector<std::int32_t>{-1}), model_error);
}

TEST_CASE("small sentencepiece vocabularies work and too small ones are refused") {
  testing::temp_dir_guard dir("tok-sp-small");
  testing::train_sentencepiece(dir / "tokenizer.model", 64, 3);
  auto tok = load_sentencepiece(dir / "tokenizer.model");
  CHECK(tok->vocab_size() == 64);
  const std::string text = "the quick brown fox jumps over the lazy dog, then sleeps.";
  CHECK(tok->decode(tok->encode(text, true)) == text);

  std::string e;
  try {
    testing::train_sentencepiece(dir / "tiny.model", 20, 3);
  } catch (const std::runtime_error& x) {
    e = x.what();
  }
  CHECK(e.find("cannot train a SentencePiece tokenizer with vocab_size 20") != std::string::npos);
}

TEST_CASE("gpt2 pre-tokenisation splits like the reference regex") {
  using v = std::vector<std::string>;
  CHECK(split("Hello world") == v{"Hello", " world"});
  CHECK(split("it's 42 apples!!") == v{"it", "'s", " 42", " apples", "!!"});
  CHECK(split("I'll don't we've they're I'm he'd") ==
        v{"I", "'ll", " don", "'t", " we", "'ve", " they", "'re", " I", "'m", " he", "'d"});
  CHECK(split("a  b") == v{"a", " ", " b"});
  CHECK(split("x\n\ny") == v{"x", "\n", "\n", "y"});
  CHECK(split("x \n y") == v{"x", " \n", " y"});
  CHECK(split("end   ") == v{"end", "   "});
  CHECK(split("3.14") == v{"3", ".", "14"});
  CHECK(split(" ?! 'quote'") == v{" ?!", " '", "quote", "'"});
  CHECK(split("abc123def") == v{"abc", "123", "def"});
  CHECK(split("naïve café 日本") == v{"naïve", " café", " 日本"});
  CHECK(split("\tx") == v{"\t", "x"});
  CHECK(split("") == v{});
}

TEST_CASE("byte-level BPE from tokenizer.json applies merges by rank") {
  testing::temp_dir_guard dir("tok-bpe");
  tiny_bpe b;
  std::ofstream(dir / "tokenizer.json") << b.tokenizer_json(false).dump();
  auto tok = load_tokenizer(dir.path());
  CHECK(tok->vocab_size() == 264);
  CHECK(tok->bos_id() == tiny_bpe::eot);
  CHECK(tok->eos_id() == tiny_bpe::eot);

  using ids = std::vector<std::int32_t>;
  CHECK(tok->encode(" hello", false) == ids{260});
  // Without the leading space only "ll" merges.
  CHECK(tok->encode("hello", false) == ids{'h', 'e', 256, 'o'});
  CHECK(tok->encode("hello hello world", false) ==
        ids{'h', 'e', 256, 'o', 260, ' ', 262, 'l', 'd'});
  // Special tokens are matched before pre-tokenisation and decode verbatim.
  CHECK(tok->encode("hi<|endoftext|> hello", false) == ids{'h', 'i', tiny_bpe::eot, 260});
  CHECK(tok->encode(" hello", true) == ids{tiny_bpe::eot, 260});
  CHECK(tok->decode(ids{'h', 'i', tiny_bpe::eot, 260}) == "hi<|endoftext|> hello");
  // Non-ASCII goes through bytes.
  CHECK(tok->encode("é", false) == ids{0xc3, 0xa9});

  // The [a, b] merge form of newer tokenizer.json files gives the same.
  std::ofstream(dir / "tokenizer.json") << b.tokenizer_json(true).dump();
  CHECK(load_tokenizer(dir.path())->encode("hello hello", false) == ids{'h', 'e', 256, 'o', 260});
}

TEST_CASE("byte-level BPE round-trips any text and vocab.json + merges.txt agrees") {
  testing::temp_dir_guard json_dir("tok-bpe-json"), vm_dir("tok-bpe-vm");
  tiny_bpe b;
  std::ofstream(json_dir / "tokenizer.json") << b.tokenizer_json(false).dump();
  b.write_vocab_merges(vm_dir.path());
  auto a = load_tokenizer(json_dir.path());
  auto v = load_tokenizer(vm_dir.path());
  CHECK(v->vocab_size() == 264);
  CHECK(v->eos_id() == tiny_bpe::eot);

  std::vector<std::string> texts = kRoundTrip;
  texts.push_back("tabs\tand\nnew\r\nlines\n\n  \n");
  texts.push_back("hello<|endoftext|>world<|endoftext|>");
  texts.push_back(std::string("bytes \x01\x7f\xff\xfe not utf8"));
  for (const auto& text : texts) {
    CAPTURE(text);
    auto ids = a->encode(text, false);
    CHECK(ids == v->encode(text, false));
    CHECK(a->decode(ids) == text);
    if (valid_utf8(text)) CHECK(stream(*a, ids) == text);
  }
  CHECK_THROWS_AS(a->decode(std::vector<std::int32_t>{264}), model_error);
}

TEST_CASE("stream decoder never splits characters and equals the full decode") {
  testing::temp_dir_guard dir("tok-stream");
  tiny_bpe b;
  std::ofstream(dir / "tokenizer.json") << b.tokenizer_json(false).dump();
  auto tok = load_tokenizer(dir.path());
  // Every byte of the multi-byte characters is its own token here.
  const std::string text = "日本語 naïve — hello hello 🙂 world, café ünïcödé 日本語 end";
  auto ids = tok->encode(text, false);
  CHECK(ids.size() > 40);  // long enough to slide the decoder's context window

  stream_decoder sd(*tok);
  CHECK(sd.push(0xe6).empty());  // first byte of 日: held back
  CHECK(sd.push(0x97).empty());
  CHECK(sd.push(0xa5) == "日");
  CHECK(sd.flush().empty());
  CHECK(sd.push(0xe6).empty());
  CHECK(sd.flush() == "\xe6");  // flush hands over an incomplete tail as is
  CHECK_THROWS_AS(sd.push(9999), model_error);
  CHECK(sd.push('o') == "o");  // the bad id was not kept
  CHECK(sd.flush().empty());

  CHECK(stream(*tok, ids) == text);
  CHECK(stream(*tok, ids) == tok->decode(ids));
}

TEST_CASE("missing or unsupported tokenizers give clear errors") {
  testing::temp_dir_guard dir("tok-missing");
  std::string e;
  try {
    load_tokenizer(dir.path());
  } catch (const model_error& x) {
    e = x.what();
  }
  CHECK(e == "no tokenizer in " + dir.path().string() +
                 " (looked for tokenizer.model, tokenizer.json, and vocab.json + merges.txt)");
  CHECK_THROWS_AS(load_tokenizer(dir / "absent"), model_error);

  tiny_bpe b;
  json j = b.tokenizer_json(false);
  j["model"]["type"] = "WordPiece";
  std::ofstream(dir / "tokenizer.json") << j.dump();
  e.clear();
  try {
    load_tokenizer(dir.path());
  } catch (const model_error& x) {
    e = x.what();
  }
  CHECK(e.find("WordPiece") != std::string::npos);
  CHECK(e.find("tokenizer.json") != std::string::npos);

  j = b.tokenizer_json(false);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  std::ofstream(dir / "tokenizer.json") << j.dump();
  CHECK_THROWS_AS(load_tokenizer(dir.path()), model_error);

  std::ofstream(dir / "tokenizer.json") << "{\"model\": ";
  CHECK_THROWS_AS(load_tokenizer(dir.path()), model_error);

  std::ofstream(dir / "tokenizer.model") << "not a sentencepiece model";
  e.clear();
  try {
    load_tokenizer(dir.path());
  } catch (const model_error& x) {
    e = x.what();
  }
  CHECK(e.find("cannot load SentencePiece model") != std::string::npos);
}

TEST_CASE("config.json bos and eos override the tokenizer's own") {
  testing::temp_dir_guard dir("tok-config");
  tiny_bpe b;
  std::ofstream(dir / "tokenizer.json") << b.tokenizer_json(false).dump();
  std::ofstream(dir / "config.json") << R"({"bos_token_id": 5, "eos_token_id": [7, 8]})";
  auto tok = load_tokenizer(dir.path());
  CHECK(tok->bos_id() == 5);
  CHECK(tok->eos_id() == 7);
}
