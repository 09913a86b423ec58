// model/sentencepiece_tokenizer.cpp — tokenizer.model through libsentencepiece.
#include <sentencepiece_processor.h>

#include "model/error.hpp"
#include "model/tokenizer.hpp"

namespace corolla {
namespace {

class sentencepiece_tokenizer final : public tokenizer {
 public:
  sentencepiece_tokenizer(const std::filesystem::path& file, int bos, int eos) : file_(file) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      throw model_error("SentencePiece model " + file.string() + " does not exist");
    auto st = sp_.Load(file.string());
    if (!st.ok()) {
      // A file that is not a model protobuf fails inside SentencePiece's
      // parser, whose status names its own source line.
      const std::string why = st.ToString().find("ParseFromArray") != std::string::npos
                                  ? "the file is not a SentencePiece model (it does not parse as one)"
                                  : st.ToString();
      throw model_error("cannot load SentencePiece model " + file.string() + ": " + why);
    }
    vocab_ = sp_.GetPieceSize();
    bos_ = bos >= 0 ? bos : sp_.bos_id();
    eos_ = eos >= 0 ? eos : sp_.eos_id();
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(std::string(text), &ids);
    if (!st.ok())
      throw model_error("SentencePiece cannot encode the text: " + st.ToString());
    std::vector<std::int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_bos && bos_ >= 0) out.push_back(bos_);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] >= vocab_)
        throw model_error("token id " + std::to_string(v[i]) + " (position " + std::to_string(i) +
                          ") is outside the vocabulary of " + file_.string() + " (size " +
                          std::to_string(vocab_) + ")");
    std::string out;
    auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw model_error("SentencePiece cannot decode the ids: " + st.ToString());
    return out;
  }

  int vocab_size() const override { return vocab_; }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool prepends_bos() const override { return bos_ >= 0; }

 private:
  std::filesystem::path file_;
  sentencepiece::SentencePieceProcessor sp_;
  int vocab_ = 0;
  int bos_ = -1;
  int eos_ = -1;
};

}  // namespace

std::unique_ptr<tokenizer> load_sentencepiece(const std::filesystem::path& file, int bos_id,
                                              int eos_id) {
  return std::make_unique<sentencepiece_tokenizer>(file, bos_id, eos_id);
}

}  // namespace corolla
