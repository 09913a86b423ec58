// model/optimizer.hpp — AdamW over a model's parameter groups.
//
// Each group (a block, the head) is one flat f32 buffer with a gradient
// buffer of the same layout (see params.hpp); the optimiser keeps a first
// and second moment buffer per group in that same layout, so every update is
// one Backend::adamw call on a flat range. Later work shards these buffers
// ZeRO-1 style: the moments are exposed as param_sets (whole flat buffers or
// named views) so a shard is just a sub-range of them.
//
// The update is torch.optim.AdamW's, applied to *every* parameter (biases,
// norms and embeddings included: no exclusion list):
//   p *= 1 - lr * wd
//   m  = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with t the step number counted from 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/loss_scale.hpp"
#include "model/params.hpp"
#include "model/transformer.hpp"

namespace corolla {

/// How the learning rate moves over a run of N steps (1-based step t):
/// linear warm-up from lr/warmup_steps to lr over the first warmup_steps
/// steps, then constant, or with `cosine` a half cosine from lr down to
/// final_ratio x lr at step N. Single-process and distributed training
/// apply the same rule.
struct lr_schedule {
  int warmup_steps = 0;
  bool cosine = false;
  float final_ratio = 0.1f;
};

/// The learning rate of step `step` (1-based) of `total` for base rate `lr`.
float scheduled_lr(float lr, const lr_schedule& s, int step, int total);

/// Everything that configures an adamw_optimizer.
struct optimizer_settings {
  adamw_params adamw;        ///< lr, betas, eps, decoupled weight decay
  /// Clip gradients so their global L2 norm (over every group) is at most
  /// this; <= 0 turns clipping off (the default).
  float max_grad_norm = 0.0f;
  /// The learning-rate schedule (the trainers set adamw.lr from it each step).
  lr_schedule schedule;
  /// Dynamic loss scaling (loss_scale.hpp); off by default. The trainers
  /// scale the loss gradient and call step_unscaling when it is on.
  loss_scaling loss_scale;
};

/// The factor a step multiplies gradients by before AdamW: 1 / loss_scale
/// (unscaling), times torch.nn.utils.clip_grad_norm_'s coefficient
/// max_grad_norm / (norm + 1e-6) when clipping is on (max_grad_norm > 0)
/// and the unscaled norm `scaled_norm / loss_scale` exceeds max_grad_norm.
/// `scaled_norm` is the global L2 norm of the gradients as they are.
double grad_coefficient(double scaled_norm, float loss_scale, float max_grad_norm);

/// Why `adamw` (and clipping at `max_grad_norm`) cannot train, naming the
/// command-line flag and the value ("--lr must be a finite number >= 0, got
/// nan"); empty when they can: lr finite and >= 0; --beta1 and --beta2 in
/// [0, 1); --eps finite and > 0; --weight-decay finite and >= 0; --grad-clip
/// finite (<= 0 turns clipping off). A NaN here would train to NaN and,
/// saved, overwrite a good model.
std::string adamw_problem(const adamw_params& adamw, float max_grad_norm = 0.0f);

/// AdamW with bias correction over a fixed list of parameter groups.
///
/// The groups' param_sets are borrowed: they must outlive the optimiser and
/// keep their layout. Not thread-safe; one caller steps it at a time.
class adamw_optimizer {
 public:
  /// Allocates zeroed m and v buffers for every group on the device of the
  /// group's parameters. Throws std::invalid_argument for a group with a
  /// null pointer or gradients whose size differs from the parameters.
  adamw_optimizer(std::vector<param_group> groups, const optimizer_settings& settings,
                  Backend& be);

  /// Global L2 norm of the gradients over every group (accumulated in f64).
  double grad_norm() const;

  /// One optimiser step: clips the gradients if clipping is on (scaling them
  /// by max_grad_norm / (norm + 1e-6) when the norm exceeds max_grad_norm,
  /// as torch.nn.utils.clip_grad_norm_ does), then applies AdamW to every
  /// group with step number steps() + 1. The clipping factor is applied
  /// inside AdamW's pass (adamw_params::grad_scale): the gradient buffers are
  /// left as they were. Returns the gradient norm before clipping when
  /// clipping is on, or -1 when it is off (the norm is then not computed,
  /// saving a pass over the gradients).
  double step();

  /// One step on gradients of a loss multiplied by `loss_scale` (dynamic
  /// loss scaling, loss_scale.hpp): the global norm is always computed.
  /// When it is not finite (the scaled backward overflowed) nothing changes,
  /// not even steps(), and that norm is returned: the caller skips the step.
  /// Otherwise AdamW runs on the gradients times grad_coefficient
  /// (unscaling and clipping inside AdamW's pass; the buffers are left
  /// scaled), and the unscaled norm is returned (before clipping).
  double step_unscaling(float loss_scale);

  /// Steps taken so far (the bias-correction counter; 0 before the first).
  std::int64_t steps() const { return steps_; }
  /// Restores the step counter (from a checkpoint). Must be >= 0.
  void set_steps(std::int64_t steps);

  /// Current hyper-parameters (lr reflects set_lr).
  const optimizer_settings& settings() const { return settings_; }
  /// Changes the learning rate for subsequent steps (schedules).
  void set_lr(float lr) { settings_.adamw.lr = lr; }

  /// Number of parameter groups, in the order given to the constructor.
  std::size_t group_count() const { return groups_.size(); }
  /// Group `g`'s parameters and gradients (borrowed pointers).
  const param_group& group(std::size_t g) const { return groups_.at(g); }
  /// First-moment buffer of group `g` (same layout as its parameters);
  /// writable so checkpoints can restore it.
  param_set& m(std::size_t g) { return m_.at(g); }
  const param_set& m(std::size_t g) const { return m_.at(g); }
  /// Second-moment buffer of group `g`.
  param_set& v(std::size_t g) { return v_.at(g); }
  const param_set& v(std::size_t g) const { return v_.at(g); }
  /// Total elements over every group's flat buffer (layout padding included).
  std::int64_t size() const;

  /// 16-bit copies of the groups' parameters (transformer::compute_copies:
  /// one per group, in order; an undefined tensor for a group without)
  /// that each update writes in its own pass (Backend::adamw_with_copy),
  /// the updated parameters rounded once. Empty (the default): none.
  /// Throws std::invalid_argument for another count, or a copy whose size
  /// differs from its group's.
  void set_compute_copies(std::vector<Tensor> copies);
  /// Whether an update writes any compute copy (set_compute_copies).
  bool writes_compute_copies() const;

 private:
  /// step() (check = false, loss_scale 1) and step_unscaling (check = true).
  double update(float loss_scale, bool check);

  std::vector<param_group> groups_;
  std::vector<Tensor> copies_;  ///< set_compute_copies': per group, or empty
  std::vector<param_set> m_;
  std::vector<param_set> v_;
  optimizer_settings settings_;
  Backend* be_;
  std::int64_t steps_ = 0;
};

}  // namespace corolla
