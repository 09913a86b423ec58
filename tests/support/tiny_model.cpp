// tests/support/tiny_model.cpp — tiny random HuggingFace models and token
// files for tests.
#include "tests/support/tiny_model.hpp"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "model/safetensors.hpp"

namespace corolla::testing {
namespace fs = std::filesystem;

namespace {

/// splitmix64: a tiny, well-mixed generator whose output is the same on
/// every platform (std::normal_distribution is not).
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  /// Standard normal (Box-Muller).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
};

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

enum class init_kind { matrix, norm, bias };

/// Random values for one tensor. Seeded by (seed, name) so a tensor's values
/// do not depend on which other tensors the model has.
Tensor random_tensor(const std::string& name, shape_t shape, init_kind kind,
                     const tiny_model_options& o) {
  rng r{o.seed * 0x2545f4914f6cdd1dull ^ fnv1a(name)};
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) {
    double n = r.normal();
    switch (kind) {
      case init_kind::matrix: x = static_cast<float>(o.init_std * n); break;
      case init_kind::norm: x = static_cast<float>(1.0 + 0.1 * n); break;
      case init_kind::bias: x = static_cast<float>(0.1 * n); break;
    }
  }
  Tensor t = Tensor::from_f32(v, std::move(shape));
  return o.storage == dtype::f32 ? t : t.to(o.storage);
}

using named_tensors = std::vector<std::pair<std::string, Tensor>>;

named_tensors llama_weights(const tiny_model_options& o) {
  const std::int64_t V = o.vocab, D = o.hidden, F = o.intermediate;
  const std::int64_t Dh = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads, q = o.heads * Dh, kv = o.kv_heads * Dh;
  const bool qwen2 = o.family == "Qwen2ForCausalLM" || o.family == "Qwen2MoeForCausalLM";
  const bool qkv_bias = qwen2 || o.attention_bias;
  const bool o_bias = !qwen2 && o.attention_bias;
  named_tensors w;
  auto add = [&](const std::string& name, shape_t s, init_kind k) {
    w.emplace_back(name, random_tensor(name, std::move(s), k, o));
  };
  add("model.embed_tokens.weight", {V, D}, init_kind::matrix);
  for (int i = 0; i < o.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {D}, init_kind::norm);
    add(p + "self_attn.q_proj.weight", {q, D}, init_kind::matrix);
    add(p + "self_attn.k_proj.weight", {kv, D}, init_kind::matrix);
    add(p + "self_attn.v_proj.weight", {kv, D}, init_kind::matrix);
    add(p + "self_attn.o_proj.weight", {D, q}, init_kind::matrix);
    if (qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q}, init_kind::bias);
      add(p + "self_attn.k_proj.bias", {kv}, init_kind::bias);
      add(p + "self_attn.v_proj.bias", {kv}, init_kind::bias);
    }
    if (o_bias) add(p + "self_attn.o_proj.bias", {D}, init_kind::bias);
    if (o.family == "Qwen3ForCausalLM" || o.family == "Qwen3MoeForCausalLM") {
      add(p + "self_attn.q_norm.weight", {Dh}, init_kind::norm);
      add(p + "self_attn.k_norm.weight", {Dh}, init_kind::norm);
    }
    add(p + "post_attention_layernorm.weight", {D}, init_kind::norm);
    if (o.family == "MixtralForCausalLM") {
      add(p + "block_sparse_moe.gate.weight", {o.experts, D}, init_kind::matrix);
      for (int e = 0; e < o.experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        add(x + "w1.weight", {F, D}, init_kind::matrix);
        add(x + "w2.weight", {D, F}, init_kind::matrix);
        add(x + "w3.weight", {F, D}, init_kind::matrix);
      }
    } else if (o.family == "Qwen3MoeForCausalLM" || o.family == "Qwen2MoeForCausalLM") {
      add(p + "mlp.gate.weight", {o.experts, D}, init_kind::matrix);
      auto expert = [&](const std::string& x, std::int64_t width) {
        add(x + "gate_proj.weight", {width, D}, init_kind::matrix);
        add(x + "up_proj.weight", {width, D}, init_kind::matrix);
        add(x + "down_proj.weight", {D, width}, init_kind::matrix);
      };
      for (int e = 0; e < o.experts; ++e) expert(p + "mlp.experts." + std::to_string(e) + ".", F);
      if (o.family == "Qwen2MoeForCausalLM") {
        expert(p + "mlp.shared_expert.", o.shared_expert);
        add(p + "mlp.shared_expert_gate.weight", {1, D}, init_kind::matrix);
      }
    } else {
      add(p + "mlp.gate_proj.weight", {F, D}, init_kind::matrix);
      add(p + "mlp.up_proj.weight", {F, D}, init_kind::matrix);
      add(p + "mlp.down_proj.weight", {D, F}, init_kind::matrix);
    }
  }
  add("model.norm.weight", {D}, init_kind::norm);
  if (!o.tied) add("lm_head.weight", {V, D}, init_kind::matrix);
  return w;
}

