// model/bpe_tokenizer.cpp — byte-level BPE (tokenizer.json, or vocab.json +
// merges.txt): GPT-2's, and Llama 3's and Qwen's (a Split on the file's own
// regex before the byte-level mapping, NFC for Qwen, ignore_merges for
// Llama 3).
//
// Encoding: split on added (special) tokens; normalise each piece (NFC,
// when the file says so); pre-tokenise it with the file's regex
// (model/regex_split.hpp, on ICU) or GPT-2's pattern (by hand, with ICU's
// character properties);
// map each pre-token's bytes to GPT-2's printable "byte-level" characters;
// apply merges lowest rank first; look the symbols up in the vocabulary.
// Decoding maps each token back to its bytes.
#include <algorithm>
#include <array>
#include <climits>
#include <fstream>
#include <mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include "model/added_tokens.hpp"
#include "model/error.hpp"
#include "model/json_file.hpp"
#include "model/regex_split.hpp"
#include "model/tokenizer.hpp"

namespace corolla {
namespace {

using json = nlohmann::json;

// ---- bytes <-> printable characters ---------------------------------------------

std::string utf8_encode(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

/// Decodes the code point at s[i]; sets `len` to its byte length. Returns
/// false (len = 1) for a byte that does not start a well-formed character.
bool utf8_decode(std::string_view s, std::size_t i, std::uint32_t& cp, std::size_t& len) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  len = 1;
  if (c < 0x80) {
    cp = c;
    return true;
  }
  std::size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return false;
  std::uint32_t v = n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return false;
    v = (v << 6) | (b(i + k) & 0x3f);
  }
  cp = v;
  len = n;
  return true;
}

/// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest
/// to U+0100 onwards, so every byte is a visible character in vocab files.
struct byte_table {
  std::array<std::string, 256> to_text;
  std::unordered_map<std::uint32_t, unsigned char> to_byte;

  byte_table() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : 256u + extra++;
      to_text[b] = utf8_encode(cp);
      to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};

const byte_table& bytes() {
  static const byte_table t;
  return t;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) { return bytes().to_text[b]; }

namespace {

// ---- pre-tokenisation -------------------------------------------------------------

enum class char_class : std::uint8_t { letter, number, space, other };

/// GPT-2's classes of a code point: \p{L}, \p{N}, \s (Unicode White_Space)
/// as the regex engine of HF's tokenizers reads them; ASCII without a call.
char_class classify(std::uint32_t cp, bool valid) {
  if (!valid) return char_class::other;
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return char_class::letter;
    if (cp >= '0' && cp <= '9') return char_class::number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return char_class::space;
    return char_class::other;
  }
  const auto c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return char_class::space;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return char_class::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return char_class::number;
    default:
      return char_class::other;
  }
}

struct code_point {
  std::uint32_t cp;
  std::size_t offset;  ///< byte offset in the text
  char_class cls;
};

/// Splits `text` like GPT-2's regex
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// (alternatives tried in order at each position, as a regex engine does).
void pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  std::vector<code_point> cps;
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    std::size_t len = 1;
    bool ok = utf8_decode(text, i, cp, len);
    cps.push_back({ok ? cp : 0xfffd, i, classify(cp, ok)});
    i += len;
  }
  const std::size_t n = cps.size();
  auto emit = [&](std::size_t from, std::size_t to) {
    std::size_t b = cps[from].offset, e = to < n ? cps[to].offset : text.size();
    out.push_back(text.substr(b, e - b));
  };
  std::size_t i = 0;
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (cps[i].cp == '\'' && i + 1 < n) {
      std::uint32_t a = cps[i + 1].cp, b = i + 2 < n ? cps[i + 2].cp : 0;
      std::size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
    std::size_t k = (cps[i].cp == ' ' && i + 1 < n && cps[i + 1].cls != char_class::space) ? i + 1 : i;
    if (cps[k].cls != char_class::space) {
      std::size_t j = k;
      while (j < n && cps[j].cls == cps[k].cls) ++j;
      emit(i, j);
      i = j;
      continue;
    }
    // `\s+(?!\S)` leaves the last whitespace character of a run to the
    // word after it; `\s+` takes a lone one.
    std::size_t j = i;
    while (j < n && cps[j].cls == char_class::space) ++j;
    if (j < n && j - i >= 2) --j;
    emit(i, j);
    i = j;
  }
}

// ---- the tokenizer ----------------------------------------------------------------

