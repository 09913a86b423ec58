#include "model/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace corolla {

namespace {

// Moments live where the parameters live; param_set::like() allocates on the
// host, so for a device-resident group the zeroed host buffer is copied over.
param_set zeros_like(const param_set& params, Backend& be) {
  param_set r = params.like();
  if (params.flat().dev().kind != device_kind::cpu) {
    Tensor dev = be.empty({r.size()}, dtype::f32);
    be.copy(r.flat(), dev);
    r.flat() = dev;
  }
  return r;
}

}  // namespace

float scheduled_lr(float lr, const lr_schedule& s, int step, int total) {
  double f = 1.0;
  if (s.warmup_steps > 0 && step <= s.warmup_steps) {
    f = static_cast<double>(step) / s.warmup_steps;
  } else if (s.cosine && total > s.warmup_steps) {
    const double progress =
        std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(total - s.warmup_steps));
    f = s.final_ratio + (1.0 - s.final_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return static_cast<float>(lr * f);
}

std::string adamw_problem(const adamw_params& p, float max_grad_norm) {
  auto bad = [](const char* flag, const char* rule, float v) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", static_cast<double>(v));
    return std::string(flag) + " must be " + rule + ", got " + value;
  };
  if (!std::isfinite(p.lr) || p.lr < 0) return bad("--lr", "a finite number >= 0", p.lr);
  if (!(p.beta1 >= 0 && p.beta1 < 1)) return bad("--beta1", "in [0, 1)", p.beta1);
  if (!(p.beta2 >= 0 && p.beta2 < 1)) return bad("--beta2", "in [0, 1)", p.beta2);
  if (!std::isfinite(p.eps) || p.eps <= 0) return bad("--eps", "a finite number > 0", p.eps);
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0)
    return bad("--weight-decay", "a finite number >= 0", p.weight_decay);
  // A negative norm would read as "no clipping" without a word.
  if (!std::isfinite(max_grad_norm) || max_grad_norm < 0)
    return bad("--grad-clip", "a finite number >= 0 (0 = no clipping)", max_grad_norm);
  return {};
}

adamw_optimizer::adamw_optimizer(std::vector<param_group> groups,
                                 const optimizer_settings& settings, Backend& be)
    : groups_(std::move(groups)), settings_(settings), be_(&be) {
  m_.reserve(groups_.size());
  v_.reserve(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const param_group& grp = groups_[g];
    if (grp.params == nullptr || grp.grads == nullptr)
      throw std::invalid_argument("adamw_optimizer: group " + std::to_string(g) +
                                  " has no parameters or no gradients");
    if (grp.params->size() != grp.grads->size())
      throw std::invalid_argument("adamw_optimizer: group " + std::to_string(g) + " has " +
                                  std::to_string(grp.params->size()) + " parameters but " +
                                  std::to_string(grp.grads->size()) + " gradients");
    m_.push_back(zeros_like(*grp.params, be));
    v_.push_back(zeros_like(*grp.params, be));
  }
}

double adamw_optimizer::grad_norm() const {
  double sum = 0.0;
  for (const param_group& grp : groups_)
    if (grp.grads->size() > 0) sum += be_->sum_squares(grp.grads->flat());
  return std::sqrt(sum);
}

double grad_coefficient(double scaled_norm, float loss_scale, float max_grad_norm) {
  const double unscale = 1.0 / static_cast<double>(loss_scale);
  if (!(max_grad_norm > 0.0f)) return unscale;
  // Same coefficient as torch.nn.utils.clip_grad_norm_ (the 1e-6 keeps a
  // zero norm finite); gradients below the limit are left untouched.
  const double clip = static_cast<double>(max_grad_norm) / (scaled_norm * unscale + 1e-6);
  return clip < 1.0 ? unscale * clip : unscale;
}

double adamw_optimizer::step() { return update(1.0f, false); }

double adamw_optimizer::step_unscaling(float loss_scale) { return update(loss_scale, true); }

double adamw_optimizer::update(float loss_scale, bool check) {
  const bool clip = settings_.max_grad_norm > 0.0f;
  double norm = -1.0;
  double coef = 1.0;
  if (clip || check) {
    const double scaled = grad_norm();
    if (check && overflowed(scaled)) return scaled;
    coef = grad_coefficient(scaled, loss_scale, settings_.max_grad_norm);
    norm = scaled / static_cast<double>(loss_scale);
  }
  // Unscaling and clipping ride in the update's own pass (grad_scale: the
  // same f32 product a separate scale pass would store).
  adamw_params w = settings_.adamw;
  w.grad_scale *= static_cast<float>(coef);
  ++steps_;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    param_group& grp = groups_[g];
    if (grp.params->size() == 0) continue;
    if (g < copies_.size() && copies_[g].defined())
      be_->adamw_with_copy(grp.params->flat(), grp.grads->flat(), m_[g].flat(), v_[g].flat(), w, steps_, copies_[g]);
    else
      be_->adamw(grp.params->flat(), grp.grads->flat(), m_[g].flat(), v_[g].flat(), w, steps_);
  }
  return norm;
}

void adamw_optimizer::set_compute_copies(std::vector<Tensor> copies) {
  if (!copies.empty() && copies.size() != groups_.size())
    throw std::invalid_argument("adamw_optimizer: " + std::to_string(copies.size()) + " compute copies for " +
                                std::to_string(groups_.size()) + " groups");
  for (std::size_t g = 0; g < copies.size(); ++g)
    if (copies[g].defined() && copies[g].numel() != groups_[g].params->size())
      throw std::invalid_argument("adamw_optimizer: a compute copy of " + std::to_string(copies[g].numel()) +
                                  " elements for group " + std::to_string(g) + " of " +
                                  std::to_string(groups_[g].params->size()));
  copies_ = std::move(copies);
}

bool adamw_optimizer::writes_compute_copies() const {
  for (const Tensor& c : copies_)
    if (c.defined()) return true;
  return false;
}

void adamw_optimizer::set_steps(std::int64_t steps) {
  if (steps < 0) throw std::invalid_argument("adamw_optimizer: negative step count");
  steps_ = steps;
}

std::int64_t adamw_optimizer::size() const {
  std::int64_t n = 0;
  for (const param_group& grp : groups_) n += grp.params->size();
  return n;
}

}  // namespace corolla