named_tensors gpt2_weights(const tiny_model_options& o) {
  const std::int64_t V = o.vocab, D = o.hidden, F = o.intermediate, P = o.max_positions;
  named_tensors w;
  auto add = [&](const std::string& name, shape_t s, init_kind k) {
    w.emplace_back(name, random_tensor(name, std::move(s), k, o));
  };
  add("wte.weight", {V, D}, init_kind::matrix);
  add("wpe.weight", {P, D}, init_kind::matrix);
  for (int i = 0; i < o.layers; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", {D}, init_kind::norm);
    add(p + "ln_1.bias", {D}, init_kind::bias);
    // Conv1D layout: weight is [in, out].
    add(p + "attn.c_attn.weight", {D, 3 * D}, init_kind::matrix);
    add(p + "attn.c_attn.bias", {3 * D}, init_kind::bias);
    add(p + "attn.c_proj.weight", {D, D}, init_kind::matrix);
    add(p + "attn.c_proj.bias", {D}, init_kind::bias);
    add(p + "ln_2.weight", {D}, init_kind::norm);
    add(p + "ln_2.bias", {D}, init_kind::bias);
    add(p + "mlp.c_fc.weight", {D, F}, init_kind::matrix);
    add(p + "mlp.c_fc.bias", {F}, init_kind::bias);
    add(p + "mlp.c_proj.weight", {F, D}, init_kind::matrix);
    add(p + "mlp.c_proj.bias", {D}, init_kind::bias);
  }
  add("ln_f.weight", {D}, init_kind::norm);
  add("ln_f.bias", {D}, init_kind::bias);
  return w;
}

std::string shard_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

const char* const kWords[] = {
    "the", "a", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with",
    "as", "his", "they", "be", "at", "one", "have", "this", "from", "by", "hot", "word", "but",
    "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use",
    "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will",
    "way", "about", "many", "then", "them", "write", "would", "like", "so", "these", "her",
    "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go",
    "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water",
    "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "river",
    "hello", "world", "model", "token", "quick", "brown", "fox", "jumps", "lazy", "dog",
    "train", "small", "garden", "light", "stone", "music", "winter", "summer", "bread"};

/// Deterministic pronounceable non-words, so larger vocabularies always
/// find more pairs to merge.
std::string pseudo_word(rng& r) {
  static const char* consonants = "bcdfghjklmnprstvwz";
  static const char* vowels = "aeiou";
  std::string w;
  int syllables = 2 + r.below(2);
  for (int s = 0; s < syllables; ++s) {
    w += consonants[r.below(18)];
    w += vowels[r.below(5)];
  }
  if (r.below(3) == 0) w += consonants[r.below(18)];
  return w;
}

}  // namespace

// ---- directories ------------------------------------------------------------------

