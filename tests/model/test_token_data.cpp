// Tests for model/token_data: the three file formats, the sequential
// batching rule with wrap-around, and the error messages.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "model/error.hpp"
#include "model/token_data.hpp"
#include "model/tokenizer.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
namespace fs = std::filesystem;

namespace {

std::vector<std::uint16_t> iota_tokens(int n, int start = 0) {
  std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), static_cast<std::uint16_t>(start));
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// The batching rule written out independently: p starts at 0, wraps to 0
/// when fewer than B*T+1 tokens remain, row j = tokens[p + j*T, +T).
struct expected_batches {
  std::vector<std::int32_t> tokens;
  std::int64_t p = 0;
  void next(int B, int T, std::vector<std::int32_t>& ids, std::vector<std::int32_t>& tg) {
    const std::int64_t n = static_cast<std::int64_t>(tokens.size());
    if (p + static_cast<std::int64_t>(B) * T + 1 > n) p = 0;
    ids.clear();
    tg.clear();
    for (int j = 0; j < B; ++j)
      for (int t = 0; t < T; ++t) {
        ids.push_back(tokens[static_cast<std::size_t>(p + j * T + t)]);
        tg.push_back(tokens[static_cast<std::size_t>(p + j * T + t + 1)]);
      }
    p += static_cast<std::int64_t>(B) * T;
  }
};

}  // namespace

TEST_CASE("llm.c shards load and batches follow the sequential wrap-around rule") {
  testing::temp_dir_guard dir("data-shard");
  // Pseudo-random ids so that a misplaced row cannot look right by accident.
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 101; ++i) tokens.push_back(static_cast<std::uint16_t>((i * 7919 + 13) % 1000));
  testing::write_llmc_shard(dir / "train.bin", tokens);
  CHECK(fs::file_size(dir / "train.bin") == 1024 + 2 * 101);

  token_dataset d = token_dataset::open(dir / "train.bin", nullptr, 1000);
  REQUIRE(d.size() == 101);
  CHECK(std::equal(d.tokens().begin(), d.tokens().end(), tokens.begin()));

  // B*T = 16: batches at p = 0, 16, ..., 80 (80 + 17 <= 101), then wrap.
  std::vector<std::int32_t> ids, tg, want_ids, want_tg;
  expected_batches ref{{tokens.begin(), tokens.end()}};
  const std::int64_t starts[] = {0, 16, 32, 48, 64, 80, 0, 16, 32, 48, 64, 80, 0};
  for (std::int64_t start : starts) {
    CAPTURE(start);
    d.next_batch(2, 8, ids, tg);
    ref.next(2, 8, want_ids, want_tg);
    CHECK(ids == want_ids);
    CHECK(tg == want_tg);
    CHECK(ids.front() == tokens[static_cast<std::size_t>(start)]);
    CHECK(ids[8] == tokens[static_cast<std::size_t>(start + 8)]);  // row 1 starts T later
    CHECK(tg.back() == tokens[static_cast<std::size_t>(start + 16)]);
    CHECK(d.position() == start + 16);
  }

  // Exactly B*T+1 tokens left from p is enough; one fewer wraps.
  token_dataset e = token_dataset::open(dir / "train.bin", nullptr, 0);
  e.set_position(85);  // 85 + 17 = 102 > 101 tokens: wraps to 0
  e.next_batch(2, 8, ids, tg);
  CHECK(ids.front() == tokens[0]);
  e.set_position(84);  // 84 + 17 = 101: fits exactly
  e.next_batch(2, 8, ids, tg);
  CHECK(ids.front() == tokens[84]);
  CHECK(tg.back() == tokens[100]);
  CHECK(e.position() == 100);
  e.reset();
  CHECK(e.position() == 0);
  CHECK(contains(error_of([&] { e.set_position(102); }), "outside"));

  // Different shapes over the same data: B=1, T=50 -> 0, 50, wrap.
  e.reset();
  e.next_batch(1, 50, ids, tg);
  e.next_batch(1, 50, ids, tg);
  CHECK(ids.front() == tokens[50]);
  e.next_batch(1, 50, ids, tg);
  CHECK(ids.front() == tokens[0]);
}

TEST_CASE("a dataset smaller than one batch says how many tokens are needed") {
  testing::temp_dir_guard dir("data-small");
  testing::write_llmc_shard(dir / "small.bin", iota_tokens(16));
  token_dataset d = token_dataset::open(dir / "small.bin", nullptr, 64);
  std::vector<std::int32_t> ids, tg;
  CHECK(error_of([&] { d.next_batch(2, 8, ids, tg); }) ==
        (dir / "small.bin").string() +
            " holds 16 tokens, but a batch of 2 x 8 needs at least 17");
  CHECK(contains(error_of([&] { d.next_batch(0, 8, ids, tg); }), "must be positive"));
  d.next_batch(3, 5, ids, tg);  // 15 + 1 = 16 fits
  CHECK(ids.size() == 15);
  CHECK(tg.back() == 15);
}

TEST_CASE("raw uint16 files load and odd sizes are rejected") {
  testing::temp_dir_guard dir("data-raw");
  testing::write_raw_u16(dir / "raw.bin", iota_tokens(40, 100));
  token_dataset d = token_dataset::open(dir / "raw.bin", nullptr, 200);
  REQUIRE(d.size() == 40);
  CHECK(d.tokens()[0] == 100);
  CHECK(d.tokens()[39] == 139);
  std::vector<std::int32_t> ids, tg;
  d.next_batch(3, 4, ids, tg);
  CHECK(ids == std::vector<std::int32_t>{100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,
                                         111});
  CHECK(tg.front() == 101);
  CHECK(tg.back() == 112);

  // Ids are full 16-bit unsigned values.
  testing::write_raw_u16(dir / "big.bin", {65535, 0, 40000});
  CHECK(token_dataset::open(dir / "big.bin", nullptr, 0).tokens()[0] == 65535);

  std::ofstream(dir / "odd.bin", std::ios::binary) << "abc";
  CHECK(contains(error_of([&] { token_dataset::open(dir / "odd.bin", nullptr, 0); }),
                 "size (3 bytes) is odd"));
}

