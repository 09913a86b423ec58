// kernels/cuda/gemm_tuner.hpp — choosing a cuBLASLt algorithm by timing the
// heuristic's candidates (host-only: no CUDA headers).
//
// cuBLASLt's heuristic ranks the algorithms it has for a problem from a
// model of the device, not from a run; on shapes that fill the device
// unevenly (GPT-2-1.5B's 1600 and 6400 wide products on 132 multiprocessors)
// its first is often not the fastest. So cuda_backend::lt_matmul
// (lt_matmul.cpp) asks it for up to gemm_tune_candidates algorithms the
// first time it meets a problem, times each on that call's own operands,
// and keeps the one gemm_choose_timed picks for every later call of the
// problem (the same idea as PyTorch's TunableOp). What is timed and how
// (the limits below, the repeats per timed interval, the size of a scratch
// output), the rule and the records are here, free of CUDA, so the CPU
// tests check them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace corolla::cuda {

/// How many of the heuristic's algorithms a problem's first call times.
constexpr int gemm_tune_candidates = 8;
/// Timed rounds (after one warm-up launch each) of gemm_tune_repeats
/// launches; each algorithm keeps its fastest round's time per launch, and
/// the algorithms take turns within a round, so clock ramps and drift hit
/// all alike.
constexpr int gemm_tune_rounds = 3;
/// Products of fewer FLOPs (all of a batch's) are not timed: a few
/// microseconds each, their time is their launch's, whatever the algorithm.
constexpr double gemm_tune_min_flops = 4e9;
/// A timed interval covers at least this many FLOPs (gemm_tune_repeats).
constexpr double gemm_tune_interval_flops = 40e9;
/// At most this many problems are timed per backend instance (then the
/// heuristic's first): a bound on what timing can cost a process that
/// meets ever new shapes.
constexpr int gemm_tune_max_problems = 256;
/// A scratch output (where the call reads its own d) above this size is
/// not allocated: the problem keeps the heuristic's first.
constexpr std::int64_t gemm_tune_max_scratch_bytes = std::int64_t{128} << 20;

/// Launches back to back per timed interval for a product of `flops`: enough
/// for gemm_tune_interval_flops (so the GPU runs them without waiting on
/// the host's launches), 1 to 10.
int gemm_tune_repeats(double flops);

/// Another algorithm replaces the heuristic's first only if it is faster by
/// this fraction: timing noise alone should not move a product off the
/// algorithm a reader of cuBLASLt's documentation would expect (nor change
/// its bits against COROLLA_CUDA_GEMM_TUNE=0, which runs that first too).
constexpr double gemm_keep_first_within = 0.03;

/// The index among timed candidates to run: the fastest of `us`
/// (microseconds; NaN where a candidate was not timed or refused to run),
/// unless it beats index 0 by less than `keep_first_within` (a fraction of
/// us[0]). Where us[0] is NaN the fastest timed one runs; 0 when none was
/// timed (or us is empty). Ties keep the lower index.
int gemm_choose_timed(std::span<const double> us, double keep_first_within = gemm_keep_first_within);

/// Whether lt_matmul times a problem's candidates on its first call:
/// COROLLA_CUDA_GEMM_TUNE in the environment (on by default; 0, off, false
/// or no turn it off), or set_gemm_tuning. Process-wide; a problem already
/// met keeps the algorithm it has.
bool gemm_tuning_requested();
void set_gemm_tuning(bool on);

/// What the tuner did for one problem (one cuda_backend::lt_key).
struct gemm_choice {
  std::int64_t m = 0, n = 0, k = 0;  ///< row-major: [m, k] x [k, n] (either transposed)
  int batch = 1;
  std::string what;        ///< dtypes, transposes and epilogue, e.g. "bf16 x bf16 -> f32, a^T, bias epilogue"
  int candidates = 0;      ///< the algorithms the heuristic named (those that refused to run included)
  int chosen = 0;          ///< the index run (0: the heuristic's first)
  double first_us = 0;     ///< one launch of the heuristic's first (NaN if it refused)
  double chosen_us = 0;    ///< one launch of the chosen (finite: a problem none ran for is not recorded)
  std::uint64_t calls = 0; ///< lt_matmul calls of the problem since (its first included)
  /// Not timed now: the choice (and both times) read from
  /// COROLLA_CUDA_GEMM_TUNE_FILE (gemm_tuning_file.hpp).
  bool from_file = false;
};

/// A tuner's gain at the calls made: sum over problems of calls x the
/// first's and the chosen's microseconds (problems whose first was not
/// timed count at the chosen's time on both sides; a record without a
/// finite chosen time is left out). Problems read from the tuning file
/// count with the times its writer measured.
struct gemm_tuning_totals {
  int problems = 0;      ///< problems timed (here or, from_file, by the file's writer)
  int changed = 0;       ///< of those, run with another algorithm than the heuristic's first
  int from_file = 0;     ///< of those, read from COROLLA_CUDA_GEMM_TUNE_FILE, untimed here
  double first_us = 0;   ///< at the heuristic's firsts
  double chosen_us = 0;  ///< at the chosen
  /// first_us / chosen_us: above 1 where tuning saved time (1 with no calls).
  double speedup() const { return chosen_us > 0 ? first_us / chosen_us : 1.0; }
};
gemm_tuning_totals gemm_tuning_summary(std::span<const gemm_choice> choices);

/// Elements an output of m rows of n (row stride ldc), `batch` of them
/// `batch_c` apart, spans from its first: what a scratch copy of it needs.
std::int64_t lt_output_span(std::int64_t m, std::int64_t n, std::int64_t ldc, int batch, std::int64_t batch_c);

}  // namespace corolla::cuda