fs::path temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  for (;;) {
    fs::path p = fs::temp_directory_path() /
                 ("corolla-" + tag + "-" + std::to_string(::getpid()) + "-" +
                  std::to_string(counter++));
    std::error_code ec;
    if (fs::create_directory(p, ec)) return p;
    if (ec) throw std::runtime_error("cannot create " + p.string() + ": " + ec.message());
    // already existed (left over from an earlier process with our pid): try the next
  }
}

temp_dir_guard::~temp_dir_guard() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

// ---- models -----------------------------------------------------------------------

model_config tiny_config(const tiny_model_options& o) {
  model_config c;
  c.arch = o.arch;
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.n_layers = o.layers;
  c.n_heads = o.heads;
  c.head_dim = o.head_dim > 0 ? o.head_dim : o.heads > 0 ? o.hidden / o.heads : 0;
  c.intermediate_size = o.intermediate;
  c.max_positions = o.max_positions;
  c.norm_eps = o.norm_eps;
  c.bos_token_id = o.bos;
  c.eos_token_id = o.eos;
  if (o.arch == architecture::gpt2) {
    c.hf_architecture = "GPT2LMHeadModel";
    c.n_kv_heads = o.heads;
    c.tie_embeddings = true;
  } else {
    c.hf_architecture = o.family;
    c.n_kv_heads = o.kv_heads;
    c.tie_embeddings = o.tied;
    c.rope = rope_spec(o.rope_theta);
    c.rope_scaling = o.rope_scaling;
    const bool qwen2 = o.family == "Qwen2ForCausalLM" || o.family == "Qwen2MoeForCausalLM";
    c.qkv_bias = qwen2 || o.attention_bias;
    c.o_bias = !qwen2 && o.attention_bias;
    c.qk_norm = o.family == "Qwen3ForCausalLM" || o.family == "Qwen3MoeForCausalLM";
    if (o.family == "MixtralForCausalLM" || o.family == "Qwen2MoeForCausalLM" || o.family == "Qwen3MoeForCausalLM") {
      c.n_experts = o.experts;
      c.experts_per_token = o.experts_per_token;
      c.norm_topk_prob = o.family == "MixtralForCausalLM" || o.norm_topk_prob;
      if (o.family == "Qwen2MoeForCausalLM") c.shared_expert_size = o.shared_expert;
    }
    // The rope spec (scaled frequencies) as the loader computes it.
    if (!o.rope_scaling.empty()) c.rope = parse_config(to_hf_json(c)).rope;
  }
  return c;
}

