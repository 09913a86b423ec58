// kernels/cuda/gemm_tuner.cpp — the tuner's rule, repeats, switch, totals
// and scratch span (gemm_tuner.hpp); the timing itself is in lt_matmul.cpp.
#include "kernels/cuda/gemm_tuner.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

#include "kernels/cuda/device.hpp"

namespace corolla::cuda {

int gemm_choose_timed(std::span<const double> us, double keep_first_within) {
  int best = -1;
  for (std::size_t i = 0; i < us.size(); ++i)
    if (!std::isnan(us[i]) && (best < 0 || us[i] < us[static_cast<std::size_t>(best)])) best = static_cast<int>(i);
  if (best <= 0) return 0;  // none timed, or the first is fastest
  if (std::isnan(us[0])) return best;
  return us[static_cast<std::size_t>(best)] < (1.0 - keep_first_within) * us[0] ? best : 0;
}

int gemm_tune_repeats(double flops) {
  if (!(flops > 0)) return 10;
  return static_cast<int>(std::clamp(std::ceil(gemm_tune_interval_flops / flops), 1.0, 10.0));
}

namespace {
std::atomic<bool>& tuning_flag() {
  static std::atomic<bool> on{env_switch("COROLLA_CUDA_GEMM_TUNE", true)};
  return on;
}
}  // namespace

bool gemm_tuning_requested() { return tuning_flag().load(); }

void set_gemm_tuning(bool on) { tuning_flag().store(on); }

gemm_tuning_totals gemm_tuning_summary(std::span<const gemm_choice> choices) {
  gemm_tuning_totals t;
  for (const gemm_choice& c : choices) {
    if (!std::isfinite(c.chosen_us)) continue;
    ++t.problems;
    if (c.chosen != 0) ++t.changed;
    if (c.from_file) ++t.from_file;
    const double calls = static_cast<double>(c.calls);
    t.chosen_us += calls * c.chosen_us;
    t.first_us += calls * (std::isnan(c.first_us) ? c.chosen_us : c.first_us);
  }
  return t;
}

std::int64_t lt_output_span(std::int64_t m, std::int64_t n, std::int64_t ldc, int batch, std::int64_t batch_c) {
  if (m <= 0 || n <= 0 || batch <= 0) return 0;
  if (ldc < n || batch_c < 0) throw std::invalid_argument("lt_output_span: a row stride below n or a negative batch stride");
  return (m - 1) * ldc + n + std::int64_t{batch - 1} * batch_c;
}

}  // namespace corolla::cuda