struct bpe_spec {
  std::string origin;  ///< file name(s) for messages
  std::unordered_map<std::string, int> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<added_token> added;
  bool add_prefix_space = false;
  std::shared_ptr<const regex_split> split;  ///< the file's Split regex (null: GPT-2's pattern)
  bool nfc = false;                          ///< NFC normalizer
  bool ignore_merges = false;                ///< a pre-token in the vocabulary is one token (Llama 3)
  int bos = -1;
  int eos = -1;
  /// The special token the post-processor's template puts in front of
  /// every text (Llama 3's <|begin_of_text|>), or -1.
  int template_bos = -1;
};

class bpe_tokenizer final : public tokenizer {
 public:
  explicit bpe_tokenizer(bpe_spec spec)
      : origin_(std::move(spec.origin)), vocab_(std::move(spec.vocab)),
        add_prefix_space_(spec.add_prefix_space), split_(std::move(spec.split)), nfc_(spec.nfc),
        ignore_merges_(spec.ignore_merges) {
    for (std::size_t r = 0; r < spec.merges.size(); ++r)
      merge_rank_.emplace(spec.merges[r].first + " " + spec.merges[r].second, static_cast<int>(r));
    int max_id = -1;
    for (const auto& [tok, id] : vocab_) {
      if (id < 0) throw model_error(origin_ + ": token '" + tok + "' has negative id");
      max_id = std::max(max_id, id);
    }
    for (const added_token& a : spec.added) {
      if (a.id < 0 || a.content.empty())
        throw model_error(origin_ + ": invalid added token '" + a.content + "'");
      max_id = std::max(max_id, a.id);
    }
    vocab_size_ = max_id + 1;
    decoded_.assign(static_cast<std::size_t>(vocab_size_), std::string());
    present_.assign(static_cast<std::size_t>(vocab_size_), false);
    const auto& table = bytes();
    for (const auto& [tok, id] : vocab_) {
      std::string raw;
      for (std::size_t i = 0; i < tok.size();) {
        std::uint32_t cp = 0;
        std::size_t len = 1;
        bool ok = utf8_decode(tok, i, cp, len);
        auto it = ok ? table.to_byte.find(cp) : table.to_byte.end();
        if (it != table.to_byte.end()) raw += static_cast<char>(it->second);
        else raw.append(tok, i, len);  // not a byte-level character: keep as written
        i += len;
      }
      decoded_[static_cast<std::size_t>(id)] = std::move(raw);
      present_[static_cast<std::size_t>(id)] = true;
    }
    for (const added_token& a : spec.added) {
      decoded_[static_cast<std::size_t>(a.id)] = a.content;
      present_[static_cast<std::size_t>(a.id)] = true;
    }
    added_ = added_token_matcher(std::move(spec.added));
    const int eot = added_.id_of("<|endoftext|>");
    bos_ = spec.bos >= 0 ? spec.bos : spec.template_bos >= 0 ? spec.template_bos : eot >= 0 ? eot : added_.id_of("<s>");
    prepends_bos_ = spec.template_bos >= 0;
    eos_ = spec.eos >= 0 ? spec.eos : eot >= 0 ? eot : added_.id_of("</s>");
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<std::int32_t> out;
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    std::string prefixed;
    if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    std::vector<std::string_view> words;
    std::size_t segment = 0;
    auto flush_segment = [&](std::size_t end) {
      if (end <= segment) return;
      words.clear();
      std::string_view piece = text.substr(segment, end - segment);
      std::string normal;
      if (nfc_) piece = normal = nfc(piece);
      if (split_) split_->split(piece, words);
      else pretokenize(piece, words);
      for (auto w : words) encode_word(w, out);
    };
    while (const auto hit = added_.next(text, segment)) {
      flush_segment(hit->begin);
      out.push_back(hit->id);
      segment = hit->end;
    }
    flush_segment(text.size());
    return out;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::int32_t id = ids[i];
      if (id < 0 || id >= vocab_size_ || !present_[static_cast<std::size_t>(id)])
        throw model_error("token id " + std::to_string(id) + " (position " + std::to_string(i) +
                          ") is not in the vocabulary of " + origin_ + " (size " +
                          std::to_string(vocab_size_) + ")");
      out += decoded_[static_cast<std::size_t>(id)];
    }
    return out;
  }

  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool prepends_bos() const override { return prepends_bos_; }

 private:
  /// BPE of one pre-token, through a cache (words repeat a lot in text).
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
    std::string key(word);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const auto& table = bytes();
    if (ignore_merges_) {
      std::string whole;
      for (unsigned char b : word) whole += table.to_text[b];
      if (auto it = vocab_.find(whole); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<std::string> syms;
    syms.reserve(word.size());
    for (unsigned char b : word) syms.push_back(table.to_text[b]);
    // Merge the lowest-ranked adjacent pair (all its occurrences) until no
    // pair has a merge rule.
    while (syms.size() > 1) {
      int best = INT_MAX;
      std::size_t at = 0;
      for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
        auto it = merge_rank_.find(syms[i] + " " + syms[i + 1]);
        if (it != merge_rank_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best == INT_MAX) break;
      const std::string a = syms[at], b = syms[at + 1];
      std::vector<std::string> merged;
      merged.reserve(syms.size());
      for (std::size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          merged.push_back(a + b);
          i += 2;
        } else {
          merged.push_back(std::move(syms[i]));
          ++i;
        }
      }
      syms = std::move(merged);
    }
    std::vector<std::int32_t> ids;
    ids.reserve(syms.size());
    for (const auto& s : syms) {
      auto it = vocab_.find(s);
      if (it == vocab_.end())
        throw model_error("cannot encode '" + key + "': " + origin_ + " has no token '" + s + "'");
      ids.push_back(it->second);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() > 100000) cache_.clear();  // bound memory on huge inputs
    cache_.emplace(std::move(key), std::move(ids));
  }

  std::string origin_;
  std::unordered_map<std::string, int> vocab_;  ///< byte-level text -> id
  std::unordered_map<std::string, int> merge_rank_;  ///< "a b" -> rank
  added_token_matcher added_;
  std::vector<std::string> decoded_;  ///< id -> bytes
  std::vector<bool> present_;
  int vocab_size_ = 0;
  int bos_ = -1;
  int eos_ = -1;
  bool add_prefix_space_ = false;
  std::shared_ptr<const regex_split> split_;
  bool nfc_ = false;
  bool ignore_merges_ = false;
  bool prepends_bos_ = false;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

