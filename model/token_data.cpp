// model/token_data.cpp — token files and sequential batching.
#include "model/token_data.hpp"

#include <cstring>
#include <string>

#include "model/error.hpp"
#include "model/tokenizer.hpp"
#include "model/whole_file.hpp"

namespace corolla {
namespace {

constexpr std::size_t kShardHeaderBytes = 256 * sizeof(std::int32_t);

std::int32_t header_word(const std::string& bytes, int i) {
  std::int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);  // little-endian host, as llm.c writes it
  return v;
}

std::vector<std::int32_t> u16_tokens(const char* p, std::size_t count) {
  std::vector<std::int32_t> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    out[i] = v;
  }
  return out;
}

/// True when `s` is well-formed UTF-8 (text files must be; anything else is
/// most likely a binary file with the wrong extension).
bool valid_utf8(const std::string& s) {
  std::size_t i = 0, n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += len;
  }
  return true;
}

std::vector<std::int32_t> read_shard(const std::string& bytes, const std::string& where) {
  if (bytes.size() < kShardHeaderBytes)
    throw model_error(where + " is truncated: an llm.c shard header needs " +
                      std::to_string(kShardHeaderBytes) + " bytes but the file has " +
                      std::to_string(bytes.size()));
  const std::int32_t version = header_word(bytes, 1);
  const std::int32_t count = header_word(bytes, 2);
  if (version != 1)
    throw model_error(where + " is an llm.c shard of unsupported version " +
                      std::to_string(version) + " (expected 1)");
  if (count < 0)
    throw model_error(where + " is a malformed llm.c shard: negative token count " +
                      std::to_string(count));
  const std::size_t expected = kShardHeaderBytes + 2 * static_cast<std::size_t>(count);
  if (bytes.size() < expected)
    throw model_error(where + " is truncated: its header says " + std::to_string(count) +
                      " tokens (" + std::to_string(expected) + " bytes) but the file has " +
                      std::to_string(bytes.size()) + " bytes");
  if (bytes.size() > expected)
    throw model_error(where + " is a malformed llm.c shard: its header says " +
                      std::to_string(count) + " tokens (" + std::to_string(expected) +
                      " bytes) but the file has " + std::to_string(bytes.size()) + " bytes");
  return u16_tokens(bytes.data() + kShardHeaderBytes, static_cast<std::size_t>(count));
}

/// A file whose header is consistent with an llm.c shard in every way but
/// the magic number is a damaged (or foreign) shard, not raw tokens.
bool looks_like_shard(const std::string& bytes) {
  if (bytes.size() < kShardHeaderBytes) return false;
  const std::int32_t count = header_word(bytes, 2);
  return header_word(bytes, 1) == 1 && count >= 0 &&
         bytes.size() == kShardHeaderBytes + 2 * static_cast<std::size_t>(count);
}

}  // namespace

token_dataset token_dataset::open(const std::filesystem::path& file, const tokenizer* tok,
                                  int vocab_size) {
  const std::string where = file.string();
  const std::string bytes = read_whole_file(file, "data file");
  const std::string ext = file.extension().string();
  const bool has_magic = bytes.size() >= 4 && header_word(bytes, 0) == llmc_shard_magic;

  std::vector<std::int32_t> tokens;
  if (ext != ".txt" && has_magic) {
    tokens = read_shard(bytes, where);
  } else if (ext == ".bin") {
    if (looks_like_shard(bytes))
      throw model_error(where + " looks like an llm.c shard but has magic " +
                        std::to_string(header_word(bytes, 0)) + " instead of " +
                        std::to_string(llmc_shard_magic));
    if (bytes.size() % 2 != 0)
      throw model_error(where + " is not a raw uint16 token file: its size (" +
                        std::to_string(bytes.size()) + " bytes) is odd");
    tokens = u16_tokens(bytes.data(), bytes.size() / 2);
  } else {
    if (!valid_utf8(bytes))
      throw model_error(where + " is neither an llm.c shard, a raw uint16 .bin file nor UTF-8 text");
    if (!tok)
      throw model_error(where + " is a text file, and tokenising it needs the model's tokenizer "
                        "(none was given)");
    tokens = tok->encode(bytes, tok->bos_id() >= 0);
  }
  return from_tokens(std::move(tokens), vocab_size, where);
}

token_dataset token_dataset::from_tokens(std::vector<std::int32_t> tokens, int vocab_size,
                                         const std::string& origin) {
  if (vocab_size > 0) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_size)
        throw model_error("token id " + std::to_string(tokens[i]) + " at position " +
                          std::to_string(i) + " in " + origin +
                          " is outside the model's vocabulary (size " +
                          std::to_string(vocab_size) + ")");
    }
  }
  token_dataset d;
  d.tokens_ = std::move(tokens);
  d.origin_ = origin;
  return d;
}

void token_dataset::next_batch(int batch, int seq, std::vector<std::int32_t>& ids,
                               std::vector<std::int32_t>& targets) {
  if (batch <= 0 || seq <= 0)
    throw model_error("batch size and sequence length must be positive (got " +
                      std::to_string(batch) + " x " + std::to_string(seq) + ")");
  const std::int64_t span = static_cast<std::int64_t>(batch) * seq;
  if (size() < span + 1)
    throw model_error(origin_ + " holds " + std::to_string(size()) + " tokens, but a batch of " +
                      std::to_string(batch) + " x " + std::to_string(seq) + " needs at least " +
                      std::to_string(span + 1));
  if (position_ + span + 1 > size()) position_ = 0;
  const std::int32_t* p = tokens_.data() + position_;
  ids.assign(p, p + span);
  targets.assign(p + 1, p + span + 1);
  position_ += span;
}

void token_dataset::set_position(std::int64_t p) {
  if (p < 0 || p > size())
    throw model_error("data position " + std::to_string(p) + " is outside " + origin_ + " (" +
                      std::to_string(size()) + " tokens)");
  position_ = p;
}

}  // namespace corolla
