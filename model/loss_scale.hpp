// model/loss_scale.hpp — dynamic loss scaling for 16-bit training.
//
// In f16, hidden-state gradients of a large batch fall below the smallest
// normal (6e-5) and then below the smallest subnormal (6e-8): the backward
// flushes them to zero. Multiplying the loss gradient by a scale S lifts
// every gradient of the backward by S; the f32 parameter gradients are
// divided by S again before the update. S is dynamic, as in
// torch.cuda.amp.GradScaler: a step whose gradients hold inf or NaN (the
// scaled backward overflowed f16's 65504) is skipped — no parameter or
// moment changes, AdamW's step counter does not advance — and S is halved;
// after `growth_interval` finite steps in a row S doubles. S stays a power
// of two, so scaling and unscaling are exact.
//
// Single-process training and every distributed rank run the same
// loss_scaler; ranks take the overflow verdict from the coordinator's
// global gradient norm, so they all skip the same steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace corolla {

/// How the loss is scaled (see the file comment).
struct loss_scaling {
  bool dynamic = false;            ///< off: the scale is 1 and nothing is checked
  float init_scale = 65536.0f;     ///< the first scale (2^16, as torch's)
  int growth_interval = 2000;      ///< finite steps in a row before the scale doubles
  /// Below this, another overflow is an error: the gradients are not
  /// finite at any scale (the loss itself diverged, or a NaN entered).
  float min_scale = 1.0f / 65536.0f;
};

/// What a loss_scaler carries from one step to the next (and into
/// checkpoints, so a resumed run scales as the uninterrupted one).
struct loss_scale_state {
  double scale = 1.0;
  int good_steps = 0;           ///< finite steps since the scale last changed
  std::int64_t skipped = 0;     ///< steps skipped for overflow so far
  bool operator==(const loss_scale_state&) const = default;
};

/// The dynamic scale of one training run. Not thread-safe.
class loss_scaler {
 public:
  /// Throws std::invalid_argument for a scale that is not a positive power
  /// of two, a growth interval < 1, or min_scale above init_scale.
  explicit loss_scaler(const loss_scaling& s = {});

  bool dynamic() const { return s_.dynamic; }
  /// The factor to multiply the loss gradient by this step (1 when off).
  float scale() const { return static_cast<float>(state_.scale); }
  /// Records the step's verdict: `overflow` = its gradients were not finite
  /// (the step was skipped). Throws std::runtime_error when the scale would
  /// fall below min_scale. Does nothing when off.
  void update(bool overflow);

  const loss_scale_state& state() const { return state_; }
  /// Restores a checkpoint's state (validated as the constructor does).
  /// Off, only the count of skipped steps is taken (the scale stays 1): a
  /// run resumed without scaling still counts its optimiser updates right.
  void set_state(const loss_scale_state& st);

 private:
  loss_scaling s_;
  loss_scale_state state_;
};

/// Whether a gradient norm says the step overflowed (inf or NaN).
bool overflowed(double grad_norm);

/// Parses a --loss-scale value: "dynamic", "off", or "auto" (dynamic
/// exactly when `compute_is_f16`). Throws std::invalid_argument otherwise.
loss_scaling parse_loss_scaling(const std::string& text, bool compute_is_f16);

/// "dynamic" or "off".
const char* loss_scaling_name(const loss_scaling& s);

}  // namespace corolla
