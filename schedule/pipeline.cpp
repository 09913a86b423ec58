// schedule/pipeline.cpp — 1F1B and interleaved 1F1B instruction lists.
// (The simulator that runs them is pipeline_sim.cpp.)
#include "schedule/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace corolla::schedule {

const char* to_string(pipeline_op op) {
  switch (op) {
    case pipeline_op::load_micro_batch: return "load_micro_batch";
    case pipeline_op::forward: return "forward";
    case pipeline_op::send_act: return "send_act";
    case pipeline_op::recv_act: return "recv_act";
    case pipeline_op::backward: return "backward";
    case pipeline_op::send_grad: return "send_grad";
    case pipeline_op::recv_grad: return "recv_grad";
    case pipeline_op::reduce_grads: return "reduce_grads";
    case pipeline_op::optimizer_step: return "optimizer_step";
  }
  return "?";
}

std::string describe(const instruction& ins) {
  std::string s = to_string(ins.op);
  if (ins.op == pipeline_op::reduce_grads) return s + " bucket " + std::to_string(ins.bucket);
  if (ins.op == pipeline_op::optimizer_step) return s;
  s += " mb " + std::to_string(ins.micro_batch);
  if (ins.chunk != 0) s += " chunk " + std::to_string(ins.chunk);
  if (ins.op == pipeline_op::send_act || ins.op == pipeline_op::send_grad) s += " -> " + std::to_string(ins.peer);
  if (ins.op == pipeline_op::recv_act || ins.op == pipeline_op::recv_grad) s += " <- " + std::to_string(ins.peer);
  return s;
}

namespace {

std::vector<int> buckets_per_stage(const std::vector<int>& grad_buckets, int stages) {
  if (grad_buckets.empty()) return std::vector<int>(stages, 1);
  if (static_cast<int>(grad_buckets.size()) != stages)
    throw std::invalid_argument("pipeline schedule: one bucket count per stage is needed");
  for (int b : grad_buckets)
    if (b < 1) throw std::invalid_argument("pipeline schedule: bucket counts must be positive");
  return grad_buckets;
}

/// Emits the instructions of one stage. Virtual stage vs = chunk * p + stage
/// (1F1B: chunk 0 only); virtual stage 0 loads the inputs, the last one the
/// targets; activations flow to vs + 1, gradients to vs - 1, wrapping from
/// the last stage to stage 0 between chunks.
class stage_writer {
 public:
  stage_writer(std::vector<instruction>& out, int stage, int stages, int chunks, int buckets)
      : out_(out), i_(stage), p_(stages), v_(chunks), buckets_(buckets) {}

  void forward(int mb, int chunk) {
    int vs = chunk * p_ + i_;
    if (vs == 0) out_.push_back({pipeline_op::load_micro_batch, mb, chunk});
    if (vs == p_ * v_ - 1 && vs != 0) out_.push_back({pipeline_op::load_micro_batch, mb, chunk});
    if (vs > 0) out_.push_back({pipeline_op::recv_act, mb, chunk, prev()});
    out_.push_back({pipeline_op::forward, mb, chunk});
    if (vs < p_ * v_ - 1) out_.push_back({pipeline_op::send_act, mb, chunk, next()});
  }

  void backward(int mb, int chunk, bool last_of_step) {
    int vs = chunk * p_ + i_;
    if (vs < p_ * v_ - 1) out_.push_back({pipeline_op::recv_grad, mb, chunk, next()});
    out_.push_back({pipeline_op::backward, mb, chunk});
    if (vs > 0) out_.push_back({pipeline_op::send_grad, mb, chunk, prev()});
    // Buckets fill during the step's last backward, last layers first;
    // each one's reduction starts as soon as it is complete.
    if (last_of_step)
      for (int b = 0; b < buckets_; ++b) out_.push_back({pipeline_op::reduce_grads, -1, 0, -1, b});
  }

  void finish() { out_.push_back({pipeline_op::optimizer_step}); }

 private:
  int prev() const { return i_ > 0 ? i_ - 1 : p_ - 1; }
  int next() const { return i_ + 1 < p_ ? i_ + 1 : 0; }