// ---- loading ----------------------------------------------------------------------

json read_json(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw model_error("tokenizer file " + file.string() + " does not exist");
  return read_json_file(file);
}

std::unordered_map<std::string, int> read_vocab(const json& v, const std::string& where) {
  if (!v.is_object()) throw model_error(where + ": the vocabulary is not a JSON object");
  std::unordered_map<std::string, int> vocab;
  for (const auto& [tok, id] : v.items()) {
    if (!id.is_number_integer() || id.get<long long>() < 0 || id.get<long long>() > INT_MAX)
      throw model_error(where + ": token '" + tok + "' has invalid id " + id.dump());
    vocab.emplace(tok, id.get<int>());
  }
  return vocab;
}

/// "a b" -> {a, b}; throws naming the merge otherwise.
std::pair<std::string, std::string> split_merge(const std::string& line, const std::string& where) {
  auto sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string::npos)
    throw model_error(where + ": malformed merge '" + line + "'");
  return {line.substr(0, sp), line.substr(sp + 1)};
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  pretokenize(text, out);
  return out;
}

namespace {

/// load_bpe_json's work; a field of the wrong JSON type throws
/// json::exception, which load_bpe_json names the file in.
std::unique_ptr<tokenizer> bpe_of_json(const json& j, const std::string& where, int bos_id, int eos_id) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw model_error(where + " has no \"model\" section");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE")
    throw model_error(where + ": tokenizer model type '" + type +
                      "' is not supported (only byte-level BPE)");
  auto null_or_empty = [&](const char* key) {
    return !m.contains(key) || m[key].is_null() || (m[key].is_string() && m[key].get<std::string>().empty()) ||
           (m[key].is_boolean() && !m[key].get<bool>());
  };
  if (!null_or_empty("continuing_subword_prefix") || !null_or_empty("end_of_word_suffix") ||
      !null_or_empty("byte_fallback"))
    throw model_error(where + ": BPE with subword prefixes/suffixes or byte fallback is not "
                      "supported (only GPT-2 style byte-level BPE)");
  bpe_spec spec;
  const json norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    if (!norm.is_object() || norm.value("type", std::string()) != "NFC")
      throw model_error(where + ": normalizer " + norm.dump() + " is not supported (only none or NFC)");
    spec.nfc = true;
  }
  // ByteLevel with GPT-2's pattern, or (Llama 3, Qwen) a Sequence of an
  // isolating Split on a regex and a ByteLevel that splits no further.
  const json pre = j.value("pre_tokenizer", json());
  auto type_of = [](const json& o) { return o.is_object() ? o.value("type", std::string()) : std::string(); };
  const std::string unsupported = where + ": pre_tokenizer " + pre.dump() +
                                  " is not supported (only ByteLevel with GPT-2's pattern, or a Sequence of an "
                                  "isolating Split on a regex and a ByteLevel without use_regex)";
  json byte_level = pre;
  if (type_of(pre) == "Sequence") {
    const json steps = pre.value("pretokenizers", json());
    if (!steps.is_array() || steps.size() != 2 || type_of(steps[0]) != "Split" || type_of(steps[1]) != "ByteLevel")
      throw model_error(unsupported);
    const json& s = steps[0];
    const json pattern = s.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string() ||
        s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
      throw model_error(unsupported);
    byte_level = steps[1];
    if (byte_level.value("use_regex", true)) throw model_error(unsupported);
    spec.split = std::make_shared<const regex_split>(pattern["Regex"].get<std::string>(), where);
  } else if (type_of(pre) != "ByteLevel" || !pre.value("use_regex", true)) {
    throw model_error(unsupported);
  }
  const json dec = j.value("decoder", json());
  if (!dec.is_null() && (!dec.is_object() || dec.value("type", std::string()) != "ByteLevel"))
    throw model_error(where + ": decoder " + dec.dump() + " is not supported (only ByteLevel)");

  spec.origin = where;
  spec.add_prefix_space = byte_level.value("add_prefix_space", false);
  spec.ignore_merges = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>();
  spec.vocab = read_vocab(m.value("vocab", json()), where);
  const json merges = m.value("merges", json::array());
  if (!merges.is_array()) throw model_error(where + ": \"merges\" is not a list");
  for (const auto& e : merges) {
    if (e.is_string()) {
      spec.merges.push_back(split_merge(e.get<std::string>(), where));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      throw model_error(where + ": malformed merge " + e.dump());
    }
  }
  spec.added = read_added_tokens(j, where, spec.nfc);
  spec.bos = bos_id;
  spec.eos = eos_id;
  // HF's post-processor: a TemplateProcessing (alone or in a Sequence)
  // whose single-text template starts with a special token prepends it
  // (Llama 3: <|begin_of_text|>); anything else adds nothing.
  const json post = j.value("post_processor", json());
  std::vector<json> processors;
  if (type_of(post) == "Sequence" && post.value("processors", json()).is_array())
    for (const json& p : post["processors"]) processors.push_back(p);
  else if (post.is_object())
    processors.push_back(post);
  for (const json& p : processors) {
    if (type_of(p) != "TemplateProcessing") continue;
    const json single = p.value("single", json());
    if (!single.is_array() || single.empty() || !single[0].is_object() || !single[0].contains("SpecialToken")) continue;
    const std::string name = single[0]["SpecialToken"].value("id", std::string());
    const json ids = p.value("special_tokens", json()).value(name, json()).value("ids", json());
    if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer())
      throw model_error(where + ": the post-processor's template names special token '" + name +
                        "' without exactly one id");
    spec.template_bos = ids[0].get<int>();
  }
  return std::make_unique<bpe_tokenizer>(std::move(spec));
}

}  // namespace

