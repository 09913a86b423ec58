// kernels/cuda/gemm_tuning_file.cpp — the GEMM tuner's results file
// (gemm_tuning_file.hpp).
#include "kernels/cuda/gemm_tuning_file.hpp"

#include <cublasLt.h>
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace corolla::cuda {
namespace {

/// More candidates than the tuner ever asks for: not a line it wrote.
constexpr long max_candidates = 64;

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t from = 0;
  for (;;) {
    const std::size_t tab = line.find('\t', from);
    fields.push_back(line.substr(from, tab == std::string::npos ? std::string::npos : tab - from));
    if (tab == std::string::npos) return fields;
    from = tab + 1;
  }
}

/// `text` as a whole number or a number (NaN for "nan"); nullopt otherwise.
std::optional<long> whole(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) return std::nullopt;
  return v;
}
std::optional<double> number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') return std::nullopt;
  return v;
}

/// An algorithm's eight words as 128 hex digits, and back (nullopt unless
/// exactly that).
constexpr std::size_t algo_digits = 8 * 16;
std::string hex_of(const std::array<std::uint64_t, 8>& words) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  text.reserve(algo_digits);
  for (const std::uint64_t w : words)
    for (int shift = 60; shift >= 0; shift -= 4) text.push_back(digits[(w >> shift) & 0xf]);
  return text;
}
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
std::optional<std::array<std::uint64_t, 8>> words_of(const std::string& text) {
  if (text.size() != algo_digits) return std::nullopt;
  std::array<std::uint64_t, 8> words{};
  for (std::size_t i = 0; i < algo_digits; ++i) {
    const int v = hex_value(text[i]);
    if (v < 0) return std::nullopt;
    words[i / 16] = (words[i / 16] << 4) | static_cast<std::uint64_t>(v);
  }
  return words;
}

}  // namespace

std::optional<std::array<std::uint64_t, 9>> gemm_algorithm_config(const std::array<std::uint64_t, 8>& algo) {
  static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof algo);
  static_assert(CUBLASLT_ALGO_CONFIG_ID == 0 && CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID == 8);
  static_assert(std::endian::native == std::endian::little);  // an attribute's bytes widen into the low ones
  cublasLtMatmulAlgo_t a;
  std::memcpy(&a, algo.data(), sizeof a);
  std::array<std::uint64_t, 9> config{};
  for (std::size_t i = 0; i < config.size(); ++i) {
    const auto attr = static_cast<cublasLtMatmulAlgoConfigAttributes_t>(CUBLASLT_ALGO_CONFIG_ID + i);
    std::size_t size = 0, wrote = 0;  // the attribute's exact size, which the read must name
    if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS || size == 0 ||
        size > sizeof config[i] ||
        cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &config[i], size, &wrote) != CUBLAS_STATUS_SUCCESS ||
        wrote != size)
      return std::nullopt;
  }
  return config;
}

std::optional<int> find_gemm_algorithm(std::span<const std::array<std::uint64_t, 8>> candidates,
                                       const std::array<std::uint64_t, 8>& recorded) {
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i] == recorded) return static_cast<int>(i);
  const auto config = gemm_algorithm_config(recorded);
  for (std::size_t i = 0; config && i < candidates.size(); ++i)
    if (gemm_algorithm_config(candidates[i]) == config) return static_cast<int>(i);
  return std::nullopt;
}

std::string gemm_tuning_file_path() {
  const char* v = std::getenv("COROLLA_CUDA_GEMM_TUNE_FILE");
  return v ? v : "";
}

gemm_tuning_file::gemm_tuning_file(std::string path, std::string platform)
    : path_(std::move(path)), platform_(std::move(platform)) {
  if (platform_.find_first_of("\t\n") != std::string::npos)
    throw std::invalid_argument("gemm tuning file: a platform name with a tab or newline");
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return;  // nothing recorded yet
    throw std::runtime_error("gemm tuning file " + path_ + ": cannot read it: " + std::strerror(errno));
  }
  std::string line;
  for (int number_of_line = 1; std::getline(in, line); ++number_of_line) {
    if (line.empty()) continue;
    const std::vector<std::string> f = split_tabs(line);
    // The earlier form (no algorithm: its sixth field is the chosen time):
    // skipped, so its problems are timed anew and recorded in this form.
    if (f.size() == 6 && whole(f[2]) && whole(f[3]) && number(f[4]) && number(f[5]) &&
        f[5].size() != algo_digits)
      continue;
    const bool seven = f.size() == 7;
    const auto chosen = seven ? whole(f[2]) : std::nullopt;
    const auto candidates = seven ? whole(f[3]) : std::nullopt;
    const auto first = seven ? number(f[4]) : std::nullopt;
    const auto best = seven ? number(f[5]) : std::nullopt;
    const auto algo = seven ? words_of(f[6]) : std::nullopt;
    if (!chosen || !candidates || !first || !best || !algo || *chosen < 0 || *candidates <= *chosen ||
        *candidates > max_candidates || !std::isfinite(*best) || f[1].empty())
      throw std::runtime_error("gemm tuning file " + path_ + ":" + std::to_string(number_of_line) +
                               ": expected 'platform<TAB>problem<TAB>chosen<TAB>candidates<TAB>first_us<TAB>"
                               "chosen_us<TAB>algorithm' with 0 <= chosen < candidates <= " +
                               std::to_string(max_candidates) + ", a finite chosen_us and 128 hex digits");
    if (f[0] != platform_) continue;  // another device or library: its choices are not ours
    entries_[f[1]] = {static_cast<int>(*chosen), static_cast<int>(*candidates), *first, *best, *algo};
  }
  if (in.bad()) throw std::runtime_error("gemm tuning file " + path_ + ": read failed");
}

std::optional<gemm_tuning_entry> gemm_tuning_file::find(const std::string& problem) const {
  if (auto it = entries_.find(problem); it != entries_.end()) return it->second;
  return std::nullopt;
}

void gemm_tuning_file::add(const std::string& problem, const gemm_tuning_entry& e) {
  if (problem.empty() || problem.find_first_of("\t\n") != std::string::npos)
    throw std::invalid_argument("gemm tuning file: a problem key that is empty or has a tab or newline");
  std::ostringstream line;
  line.precision(17);
  line << platform_ << '\t' << problem << '\t' << e.chosen << '\t' << e.candidates << '\t' << e.first_us << '\t'
       << e.chosen_us << '\t' << hex_of(e.algo) << '\n';
  const std::string text = line.str();
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("gemm tuning file " + path_ + ": cannot open it: " + std::strerror(errno));
  const ssize_t wrote = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (wrote != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("gemm tuning file " + path_ + ": cannot append to it: " +
                             std::strerror(wrote < 0 ? err : EIO));
  entries_[problem] = e;
}

}  // namespace corolla::cuda
