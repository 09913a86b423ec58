// The model's and the modelled stage compute (actors/stage_compute.hpp).
#include "actors/stage_compute.hpp"

#include <chrono>
#include <span>
#include <thread>

#include "actors/train_job.hpp"
#include "kernels/backend.hpp"

namespace corolla {

namespace {

/// The model's forward and backward on the rank's blocks and head.
class model_stage_compute : public stage_compute {
 public:
  model_stage_compute(const dist_train_options& o, stage_model& model, Backend& be, int replica)
      : o_(o),
        model_(model),
        be_(be),
        replica_(replica),
        mb_(o.micro_batch_size()),
        rows_(static_cast<std::int64_t>(mb_) * o.seq),
        hidden_(model.parts.at(0).config().hidden_size) {
    std::vector<std::int32_t> p(static_cast<std::size_t>(rows_));
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(o_.seq));
    positions_ = Tensor::from_i32(p, {rows_});
  }

  void begin_step(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& targets) override {
    if (model_.adapter) {
      // Nothing of the model has gradients (nor are its frozen weights'
      // compute copies converted again).
      model_.adapter->zero_grads();
    } else {
      for (stage& part : model_.parts) part.zero_grads();
      if (model_.head_part) model_.head_part->zero_grads();
    }
    ids_ = &ids;
    targets_ = &targets;
  }

  void forward(int k, int chunk, int v, in_flight& f) override {
    if (v == 0) {
      f.x = be_.empty({rows_, hidden_});
      model_.head_part->embed(tokens(*ids_, k), positions_, f.x);
    }
    f.y = be_.empty({rows_, hidden_});
    model_.parts[static_cast<std::size_t>(chunk)].forward(f.x, mb_, o_.seq, f.y, &f.acts);
  }

  double backward(int k, int chunk, int v, in_flight& f, bool final, float loss_scale,
                  const std::function<void(int)>& on_block) override {
    stage& part = model_.parts[static_cast<std::size_t>(chunk)];
    double loss = 0;
    if (v == o_.layout.virtual_stages() - 1) {
      f.dy = be_.empty({rows_, hidden_});
      const float scale = static_cast<float>(mb_) / static_cast<float>(o_.batch) * loss_scale;
      const float lk =
          model_.head_part->loss(f.y, tokens(*targets_, k), &f.dy, scale, head_acts_, !model_.adapter);
      loss = static_cast<double>(lk) * mb_ / o_.batch;
    }
    f.dx = be_.empty({rows_, hidden_});
    std::function<void(int)> each_block;
    if (final) each_block = [&on_block, &part](int i) { on_block(part.first() + i); };
    part.backward(f.acts, f.dy, f.dx, each_block);
    if (v == 0 && !model_.adapter) model_.head_part->embed_backward(tokens(*ids_, k), positions_, f.dx);
    f.acts = {};
    f.x = f.y = f.dy = Tensor{};
    return loss;
  }

 private:
  /// Micro-batch k's rows of this replica's share of the global batch.
  Tensor tokens(const std::vector<std::int32_t>& all, int k) const {
    const std::int64_t per_replica = static_cast<std::int64_t>(o_.batch / o_.layout.dp) * o_.seq;
    const std::int64_t begin = replica_ * per_replica + k * rows_;
    return Tensor::from_i32(std::span(all).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(rows_)),
                            {rows_});
  }

  const dist_train_options& o_;
  stage_model& model_;
  Backend& be_;
  int replica_;
  int mb_;
  std::int64_t rows_, hidden_;
  Tensor positions_;
  head_activations head_acts_;
  const std::vector<std::int32_t>* ids_ = nullptr;
  const std::vector<std::int32_t>* targets_ = nullptr;
};

/// Calibrated synthetic compute (train_job.hpp's synthetic_compute): each
/// forward and backward sleeps its stage's modelled time, and a final
/// backward hands its blocks over one by one as a real one would.
class timed_stage_compute : public stage_compute {
 public:
  timed_stage_compute(const dist_train_options& o, stage_model& model, int stage)
      : model_(model),
        forward_s_(o.synthetic.forward_s.at(static_cast<std::size_t>(stage)) / o.layout.chunks),
        backward_s_(o.synthetic.backward_s.at(static_cast<std::size_t>(stage)) / o.layout.chunks),
        rows_(Tensor::zeros({static_cast<std::int64_t>(o.micro_batch_size()) * o.seq,
                             model.parts.at(0).config().hidden_size})) {}

  void begin_step(const std::vector<std::int32_t>&, const std::vector<std::int32_t>&) override {}

  void forward(int, int, int, in_flight& f) override {
    sleep_s(forward_s_);
    f.y = rows_;
  }

  double backward(int, int chunk, int, in_flight& f, bool final, float,
                  const std::function<void(int)>& on_block) override {
    const stage& part = model_.parts[static_cast<std::size_t>(chunk)];
    const int n = part.size();
    for (int i = n - 1; i >= 0; --i) {
      sleep_s(backward_s_ / n);
      if (final) on_block(part.first() + i);
    }
    f = in_flight{};
    f.dx = rows_;
    return 0;
  }

 private:
  static void sleep_s(double s) {
    if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }

  stage_model& model_;
  double forward_s_, backward_s_;
  Tensor rows_;  ///< activations of the right size whose values do not matter
};

}  // namespace

void stage_model::refresh_factors() {
  if (!adapter) return;
  for (std::size_t c = 0; c < parts.size(); ++c) {
    const stage& p = parts[c];
    // In place: the part points at factors[c].
    if (p.compute_dtype() != dtype::f32)
      factors[c] = adapter->training_factors(p.backend(), p.compute_dtype(), p.first(), p.size());
  }
}

std::unique_ptr<stage_compute> make_stage_compute(const dist_train_options& o, stage_model& model, Backend& be,
                                                  int stage, int replica) {
  if (o.synthetic.enabled()) return std::make_unique<timed_stage_compute>(o, model, stage);
  return std::make_unique<model_stage_compute>(o, model, be, replica);
}

}  // namespace corolla