std::unique_ptr<tokenizer> load_bpe_json(const std::filesystem::path& file, int bos_id, int eos_id) {
  const json j = read_json(file);
  try {
    return bpe_of_json(j, file.string(), bos_id, eos_id);
  } catch (const json::exception& e) {
    throw model_error(file.string() + ": a field has the wrong JSON type (" + e.what() + ")");
  }
}

std::unique_ptr<tokenizer> load_bpe_vocab_merges(const std::filesystem::path& vocab,
                                                 const std::filesystem::path& merges, int bos_id,
                                                 int eos_id) {
  bpe_spec spec;
  spec.origin = vocab.string() + " + " + merges.filename().string();
  spec.vocab = read_vocab(read_json(vocab), vocab.string());
  std::error_code ec;
  if (!std::filesystem::is_regular_file(merges, ec))
    throw model_error("tokenizer file " + merges.string() + " does not exist");
  std::ifstream in(merges, std::ios::binary);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (first && line.rfind("#version", 0) == 0) {
      first = false;
      continue;
    }
    first = false;
    if (line.empty()) continue;
    spec.merges.push_back(split_merge(line, merges.string()));
  }
  if (in.bad()) throw model_error("cannot read " + merges.string());
  // GPT-2 keeps its one special token in the vocabulary itself.
  auto eot = spec.vocab.find("<|endoftext|>");
  if (eot != spec.vocab.end()) spec.added.push_back({eot->first, eot->second});
  spec.bos = bos_id;
  spec.eos = eos_id;
  return std::make_unique<bpe_tokenizer>(std::move(spec));
}

}  // namespace corolla
