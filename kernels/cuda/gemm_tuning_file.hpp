// kernels/cuda/gemm_tuning_file.hpp — the GEMM tuner's choices kept in a
// file across processes (host-only: no CUDA headers).
//
// With COROLLA_CUDA_GEMM_TUNE_FILE=PATH, cuda_backend::lt_matmul looks a
// problem up in PATH before timing it and runs the candidate recorded
// there; a problem timed now is appended. So a second run (a restarted
// rank, a re-planned stage, the next job on the machine) skips the timing
// and runs the same algorithms, bit for bit, as the first; ranks on one
// machine may share the file. The candidate is recorded as its index in
// the heuristic's answer, which the same library on the same device gives
// in the same order: lines are kept per platform (device and cuBLASLt
// version), and a line of another platform is left alone.
//
// One line per problem, tab-separated:
//   platform  problem  chosen  candidates  first_us  chosen_us
// problem is the lt_key's numbers (lt_matmul.cpp's problem_key); a later
// line of a problem overrides an earlier one. Lines are appended with one
// write each (O_APPEND), so processes sharing the file interleave whole
// lines.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace corolla::cuda {

/// PATH of COROLLA_CUDA_GEMM_TUNE_FILE, "" when unset or empty.
std::string gemm_tuning_file_path();

/// What a results file recorded for a problem.
struct gemm_tuning_entry {
  int chosen = 0;       ///< index in the heuristic's answer
  int candidates = 0;   ///< how many the heuristic named when it was timed
  double first_us = 0;  ///< the heuristic's first, then
  double chosen_us = 0; ///< the chosen, then
};

class gemm_tuning_file {
 public:
  /// Reads `path` (a missing file is empty), keeping the lines of
  /// `platform`. A malformed line (or candidates above 64, or a chosen_us
  /// that is not finite) throws std::runtime_error naming path:line; so
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
