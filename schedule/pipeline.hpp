// schedule/pipeline.hpp — pipeline schedules as per-stage instruction lists,
// and a small simulator that runs them on modelled durations.
//
// A stage actor executes its list top to bottom: sends are asynchronous
// (the message is queued on the link and the stage goes on), receives
// block until the message has arrived, ReduceGrads starts the reduction of
// one gradient bucket on the stage's DP group in the background, and
// OptimizerStep waits for every reduction of the step. The simulator uses
// exactly these rules, so "it does not deadlock in the simulator" means
// "the lists are consistent": every receive has its send and no stage
// waits for a message that comes after its own later sends.
#pragma once

#include <string>
#include <vector>

namespace corolla::schedule {

/// What one instruction does.
enum class pipeline_op {
  load_micro_batch,  ///< stage 0: read the input tokens of a micro-batch; last stage: its targets
  forward,           ///< forward of a micro-batch through the stage's blocks (chunk `chunk`)
  send_act,          ///< send the forward output to `peer` (asynchronous)
  recv_act,          ///< wait for the forward input from `peer`
  backward,          ///< backward of a micro-batch (the last stage starts from the loss)
  send_grad,         ///< send the input gradient to `peer` (asynchronous)
  recv_grad,         ///< wait for the output gradient from `peer`
  reduce_grads,      ///< start the DP reduction of gradient bucket `bucket` (background)
  optimizer_step,    ///< wait for this step's reductions, then update the weights
};

/// "forward", "send_act", ... (the names the runtime logs).
const char* to_string(pipeline_op op);

/// One entry of a stage's list.
struct instruction {
  pipeline_op op = pipeline_op::forward;
  int micro_batch = -1;  ///< the micro-batch (all ops but reduce_grads / optimizer_step)
  int chunk = 0;         ///< model chunk on this stage (interleaved schedules; 0 for 1F1B)
  int peer = -1;         ///< the other stage of a send or receive
  int bucket = -1;       ///< reduce_grads: bucket index (0 = produced first = the last layers)

  bool operator==(const instruction&) const = default;
};

/// "forward mb 3", "send_act mb 3 -> 2", "reduce_grads bucket 0".
std::string describe(const instruction& ins);

/// The schedule families.
enum class schedule_kind {
  one_f_one_b,  ///< PipeDream-Flush / Megatron 1F1B
  interleaved,  ///< Megatron interleaved 1F1B: `chunks` model chunks per stage
};

/// One instruction list per stage for one optimizer step.
struct pipeline_schedule {
  schedule_kind kind = schedule_kind::one_f_one_b;
  int stages = 0;          ///< p
  int micro_batches = 0;   ///< m per replica
  int chunks = 1;          ///< model chunks per stage (v); 1 for 1F1B
  std::vector<std::vector<instruction>> programs;  ///< programs[stage]
};

/// 1F1B for p stages and m micro-batches: stage i runs min(p-i-1, m)
/// warm-up forwards, then alternates one forward and one backward, then
/// the remaining backwards; after the last backward it starts the
/// reduction of each of its `grad_buckets[i]` buckets (default 1) and ends
/// with OptimizerStep. Stage i holds at most min(p-i, m) micro-batches of
/// activations. Throws std::invalid_argument for p < 1 or m < 1.
pipeline_schedule make_1f1b(int stages, int micro_batches, const std::vector<int>& grad_buckets = {});

/// Interleaved 1F1B (Megatron): stage i holds chunks c = 0..v-1, chunk c
/// running virtual stage c*p + i; the bubble shrinks by about v. Requires
/// m to be a multiple of p (as Megatron does). Throws std::invalid_argument
/// otherwise.
pipeline_schedule make_interleaved(int stages, int micro_batches, int chunks,
                                   const std::vector<int>& grad_buckets = {});

/// Durations for the simulator (seconds). Per stage, per chunk.
struct pipeline_costs {
  std::vector<double> forward_s;     ///< per stage: forward of one chunk for one micro-batch
  std::vector<double> backward_s;    ///< per stage: backward of one chunk for one micro-batch
  std::vector<double> link_s;        ///< per boundary j (stage j <-> j+1), one way, per message; may be empty (free links)
  double wrap_link_s = 0;            ///< last stage -> stage 0 (interleaved only)
  std::vector<double> reduce_s;      ///< per stage: the whole DP reduction (split evenly over its buckets); may be empty
  std::vector<double> optimizer_s;   ///< per stage; may be empty
  double load_s = 0;                 ///< one load_micro_batch
};

/// p stages with the same forward and backward times and links of `link_s`.
pipeline_costs uniform_pipeline_costs(int stages, double forward_s, double backward_s, double link_s = 0);

/// What running the lists on the modelled durations gives.
struct simulation {
  bool completed = false;      ///< every stage reached the end of its list
  std::string problem;         ///< when !completed: the deadlock or inconsistency, naming stage and instruction
  double makespan_s = 0;       ///< until the last instruction of any stage finishes
  double pipeline_s = 0;       ///< until the last backward of any stage finishes
  double bubble_fraction = 0;  ///< 1 - (forward+backward time of all stages) / (p x pipeline_s)
  std::vector<int> peak_in_flight;  ///< per stage: most micro-batch chunks forwarded but not yet backwarded
  std::vector<double> busy_s;       ///< per stage: forward + backward time
};

/// Runs the lists: each stage one instruction at a time; a send queues its
/// message on the link (FIFO per direction, `link_s` per message) and
/// costs the stage nothing; a receive waits for the arrival; reduce_grads
/// of bucket b of n becomes ready when (b+1)/n of the preceding backward is
/// done and runs on the stage's DP channel (one bucket at a time);
/// optimizer_step waits for the channel. Also checks that every forward
/// and backward of every (micro-batch, chunk) runs once per stage, backward
/// after forward, and every message sent is received.
simulation simulate(const pipeline_schedule& schedule, const pipeline_costs& costs);

}  // namespace corolla::schedule