TEST_CASE("truncated shards and bad magic numbers are reported") {
  testing::temp_dir_guard dir("data-bad");
  const fs::path shard = dir / "shard.bin";
  testing::write_llmc_shard(shard, iota_tokens(50));
  fs::resize_file(shard, fs::file_size(shard) - 2);
  std::string e = error_of([&] { token_dataset::open(shard, nullptr, 0); });
  CHECK(contains(e, shard.string() + " is truncated"));
  CHECK(contains(e, "50 tokens"));

  // Truncated inside the header.
  fs::resize_file(shard, 600);
  CHECK(contains(error_of([&] { token_dataset::open(shard, nullptr, 0); }), "truncated"));

  testing::write_llmc_shard(shard, iota_tokens(50));
  {
    std::ofstream out(shard, std::ios::binary | std::ios::app);
    out << "xx";
  }
  CHECK(contains(error_of([&] { token_dataset::open(shard, nullptr, 0); }), "malformed"));

  // A shard whose magic is damaged is not silently read as raw tokens.
  testing::write_llmc_shard(shard, iota_tokens(50));
  {
    std::fstream f(shard, std::ios::binary | std::ios::in | std::ios::out);
    std::int32_t bad = 12345;
    f.write(reinterpret_cast<const char*>(&bad), 4);
  }
  CHECK(error_of([&] { token_dataset::open(shard, nullptr, 0); }) ==
        shard.string() + " looks like an llm.c shard but has magic 12345 instead of 20240520");

  // An unknown version.
  testing::write_llmc_shard(shard, iota_tokens(50));
  {
    std::fstream f(shard, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(4);
    std::int32_t version = 2;
    f.write(reinterpret_cast<const char*>(&version), 4);
  }
  CHECK(contains(error_of([&] { token_dataset::open(shard, nullptr, 0); }), "version 2"));

  CHECK(contains(error_of([&] { token_dataset::open(dir / "absent.bin", nullptr, 0); }),
                 "does not exist"));
}

TEST_CASE("token ids outside the vocabulary are named with their position") {
  testing::temp_dir_guard dir("data-range");
  testing::write_llmc_shard(dir / "d.bin", {1, 2, 3, 70, 4});
  CHECK(error_of([&] { token_dataset::open(dir / "d.bin", nullptr, 64); }) ==
        "token id 70 at position 3 in " + (dir / "d.bin").string() +
            " is outside the model's vocabulary (size 64)");
  CHECK(token_dataset::open(dir / "d.bin", nullptr, 71).size() == 5);
  CHECK(token_dataset::open(dir / "d.bin", nullptr, 0).size() == 5);
}

TEST_CASE("text files are tokenised with the model's tokenizer") {
  testing::temp_dir_guard dir("data-text");
  testing::tiny_model_options o;
  o.vocab = 200;
  o.sentencepiece_tokenizer = true;
  testing::write_tiny_model(dir / "model", o);
  auto tok = load_tokenizer(dir / "model");

  const std::string text = testing::tiny_corpus(200, 7).substr(0, 3000);
  std::ofstream(dir / "corpus.txt") << text;
  token_dataset d = token_dataset::open(dir / "corpus.txt", tok.get(), o.vocab);
  const auto want = tok->encode(text, true);
  REQUIRE(d.size() == static_cast<std::int64_t>(want.size()));
  CHECK(std::equal(d.tokens().begin(), d.tokens().end(), want.begin()));
  CHECK(d.tokens()[0] == tok->bos_id());
  CHECK(tok->decode({d.tokens().begin(), d.tokens().end()}) == text);

  // Any other extension that is not a shard is text too.
  std::ofstream(dir / "notes.md") << "the quick brown fox.";
  CHECK(token_dataset::open(dir / "notes.md", tok.get(), o.vocab).size() > 3);

  // The vocabulary check applies to tokenised text as well.
  CHECK(contains(error_of([&] { token_dataset::open(dir / "corpus.txt", tok.get(), 10); }),
                 "outside the model's vocabulary"));

  CHECK(error_of([&] { token_dataset::open(dir / "corpus.txt", nullptr, 0); }) ==
        (dir / "corpus.txt").string() +
            " is a text file, and tokenising it needs the model's tokenizer (none was given)");
  std::ofstream(dir / "blob.dat", std::ios::binary) << std::string("\x00\xff\xfe\x80", 4);
  CHECK(contains(error_of([&] { token_dataset::open(dir / "blob.dat", tok.get(), 0); }),
                 "neither an llm.c shard"));
}

TEST_CASE("token lists can back a dataset directly") {
  token_dataset d = token_dataset::from_tokens({5, 6, 7, 8, 9}, 10);
  std::vector<std::int32_t> ids, tg;
  d.next_batch(2, 2, ids, tg);
  CHECK(ids == std::vector<std::int32_t>{5, 6, 7, 8});
  CHECK(tg == std::vector<std::int32_t>{6, 7, 8, 9});
  CHECK(contains(error_of([] { token_dataset::from_tokens({1, 10}, 10); }), "token id 10"));
}
