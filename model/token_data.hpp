// model/token_data.hpp — training token streams: llm.c shards, raw uint16
// files and plain text, and the sequential batching rule training uses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace corolla {

class tokenizer;

/// Magic number in header[0] of an llm.c token shard.
inline constexpr std::int32_t llmc_shard_magic = 20240520;

/// A whole token file held in memory as int32 ids, handed out in batches.
///
/// Batching rule (the same as llm.c's loader, and what the float64 training
/// reference assumes): the position p starts at 0. Each next_batch(B, T)
/// first wraps p to 0 if fewer than B*T+1 tokens remain from p, then row j
/// of the batch is ids = tokens[p + j*T, p + j*T + T) and targets = the same
/// window shifted by one token; finally p advances by B*T.
///
/// Not thread-safe; one dataset per training loop.
class token_dataset {
 public:
  /// Reads `file` by format:
  ///  - llm.c shard: int32 header[256] with header[0] == 20240520,
  ///    header[1] == 1 (version), header[2] == token count, then uint16 ids;
  ///    the file size must be exactly 1024 + 2*count;
  ///  - raw uint16 `.bin` (no header; an odd byte count is an error);
  ///  - text: a `.txt` file, or any file that is neither of the above,
  ///    tokenised with `tok` (a BOS is prepended when the tokenizer has one).
  /// A `.bin` file starting with the shard magic is read as a shard; a
  /// `.bin` file without it is read as raw uint16.
  /// Every id must be < `vocab_size` (0 disables the check).
  /// Throws model_error naming the file for a missing, truncated or
  /// malformed file, a text file with no tokenizer, or an id out of range
  /// (naming the id and its position).
  static token_dataset open(const std::filesystem::path& file, const tokenizer* tok,
                            int vocab_size);

  /// Holds `tokens` directly (ids checked against `vocab_size` when > 0;
  /// `origin` names the source in error messages).
  static token_dataset from_tokens(std::vector<std::int32_t> tokens, int vocab_size,
                                   const std::string& origin = "token list");

  /// Number of tokens.
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  /// All tokens in file order.
  std::span<const std::int32_t> tokens() const { return tokens_; }

  /// Fills `ids` and `targets` with B*T tokens each (row-major [B, T]) by
  /// the rule above. Throws model_error if the dataset holds fewer than
  /// B*T+1 tokens (the message says how many are needed), or if B or T is
  /// not positive.
  void next_batch(int batch, int seq, std::vector<std::int32_t>& ids,
                  std::vector<std::int32_t>& targets);
  /// Back to the first batch (p = 0).
  void reset() { position_ = 0; }
  /// Start of the next batch before any wrap-around (p).
  std::int64_t position() const { return position_; }
  /// Sets p (for resuming); throws model_error unless 0 <= p <= size().
  void set_position(std::int64_t p);

 private:
  std::vector<std::int32_t> tokens_;
  std::int64_t position_ = 0;
  std::string origin_;
};

}  // namespace corolla
