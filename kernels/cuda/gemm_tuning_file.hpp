// kernels/cuda/gemm_tuning_file.hpp — the GEMM tuner's choices kept in a
// file across processes (host-only: no CUDA headers).
//
// With COROLLA_CUDA_GEMM_TUNE_FILE=PATH, cuda_backend::lt_matmul looks a
// problem up in PATH before timing it and runs the candidate recorded
// there; a problem timed now is appended. So a second run (a restarted
// rank, a re-planned stage, the next job on the machine) skips the timing
// and runs the same algorithms, bit for bit, as the first; ranks on one
// machine may share the file. The candidate is recorded as the algorithm
// itself: a cublasLtMatmulAlgo_t's 64 bytes, which cuBLASLt documents as
// serialisable for the same library version. A later process runs it only
// if the heuristic names it again for the problem (at any position: the
// answer's order may differ with its length; the same bytes, or failing
// those the same configuration: find_gemm_algorithm); else the problem is
// timed anew. Lines of the earlier six-field form (no algorithm) are
// skipped. Lines are kept per platform (device, SM count, cuBLASLt version
// and workspace size), and a line of another platform is left alone.
//
// One line per problem, tab-separated:
//   platform  problem  chosen  candidates  first_us  chosen_us  algorithm
// problem is the lt_key's numbers (lt_matmul.cpp's problem_key); chosen
// and candidates the chosen's index in the heuristic's answer and its
// length when it was timed (for reading; the algorithm is what counts);
// algorithm 128 hex digits (its eight 64-bit words). A later line of a
// problem overrides an earlier one. Lines are appended with one write
// each (O_APPEND), so processes sharing the file interleave whole lines.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

namespace corolla::cuda {

/// PATH of COROLLA_CUDA_GEMM_TUNE_FILE, "" when unset or empty.
std::string gemm_tuning_file_path();

/// A cublasLtMatmulAlgo_t's (its eight words') configuration as cuBLASLt
/// reads it back: the nine cublasLtMatmulAlgoConfigAttributes_t (its id,
/// tile, split-K count, reduction scheme, swizzling, custom option,
/// stages, inner and cluster shapes) in that enum's order, each widened to
/// 64 bits; nullopt where cuBLASLt answers none (no library).
std::optional<std::array<std::uint64_t, 9>> gemm_algorithm_config(const std::array<std::uint64_t, 8>& algo);

/// Where the recorded algorithm is among the heuristic's `candidates`: the
/// first of the same bytes (the same algorithm, bit for bit), else the
/// first of the same configuration (gemm_algorithm_config), which keeps it
/// recognisable should bytes cuBLASLt leaves unspecified differ between
/// the process that wrote it and this one; nullopt if neither.
std::optional<int> find_gemm_algorithm(std::span<const std::array<std::uint64_t, 8>> candidates,
                                       const std::array<std::uint64_t, 8>& recorded);

/// What a results file recorded for a problem.
struct gemm_tuning_entry {
  int chosen = 0;       ///< index in the heuristic's answer
  int candidates = 0;   ///< how many the heuristic named when it was timed
  double first_us = 0;  ///< the heuristic's first, then
  double chosen_us = 0; ///< the chosen, then
  std::array<std::uint64_t, 8> algo{};  ///< the chosen: a cublasLtMatmulAlgo_t's bytes
};

class gemm_tuning_file {
 public:
  /// Reads `path` (a missing file is empty), keeping the lines of
  /// `platform`. A malformed line (or candidates above 64, a chosen_us
  /// that is not finite, an algorithm not of 128 hex digits) throws std::runtime_error naming path:line; so
  /// does a file that cannot be read. lt_matmul then warns and goes on
  /// without the file, as it does when a line cannot be appended.
  gemm_tuning_file(std::string path, std::string platform);

  /// What was recorded for `problem` on this platform, if anything.
  std::optional<gemm_tuning_entry> find(const std::string& problem) const;
  /// Records `e` for `problem` and appends its line to the file. Throws
  /// std::runtime_error naming the path when it cannot be written.
  void add(const std::string& problem, const gemm_tuning_entry& e);

  const std::string& path() const { return path_; }
  const std::string& platform() const { return platform_; }
  /// Problems of this platform known (read or added).
  std::size_t size() const { return entries_.size(); }

 private:
  std::string path_, platform_;
  std::map<std::string, gemm_tuning_entry> entries_;
};

}  // namespace corolla::cuda