void write_tiny_model(const fs::path& dir, const tiny_model_options& o) {
  fs::create_directories(dir);
  model_config cfg = tiny_config(o);
  cfg.validate();
  if (o.arch == architecture::llama && o.head_dim == 0 && o.hidden % o.heads != 0)
    throw std::invalid_argument("tiny model: hidden must be divisible by heads");

  if (o.sentencepiece_tokenizer) {
    train_sentencepiece(dir / "tokenizer.model", o.vocab, o.seed);
    sentencepiece::SentencePieceProcessor sp;
    auto st = sp.Load((dir / "tokenizer.model").string());
    if (!st.ok()) throw std::runtime_error("cannot reload trained tokenizer: " + st.ToString());
    cfg.bos_token_id = sp.bos_id();
    cfg.eos_token_id = sp.eos_id();
  }
  write_text(dir / "config.json", to_hf_json(cfg).dump(2) + "\n");

  named_tensors w = o.arch == architecture::gpt2 ? gpt2_weights(o) : llama_weights(o);
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  if (o.shards <= 1) {
    write_safetensors(dir / "model.safetensors", w, meta);
    return;
  }
  nlohmann::json index;
  std::uint64_t total = 0;
  const std::size_t n = w.size(), k = static_cast<std::size_t>(o.shards);
  for (std::size_t s = 0; s < k; ++s) {
    const std::string file = shard_name(static_cast<int>(s + 1), o.shards);
    named_tensors part(w.begin() + static_cast<std::ptrdiff_t>(s * n / k),
                       w.begin() + static_cast<std::ptrdiff_t>((s + 1) * n / k));
    for (const auto& [name, t] : part) {
      index["weight_map"][name] = file;
      total += t.nbytes();
    }
    write_safetensors(dir / file, part, meta);
  }
  index["metadata"]["total_size"] = total;
  write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

std::map<std::string, std::vector<float>> read_all_f32(const fs::path& dir) {
  checkpoint ck = checkpoint::open(dir);
  std::map<std::string, std::vector<float>> out;
  for (const auto& name : ck.names()) out.emplace(name, ck.load_f32(name).to_vector());
  return out;
}

// ---- token files ------------------------------------------------------------------

void write_llmc_shard(const fs::path& file, const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[256] = {};
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

void write_raw_u16(const fs::path& file, const std::vector<std::uint16_t>& tokens) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

// ---- tokenizer --------------------------------------------------------------------

std::string tiny_corpus(int vocab, std::uint64_t seed) {
  const bool full = vocab >= 128;
  rng r{seed ^ 0x5eedc0de5eedc0deull};
  std::vector<std::string> pseudo;
  for (int i = 0; i < 400; ++i) pseudo.push_back(pseudo_word(r));
  const int n_real = static_cast<int>(sizeof kWords / sizeof kWords[0]);

  std::string text;
  for (int s = 0; s < 1500; ++s) {
    std::string line;
    int words = 4 + r.below(7);
    for (int i = 0; i < words; ++i) {
      std::string w = r.below(10) < 7 ? kWords[r.below(n_real)] : pseudo[r.below(400)];
      if (full && i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      if (full && r.below(8) == 0) w = std::to_string(r.below(100000));
      if (!line.empty()) line += ' ';
      line += w;
      if (i + 1 < words && r.below(8) == 0) line += ',';
    }
    line += full ? ".!?"[r.below(3)] : '.';
    text += line + '\n';
    if (full && s % 50 == 0) {
      // Every printable ASCII character and a few non-ASCII ones, so that
      // tests can round-trip arbitrary ASCII and some UTF-8.
      text += "Symbols: ! \" # $ % & ' ( ) * + , - . / : ; < = > ? @ [ \\ ] ^ _ ` { | } ~\n";
      text += "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz 0123456789\n";
      text += "a naïve café — 日本語 über straße, señor …\n";
    }
  }
  return text;
}

void train_sentencepiece(const fs::path& file, int vocab, std::uint64_t seed) {
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const fs::path corpus = dir / "tokenizer-corpus.txt";
  const fs::path prefix = dir / "tokenizer-train";
  write_text(corpus, tiny_corpus(vocab, seed));
  const std::unordered_map<std::string, std::string> args{
      {"input", corpus.string()},
      {"model_prefix", prefix.string()},
      {"vocab_size", std::to_string(vocab)},
      {"model_type", "bpe"},
      {"character_coverage", "1.0"},
      {"byte_fallback", "false"},
      // Identity normalisation and kept whitespace runs: decode(encode(x)) == x
      // for any text over the corpus's characters.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      // The trainer reads one sentence per line, so it never sees a line
      // break; declaring it keeps newlines of text files through a round trip.
      {"user_defined_symbols", "\n"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"hard_vocab_limit", "true"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  auto st = sentencepiece::SentencePieceTrainer::Train(args);
  std::error_code ec;
  fs::remove(corpus, ec);
  fs::remove(fs::path(prefix.string() + ".vocab"), ec);
  if (!st.ok())
    throw std::runtime_error("cannot train a SentencePiece tokenizer with vocab_size " +
                             std::to_string(vocab) + " on the test corpus (" + st.ToString() +
                             "); vocabularies of 33..6000 work");
  fs::rename(prefix.string() + ".model", file);
}

}  // namespace corolla::testing
