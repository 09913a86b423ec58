// model/tokenizer.hpp — text <-> token ids: SentencePiece (tokenizer.model)
// and byte-level BPE (tokenizer.json, or vocab.json + merges.txt).
//
// Byte-level BPE pre-tokenises with GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// implemented by hand over UTF-8 code points, with ICU's character
// properties for \p{L}, \p{N} and \s (White_Space) beyond ASCII. The
// tokenizer.json tests compare encodings with HF's tokenizers library on
// hundreds of texts of many scripts (tests/model/test_tokenizer_hf.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace corolla {

/// Converts between text and token ids. Implementations are immutable after
/// loading; encode/decode may be called from several threads at once.
class tokenizer {
 public:
  virtual ~tokenizer();
  /// Token ids of `text` (UTF-8), with the BOS id first when `add_bos` and
  /// the tokenizer has one.
  virtual std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const = 0;
  /// The text of `ids` (BOS/EOS and other control tokens decode to nothing
  /// for SentencePiece; added tokens decode verbatim for BPE). Throws
  /// model_error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  /// Number of ids (the largest id + 1).
  virtual int vocab_size() const = 0;
  /// Beginning-of-sequence id, -1 when none.
  virtual int bos_id() const = 0;
  /// End-of-sequence id, -1 when none.
  virtual int eos_id() const = 0;
  /// Whether text prompts for this tokenizer's models start with BOS, as
  /// HuggingFace's own tokenizers do: SentencePiece yes (when it has a BOS),
  /// GPT-2 byte-level BPE no.
  virtual bool prepends_bos() const = 0;
};

/// Turns generated ids, pushed one at a time, into text as soon as it is
/// complete: never splits a multi-byte UTF-8 character, and decodes the
/// pending ids together so context-dependent pieces (SentencePiece's
/// leading-space marker) come out exactly as decode() of the whole sequence.
/// The concatenation of every push() and the final flush() equals
/// decode(all ids).
class stream_decoder {
 public:
  /// `tok` must outlive the decoder.
  explicit stream_decoder(const tokenizer& tok);
  /// Adds `id`; returns the text completed by it (possibly empty). An id
  /// outside the vocabulary throws model_error and is not kept.
  std::string push(std::int32_t id);
  /// Returns whatever is still held back (an incomplete UTF-8 tail is
  /// returned as is), and starts over.
  std::string flush();

 private:
  const tokenizer* tok_;
  std::vector<std::int32_t> ids_;  ///< all ids pushed since the last flush
  std::size_t emitted_ = 0;        ///< bytes of decode(ids_) already returned
};

/// Loads the tokenizer of a model directory: `tokenizer.model`
/// (SentencePiece), else `tokenizer.json` (byte-level BPE), else
/// `vocab.json` + `merges.txt` (byte-level BPE). bos/eos are `config.json`'s
/// bos_token_id / eos_token_id when it gives them (it is what HF generation
/// uses), else the tokenizer's own. Throws model_error listing the three
/// files it looked for when there is none.
std::unique_ptr<tokenizer> load_tokenizer(const std::filesystem::path& dir);
/// Whether `dir` holds any of the files load_tokenizer() reads (a broken
/// one is then an error to report, not the absence of a tokenizer).
bool has_tokenizer_files(const std::filesystem::path& dir);

/// A SentencePiece model file. `bos_id`/`eos_id` override the model's own
/// when >= 0. Throws model_error naming the file.
std::unique_ptr<tokenizer> load_sentencepiece(const std::filesystem::path& file, int bos_id = -1,
                                              int eos_id = -1);

/// A HuggingFace tokenizer.json whose model is BPE with a ByteLevel
/// pre-tokenizer/decoder (GPT-2 style; no normalizer). `bos_id`/`eos_id`
/// are used when >= 0; otherwise "<|endoftext|>" (for both) or "<s>"/"</s>"
/// among the added tokens, if present. Added tokens are special: the input
/// is split on them before pre-tokenising and they decode verbatim. Throws
/// model_error naming the file for anything else.
std::unique_ptr<tokenizer> load_bpe_json(const std::filesystem::path& file, int bos_id = -1,
                                         int eos_id = -1);

/// GPT-2 style vocab.json + merges.txt (byte-level BPE). `bos_id`/`eos_id`
/// as for load_bpe_json; "<|endoftext|>" in the vocabulary is a special
/// token.
std::unique_ptr<tokenizer> load_bpe_vocab_merges(const std::filesystem::path& vocab,
                                                 const std::filesystem::path& merges,
                                                 int bos_id = -1, int eos_id = -1);

/// GPT-2's byte-level character for byte `b` (UTF-8): printable bytes are
/// themselves, the others U+0100 onwards; how vocab.json and tokenizer.json
/// spell bytes (for tools and tests that write such files).
const std::string& byte_level_char(unsigned char b);

/// The pre-tokens byte-level BPE splits `text` into before merging
/// (GPT-2's pattern, as described at the top of this file). The views
/// point into `text`; their concatenation is `text`.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace corolla
