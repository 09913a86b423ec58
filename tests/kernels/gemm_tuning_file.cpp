// tests/kernels/gemm_tuning_file.cpp — the GEMM tuner's results file
// (kernels/cuda/gemm_tuning_file.hpp): what one process appends another
// reads back, per platform, the chosen algorithm's 64 bytes included; a
// later line of a problem overrides; lines of other platforms are kept and
// ignored; lines of the earlier six-field form are skipped; malformed lines
// are errors naming the file and line; a recorded algorithm is recognised
// by its bytes or its configuration attributes. Runs without a GPU: it
// needs the CUDA build because the file lives in the CUDA backend, and
// cuBLASLt's library (loaded on first use) to read an algorithm's
// configuration.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/whole_file.hpp"
#include "tests/support/tiny_model.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/gemm_tuning_file.hpp"

using corolla::cuda::gemm_tuning_entry;
using corolla::cuda::gemm_tuning_file;
using corolla::cuda::gemm_algorithm_config;
using corolla::cuda::find_gemm_algorithm;

namespace {

constexpr const char* h200 = "NVIDIA H200, 139 GiB, sm_90, 132 SMs; cuBLASLt 130100, workspace 33554432";
constexpr const char* h100 = "NVIDIA H100 80GB HBM3, 79 GiB, sm_90, 132 SMs; cuBLASLt 130100, workspace 33554432";

/// An algorithm's bytes, distinct per `seed`, every word's top digit 0xf
/// (bit 63 set) and its low bits varied.
std::array<std::uint64_t, 8> algo_of(std::uint64_t seed) {
  std::array<std::uint64_t, 8> a{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0xfedcba9876543210ULL ^ (seed << 48) ^ (seed * 7 + i);
  return a;
}
/// A valid line's algorithm field.
const std::string algo_text(128, 'a');

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("the gemm tuning file: what one process appends the next reads back, per platform") {
  corolla::testing::temp_dir_guard dir("gemm-tuning");
  const std::string path = (dir / "choices.tsv").string();
  {
    gemm_tuning_file f(path, h200);  // no file yet: nothing known
    CHECK(f.size() == 0);
    CHECK_FALSE(f.find("1,2,3").has_value());
    f.add("1,2,3", {2, 8, 40.5, 35.25, algo_of(1)});
    f.add("4,5,6", {0, 5, std::nan(""), 12.0, algo_of(2)});
    CHECK(f.find("1,2,3")->chosen == 2);
  }
  gemm_tuning_file other(path, h100);  // another device: nothing of the H200's
  CHECK(other.size() == 0);
  other.add("1,2,3", {1, 8, 50.0, 45.0, algo_of(3)});

  gemm_tuning_file again(path, h200);
  CHECK(again.size() == 2);
  const auto e = again.find("1,2,3");
  REQUIRE(e.has_value());
  CHECK(e->chosen == 2);
  CHECK(e->candidates == 8);
  CHECK(e->first_us == 40.5);
  CHECK(e->chosen_us == 35.25);
  CHECK(e->algo == algo_of(1));  // every bit of every word, the top ones too
  CHECK(std::isnan(again.find("4,5,6")->first_us));  // the first refused: kept as nan
  CHECK(gemm_tuning_file(path, h100).find("1,2,3")->chosen == 1);
  CHECK(gemm_tuning_file(path, h100).find("1,2,3")->algo == algo_of(3));

  // A later line of a problem overrides an earlier one; nothing is rewritten.
  again.add("1,2,3", {3, 8, 40.0, 30.0, algo_of(4)});
  CHECK(gemm_tuning_file(path, h200).find("1,2,3")->chosen == 3);
  CHECK(gemm_tuning_file(path, h200).find("1,2,3")->algo == algo_of(4));
  const std::string text = corolla::read_whole_file(path);
  CHECK(std::count(text.begin(), text.end(), '\n') == 4);
  CHECK(text.find(std::string(h100) + "\t1,2,3\t1\t8\t") != std::string::npos);
}

TEST_CASE("the gemm tuning file refuses malformed lines, naming the file and line, and bad keys") {
  corolla::testing::temp_dir_guard dir("gemm-tuning-bad");
  const std::string path = (dir / "choices.tsv").string();
  const auto with_lines = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    return error_of([&] { gemm_tuning_file f(path, h200); });
  };
  const std::string p = std::string(h200) + "\t";
  const std::string a = "\t" + algo_text + "\n";
  const std::string good = p + "1,2\t1\t4\t10\t9" + a;
  CHECK(with_lines(good + "\n" + good).empty());  // blank lines are skipped
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\t9\t" + std::string(128, 'F') + "\n").empty());  // either case
  std::array<std::uint64_t, 8> all_ones{};
  all_ones.fill(~0ULL);
  CHECK(gemm_tuning_file(path, h200).find("1,2")->algo == all_ones);
  // A line of the earlier six-field form (no algorithm) is skipped, not an
  // error: a file written before the algorithm was recorded stays usable.
  CHECK(with_lines(good + p + "3,4\t1\t4\t10\t9\n").empty());
  CHECK(gemm_tuning_file(path, h200).size() == 1);
  CHECK_FALSE(gemm_tuning_file(path, h200).find("3,4").has_value());
  const std::string expect = "gemm tuning file " + path + ":2: expected 'platform<TAB>problem<TAB>chosen";
  CHECK(with_lines(good + p + "1,2\t1\t4\t10" + a).find(expect) == 0);        // six fields
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\tx\n").find(expect) == 0);     // six, the last not a time
  CHECK(with_lines(good + p + "1,2\tone\t4\t10\t9" + a).find(expect) == 0);  // not a number
  CHECK(with_lines(good + p + "1,2\t4\t4\t10\t9" + a).find(expect) == 0);    // chosen past the answer
  CHECK(with_lines(good + p + "1,2\t-1\t4\t10\t9" + a).find(expect) == 0);   // negative
  CHECK(with_lines(good + p + "\t1\t4\t10\t9" + a).find(expect) == 0);       // no problem key
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\t9x" + a).find(expect) == 0);   // trailing text
  CHECK(with_lines(good + p + "1,2\t9\t4294967304\t10\t9" + a).find(expect) == 0);  // > 64
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\tnan" + a).find(expect) == 0);  // no time
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\t9\t" + std::string(127, 'a') + "\n").find(expect) == 0);  // short
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\t9\t" + std::string(127, 'a') + "g\n").find(expect) == 0);  // not hex
  CHECK(with_lines(good + p + "1,2\t1\t4\t10\t9" + a.substr(0, a.size() - 1) + "\tx\n").find(expect) == 0);

  std::ofstream(path, std::ios::trunc) << good;
  gemm_tuning_file f(path, h200);
  CHECK(error_of([&] { f.add("a\tb", {0, 2, 1, 1, {}}); }).find("tab or newline") != std::string::npos);
  CHECK(error_of([&] { f.add("", {0, 2, 1, 1, {}}); }).find("empty") != std::string::npos);
  gemm_tuning_file unwritable((dir / "no-such-dir" / "choices.tsv").string(), h200);  // nothing to read: empty
  CHECK(unwritable.size() == 0);
  CHECK(error_of([&] { unwritable.add("1,2", {0, 2, 1, 1, {}}); }).find("cannot open it") != std::string::npos);
}

TEST_CASE("a recorded algorithm is recognised by its bytes or, where they differ, by its configuration") {
  // cuBLASLt reads an algorithm's attributes from its bytes alone, without
  // a device (the library is loaded on first use). Which bytes hold what
  // is cuBLASLt's own: found here by setting bytes and reading back.
  using words = std::array<std::uint64_t, 8>;
  const auto with_byte = [](words w, int byte, unsigned char v) {
    reinterpret_cast<unsigned char*>(w.data())[byte] = v;
    return w;
  };
  const auto config = [](const words& w) {
    const auto c = gemm_algorithm_config(w);
    INFO("cuBLASLt could not be loaded, or read no configuration from an algorithm's bytes");
    REQUIRE(c.has_value());
    return *c;
  };
  int split_k = -1;  // a byte of the split-K count (CUBLASLT_ALGO_CONFIG_SPLITK_NUM, the third)
  for (int byte = 0; byte < 64 && split_k < 0; ++byte)
    if (config(with_byte({}, byte, 0x04))[2] != config(with_byte({}, byte, 0x02))[2]) split_k = byte;
  REQUIRE(split_k >= 0);
  const words w = with_byte({}, split_k, 0x04);
  const words split_in_two = with_byte(w, split_k, 0x02);
  REQUIRE(config(split_in_two) != config(w));
  int unread = -1;  // a byte no attribute reads, whatever it holds
  for (int byte = 0; byte < 64 && unread < 0; ++byte)
    if (config(with_byte(w, byte, 0x5a)) == config(w) && config(with_byte(w, byte, 0xff)) == config(w)) unread = byte;
  REQUIRE(unread >= 0);
  const words other = with_byte(w, unread, 0x5a);  // other bytes, w's configuration
  REQUIRE(other != w);

  const auto find = [&](std::initializer_list<words> candidates, const words& recorded) {
    const std::vector<words> c(candidates);
    return find_gemm_algorithm(c, recorded);
  };
  CHECK(find({split_in_two, w}, w) == 1);                 // the same bytes
  CHECK(find({split_in_two, other, w}, w) == 2);          // the same bytes before the same configuration
  CHECK(find({split_in_two, other}, w) == 1);             // the same configuration, other bytes
  CHECK(find({other, split_in_two}, split_in_two) == 1);  // another split-K is another algorithm
  CHECK_FALSE(find({split_in_two}, w).has_value());
  CHECK_FALSE(find({}, w).has_value());
}

#endif  // COROLLA_HAVE_CUDA
