// actors/stage_compute.hpp — what a training rank's stage does with one
// micro-batch: the model's arithmetic, or (benchmarks of emulated clusters
// on one machine) its modelled time. The stage actor (train_rank.cpp) runs
// the pipeline program and moves activations and gradients between ranks;
// it calls a stage_compute for the forward and backward ops only, so the
// program, the messages and the DP group's work are the same in both.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/stage.hpp"

namespace corolla {

class Backend;
struct dist_train_options;

/// Tensors of one micro-batch kept between its forward and backward.
struct in_flight {
  Tensor x, y, dy, dx;
  stage_activations acts;
};

/// This rank's share of the model: one part per chunk (one without
/// interleaving), and the head on the first and last stage.
struct stage_model {
  std::vector<stage> parts;
  std::optional<head> head_part;
  /// LoRA (dist_train_options::lora): the adapter this rank trains beside
  /// its frozen blocks and head (the parts hand it their adapted weights'
  /// inputs and output gradients), and each part's factors, which the
  /// parts point at (one per part, never reallocated).
  std::unique_ptr<lora_adapter> adapter;
  std::vector<span_lora> factors;

  /// After an update of the adapter: factors in a 16-bit compute dtype are
  /// converted again (f32 ones are views of the adapter's own tensors).
  void refresh_factors();
};

/// The forward and backward of one rank's stage.
class stage_compute {
 public:
  virtual ~stage_compute() = default;
  /// A new step on the global batch `ids` / `targets` (every replica's
  /// sequences; each rank takes its replica's): gradients start from zero.
  virtual void begin_step(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& targets) = 0;
  /// Micro-batch `k` through chunk `chunk` (virtual stage `v`): reads f.x
  /// (embeds the tokens on virtual stage 0), writes f.y.
  virtual void forward(int k, int chunk, int v, in_flight& f) = 0;
  /// The backward of micro-batch `k`: reads f.dy (the loss's gradient, on
  /// the last virtual stage), writes f.dx and frees the rest. When `final`
  /// (the chunk's last backward of the step) calls `on_block(block)` as
  /// each block's gradients become final, last block first. Returns this
  /// micro-batch's share of the step's mean loss (0 before the last
  /// virtual stage).
  virtual double backward(int k, int chunk, int v, in_flight& f, bool final, float loss_scale,
                          const std::function<void(int)>& on_block) = 0;
};

/// The compute of stage `stage` of replica `replica` on `be`: the model's
/// own, or with o.synthetic enabled the modelled times (sleeps of each
/// stage's forward and backward per micro-batch, zero activations of the
/// right size, no arithmetic; the model's parameter buffers are still
/// there for the DP group's real collectives). `model` outlives it.
std::unique_ptr<stage_compute> make_stage_compute(const dist_train_options& o, stage_model& model, Backend& be,
                                                  int stage, int replica);

}  // namespace corolla