  std::vector<instruction>& out_;
  int i_, p_, v_, buckets_;
};

}  // namespace

pipeline_schedule make_1f1b(int stages, int micro_batches, const std::vector<int>& grad_buckets) {
  if (stages < 1 || micro_batches < 1)
    throw std::invalid_argument("1F1B needs at least one stage and one micro-batch");
  std::vector<int> buckets = buckets_per_stage(grad_buckets, stages);
  pipeline_schedule s;
  s.kind = schedule_kind::one_f_one_b;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.chunks = 1;
  s.programs.resize(stages);
  const int m = micro_batches;
  for (int i = 0; i < stages; ++i) {
    stage_writer w(s.programs[i], i, stages, 1, buckets[i]);
    // Warm-up: enough forwards to fill the pipeline below this stage; the
    // last stage starts alternating at once.
    int warmup = std::min(stages - i - 1, m);
    for (int k = 0; k < warmup; ++k) w.forward(k, 0);
    // Steady state: one forward, one backward; at most p - i in flight.
    for (int k = 0; k < m - warmup; ++k) {
      w.forward(warmup + k, 0);
      w.backward(k, 0, k == m - 1);
    }
    // Cool-down: the backwards still owed.
    for (int k = m - warmup; k < m; ++k) w.backward(k, 0, k == m - 1);
    w.finish();
  }
  return s;
}

pipeline_schedule make_interleaved(int stages, int micro_batches, int chunks,
                                   const std::vector<int>& grad_buckets) {
  if (stages < 1 || micro_batches < 1 || chunks < 1)
    throw std::invalid_argument("interleaved 1F1B needs at least one stage, micro-batch and chunk");
  if (micro_batches % stages != 0)
    throw std::invalid_argument("interleaved 1F1B needs the micro-batch count (" + std::to_string(micro_batches) +
                                ") to be a multiple of the stage count (" + std::to_string(stages) + ")");
  if (chunks == 1) return make_1f1b(stages, micro_batches, grad_buckets);
  std::vector<int> buckets = buckets_per_stage(grad_buckets, stages);
  pipeline_schedule s;
  s.kind = schedule_kind::interleaved;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.chunks = chunks;
  s.programs.resize(stages);
  const int p = stages, v = chunks, total = micro_batches * chunks;
  // Megatron's order of "virtual micro-batches" k = 0..m*v-1: groups of p
  // micro-batches go through chunk 0, then the same group through chunk 1,
  // ...; backward visits the chunks in reverse.
  auto micro_batch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_chunk = [&](int k) { return (k / p) % v; };
  auto backward_chunk = [&](int k) { return v - 1 - (k / p) % v; };
  for (int i = 0; i < p; ++i) {
    stage_writer w(s.programs[i], i, p, v, buckets[i]);
    // Warm-up as in Megatron: fill the v*p virtual stages below this one;
    // with m == p everything is warm-up (all forwards, then all backwards).
    int warmup = micro_batches == p ? total : std::min(total, (p - i - 1) * 2 + (v - 1) * p);
    for (int k = 0; k < warmup; ++k) w.forward(micro_batch_of(k), forward_chunk(k));
    for (int k = 0; k < total - warmup; ++k) {
      w.forward(micro_batch_of(warmup + k), forward_chunk(warmup + k));
      w.backward(micro_batch_of(k), backward_chunk(k), k == total - 1);
    }
    for (int k = total - warmup; k < total; ++k) w.backward(micro_batch_of(k), backward_chunk(k), k == total - 1);
    w.finish();
  }
  return s;
}

pipeline_costs uniform_pipeline_costs(int stages, double forward_s, double backward_s, double link_s) {
  pipeline_costs c;
  c.forward_s.assign(stages, forward_s);
  c.backward_s.assign(stages, backward_s);
  c.link_s.assign(stages > 1 ? stages - 1 : 0, link_s);
  c.wrap_link_s = link_s;
  return c;
}

}  // namespace corolla::schedule
