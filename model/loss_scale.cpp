#include "model/loss_scale.hpp"

#include <cmath>
#include <stdexcept>

namespace corolla {

namespace {

bool power_of_two(double x) {
  if (!(x > 0.0) || !std::isfinite(x)) return false;
  int e = 0;
  return std::frexp(x, &e) == 0.5;
}

void check_scale(double scale, const loss_scaling& s) {
  if (!power_of_two(scale))
    throw std::invalid_argument("loss scale must be a positive power of two, got " + std::to_string(scale));
  if (scale < s.min_scale)
    throw std::invalid_argument("loss scale " + std::to_string(scale) + " is below the minimum " +
                                std::to_string(s.min_scale));
}

}  // namespace

loss_scaler::loss_scaler(const loss_scaling& s) : s_(s) {
  if (!s_.dynamic) return;
  if (s_.growth_interval < 1)
    throw std::invalid_argument("loss scale growth interval must be at least 1, got " +
                                std::to_string(s_.growth_interval));
  if (!(s_.min_scale > 0.0f))
    throw std::invalid_argument("minimum loss scale must be positive");
  check_scale(s_.init_scale, s_);
  state_.scale = s_.init_scale;
}

void loss_scaler::update(bool overflow) {
  if (!s_.dynamic) return;
  if (overflow) {
    ++state_.skipped;
    state_.good_steps = 0;
    const double next = state_.scale * 0.5;
    if (next < s_.min_scale)
      throw std::runtime_error("gradients are not finite even at loss scale " + std::to_string(state_.scale) +
                               " (" + std::to_string(state_.skipped) +
                               " steps skipped): training diverged or a NaN entered the model");
    state_.scale = next;
    return;
  }
  if (++state_.good_steps >= s_.growth_interval) {
    state_.good_steps = 0;
    // f16 gradients overflow long before this; the cap keeps the float finite.
    if (state_.scale < 1e30) state_.scale *= 2.0;
  }
}

void loss_scaler::set_state(const loss_scale_state& st) {
  if (st.good_steps < 0 || st.skipped < 0) throw std::invalid_argument("negative loss-scale step counts");
  if (!s_.dynamic) {
    state_.skipped = st.skipped;
    return;
  }
  check_scale(st.scale, s_);
  state_ = st;
}

bool overflowed(double grad_norm) { return !std::isfinite(grad_norm); }

loss_scaling parse_loss_scaling(const std::string& text, bool compute_is_f16) {
  loss_scaling s;
  if (text == "dynamic")
    s.dynamic = true;
  else if (text == "auto")
    s.dynamic = compute_is_f16;
  else if (text != "off")
    throw std::invalid_argument("--loss-scale must be auto, dynamic or off, got '" + text + "'");
  return s;
}

const char* loss_scaling_name(const loss_scaling& s) { return s.dynamic ? "dynamic" : "off"; }

}  // namespace corolla
