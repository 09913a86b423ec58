// model/tokenizer.cpp — the tokenizer interface, streaming decode and
// finding a model directory's tokenizer.
#include "model/tokenizer.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/error.hpp"

namespace corolla {

tokenizer::~tokenizer() = default;

// ---- stream_decoder -------------------------------------------------------------

namespace {

/// Ids kept as left context once everything decoded so far is out. Decoding
/// a short window instead of the whole history keeps push() O(1) per token;
/// a few ids of context are enough for SentencePiece's leading-space rule
/// and for a UTF-8 character split over several byte tokens (at most 4).
constexpr std::size_t kContextIds = 6;

/// Length of the longest prefix of `s` that ends on a complete UTF-8
/// character and not on U+FFFD (which SentencePiece emits for an
/// incomplete byte sequence that later tokens may still complete).
std::size_t complete_prefix(const std::string& s) {
  std::size_t n = s.size();
  // Walk back over at most 3 continuation bytes to the last lead byte.
  std::size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xc0) == 0x80) {
    --i;
    ++cont;
  }
  if (i > 0 && cont < 4) {
    auto lead = static_cast<unsigned char>(s[i - 1]);
    int need = lead < 0x80 ? 0 : (lead >> 5) == 0x6 ? 1 : (lead >> 4) == 0xe ? 2
                                 : (lead >> 3) == 0x1e ? 3 : -1;
    if (need >= 0 && cont < need) n = i - 1;  // incomplete character: hold it back
  }
  static const std::string replacement = "\xef\xbf\xbd";
  while (n >= 3 && s.compare(n - 3, 3, replacement) == 0) n -= 3;
  return n;
}

}  // namespace

stream_decoder::stream_decoder(const tokenizer& tok) : tok_(&tok) {}

std::string stream_decoder::push(std::int32_t id) {
  ids_.push_back(id);
  std::string text;
  try {
    text = tok_->decode(ids_);
  } catch (...) {
    ids_.pop_back();  // an invalid id must not poison later pushes
    throw;
  }
  if (text.size() <= emitted_) return {};
  const std::size_t ready = complete_prefix(text);
  if (ready <= emitted_) return {};
  std::string out = text.substr(emitted_, ready - emitted_);
  emitted_ = ready;
  if (ready == text.size() && ids_.size() > kContextIds) {
    // Everything is out: keep only a little context. The decoded window is
    // what later diffs are taken against, so emitted_ becomes its length.
    ids_.erase(ids_.begin(), ids_.end() - static_cast<std::ptrdiff_t>(kContextIds));
    emitted_ = tok_->decode(ids_).size();
  }
  return out;
}

std::string stream_decoder::flush() {
  std::string out;
  if (!ids_.empty()) {
    const std::string text = tok_->decode(ids_);
    if (text.size() > emitted_) out = text.substr(emitted_);
  }
  ids_.clear();
  emitted_ = 0;
  return out;
}

// ---- load_tokenizer -------------------------------------------------------------

namespace {

/// bos_token_id / eos_token_id from config.json (int, or first of a list),
/// -1 when absent or unreadable: the tokenizer's own ids are used then.
void config_token_ids(const std::filesystem::path& dir, int& bos, int& eos) {
  bos = eos = -1;
  std::ifstream in(dir / "config.json");
  if (!in) return;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  auto read = [&](const char* key) {
    if (!j.contains(key)) return -1;
    const nlohmann::json* v = &j[key];
    if (v->is_array() && !v->empty()) v = &v->at(0);
    return v->is_number_integer() && v->get<long long>() >= 0 ? v->get<int>() : -1;
  };
  bos = read("bos_token_id");
  eos = read("eos_token_id");
}

}  // namespace

bool has_tokenizer_files(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.model", "tokenizer.json", "vocab.json", "merges.txt"})
    if (std::filesystem::exists(dir / name, ec)) return true;
  return false;
}

std::unique_ptr<tokenizer> load_tokenizer(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw no_model_directory(dir);
  int bos = -1, eos = -1;
  config_token_ids(dir, bos, eos);
  if (fs::exists(dir / "tokenizer.model", ec))
    return load_sentencepiece(dir / "tokenizer.model", bos, eos);
  if (fs::exists(dir / "tokenizer.json", ec)) return load_bpe_json(dir / "tokenizer.json", bos, eos);
  if (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec))
    return load_bpe_vocab_merges(dir / "vocab.json", dir / "merges.txt", bos, eos);
  throw model_error("no tokenizer in " + dir.string() +
                    " (looked for tokenizer.model, tokenizer.json, and vocab.json + merges.txt)");
}

}  // namespace corolla
