// actors/train_rank_runtime.hpp — one rank of a pipeline x data-parallel
// training job (actors/train_job.hpp, run_train_rank), internal to the
// rank: its runtime's state and steps. Defined in train_rank.cpp (joining,
// the stage actor's steps, the DP group's requests, the end) and
// train_rank_setup.cpp (the model, device groups, a restore, the snapshot
// keeper and the watchdog).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>
#include <caf/all.hpp>
#include <spdlog/spdlog.h>
#include "actors/dp_group.hpp"
#include "actors/errors.hpp"
#include "actors/inbox_waiter.hpp"
#include "actors/link_probe.hpp"
#include "actors/node.hpp"
#include "actors/stage_compute.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_roster.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_stall.hpp"
#include "actors/train_store.hpp"
#include "actors/train_watchdog.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/stage.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "schedule/pipeline.hpp"

namespace corolla::train_detail {

class rank_runtime {
 public:
  rank_runtime(node& n, const dist_train_options& o, int rank, const rank_weights& weights, token_dataset& data,
               Backend* compute);

  /// Joins the job, links to the ranks it exchanges with, trains, leaves.
  void run(const std::string& coordinator);
  /// The step it stopped after: o.steps, or the drain step.
  int last_step() const { return last_step_; }

  ~rank_runtime();

 private:
  // ---- model ------------------------------------------------------------------

  /// The stage's parts (one per chunk), the head on the first and last
  /// stage, and the DP group's buckets over their parameters.
  void build_model();
  /// Blocks [first, last)'s parameters from the weights, on this rank's backend.
  std::vector<param_set> stage_blocks(int first, int last);
  /// Blocks [first, last) as an inference-only stage of format `f` (a
  /// QLoRA job's frozen blocks: dist_lora::base_weights).
  stage frozen_part(int first, int last, weight_format f);

  // ---- device collectives -------------------------------------------------------

  /// Joins this rank's device groups: the data-parallel group, then the
  /// head's where it differs (every rank joins in that order: a join blocks
  /// until the whole group is in).
  void join_device_groups();

  /// The device group of ring `r` (null: a group of one).
  device_group* group_of(const ring& r) const;

  // ---- checkpoints -----------------------------------------------------------------

  /// Restores the latest checkpoint, whatever layout wrote it: this rank's
  /// blocks' parameters from the shard that holds them, its moment shards
  /// assembled from the pieces of the writers' shards.
  void restore();
  /// restore's other source (o_.from_memory): the failed grid's in-memory
  /// snapshots, fetched from the keepers that hold them, only the tensors
  /// this rank's buckets need (memory to memory).
  void restore_from_memory();

  // ---- in-memory snapshots (actors/train_snapshots.hpp) ---------------------------------

  /// Publishes this rank's snapshot keeper (snapshot_keeper_name).
  void start_keeper();

  /// The stage's watchdog (actors/train_watchdog.hpp): a compute call that
  /// does not return is reported as this rank's failure, and the process
  /// ends (its stage thread cannot).
  void start_watchdog();

  /// The job failed: the snapshots this rank holds go to disk, where the
  /// launcher assembles the newest complete step from every survivor's.
  void flush_snapshots();

  // ---- the stage actor (train_stage.cpp) -------------------------------------------
  //
  // The stage actor is event-based (detached: its handlers compute) and
  // never blocks: it runs a step's program as far as it can and returns;
  // whatever it needs next (a neighbour's activations or gradient, the DP
  // group's answers, the coordinator's norm or verdict) reaches it as a
  // message, and the handler for that message goes on from there. At most
  // one such wait is open at a time; every wait but a DP request ends in
  // a train_error after o_.timeout.

  /// Runs the steps on the stage actor with the DP-group actor beside it;
  /// returns after the coordinator's end of the job, or throws what
  /// stopped them.
  void run_actors();

  // The DP-group actor's buckets point into this runtime's stages: it must
  // be gone before the runtime is (it may still be inside a handler).
  void stop_dp_actor();

  caf::behavior stage_behavior();
  /// Runs `f` as a handler of the stage actor: an exception ends the stage
  /// with it (run_actors throws it).
  template <class F>
  void guard(F&& f);
  /// The stage is over: run_actors returns (`failure` null) or throws it.
  void end_stage(std::exception_ptr failure);

  /// Starts step `step`, or ends the stage after the last one.
  void begin_step(int step);
  /// Runs the step's program from where it stands until an instruction has
  /// to wait for a message (its handler calls advance again) or the
  /// program is done (the next step starts with a message to itself, so a
  /// long run does not nest).
  void advance();

  /// The message filed under `key`: returned at once when it is there;
  /// otherwise nothing, and `later` runs with it when it comes (after
  /// o_.timeout the stage fails with "no <what> within ...";
  /// actors/inbox_waiter.hpp). `what` and `from` are for waits() (the
  /// coordinator's stall check).
  std::optional<remote_message> await(const std::string& key, std::string what, int from,
                                      inbox_waiter::delivery later,
                                      std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
    return waiter_->await(key, std::move(what), from, std::move(later), timeout);
  }
  /// How long a rank waits for the coordinator's norm, verdict or end: past
  /// the coordinator's own wait for a silent rank's report (its grace), so
  /// that the coordinator, not a healthy rank waiting on it, names the
  /// silent one.
  std::chrono::milliseconds coordinator_timeout() const { return o_.timeout + 2 * report_grace(o_.timeout); }

  /// Received tensor `t` (activations, or with `grad` a gradient) for
  /// (micro-batch, chunk) `key`, where the stages compute.
  void land(std::pair<int, int> key, bool grad, const Tensor& t);

  /// A request to the DP group, its answer (`Results`, given explicitly) to
  /// `then`. A DP group that failed ends the stage.
  template <class... Results, class Then, class... Ts>
  void ask_dp(Then then, Ts... xs);
  /// A request answered with an error string ("" = done): an error ends
  /// the stage, else `then` runs.
  template <class... Ts>
  void tell_dp(std::function<void()> then, Ts... xs);

  /// Hands bucket `id` to the DP group: its last backward of the step is
  /// queued. The schedules keep this invariant, which the download and the
  /// marker-less upload rely on: no op queued after a bucket's final
  /// backward reads or writes its parameters or gradients before the DP
  /// group answered (recomputation or split weight-gradient schedules would
  /// have to mark later).
  void enqueue(int id, std::int64_t step);
  /// `then` runs once the DP group answered for every bucket handed over
  /// this step (each answer may take o_.timeout); the first error ends the
  /// stage instead.
  void wait_reductions(std::function<void()> then);
  /// wait_reductions' check, on each answer.
  void check_reductions();

  // The optimizer step, in phases; each may wait for a message, and the
  // last goes on with the program (advance).
  /// Waits for the reductions; the snapshot without a global norm; the norm.
  void optimizer_step();
  /// The report to the coordinator (with link probes at a probe step), then its norm.
  void report_step(double sum_squares);
  /// The coordinator's norm: the update (or a skipped overflowed step).
  void apply_norm(const remote_message& m);
  /// After the update: 16-bit copies, the snapshot with a global norm, the verdict.
  void after_update(bool skip);
  /// The coordinator's verdict at a verdict step (a train.drain naming
  /// this step; value 1 = the layout changes, stop after it, 0 = go on).
  /// Waiting here keeps every rank at this step boundary while the
  /// scheduler decides, so a stop can never come too late.
  void take_verdict();
  void apply_verdict(const remote_message& m);
  /// A checkpoint at a save step, then the rest of the program.
  void save_step();
  /// After the last step: --save's parameters go to the coordinator, then finish.
  void end_steps();
  /// --save: waits for the coordinator's `n`th ask for a piece of a
  /// bucket's parameters and has the DP group send it; once every value
  /// this rank keeps went, finish.
  void answer_params_ask(int n);
  /// This rank is done (train.done); the stage ends with the coordinator's
  /// end of the job (train.finish).
  void finish();

  /// A received (host) tensor where the stages compute.
  Tensor to_compute(Tensor host);

  /// `t` in host memory, to send (returns once copied).
  Tensor to_host(const Tensor& t);

  // ---- the DP group -------------------------------------------------------------

  /// Whether updates wait for the coordinator's global gradient norm: to
  /// clip, or to learn whether a loss-scaled backward overflowed anywhere.
  /// Without it each bucket is updated as soon as it is reduced.
  bool needs_global_norm() const { return o_.optimizer.max_grad_norm > 0.0f || scaler_.dynamic(); }

  /// AdamW counts the updates made: steps skipped for overflow are not (as
  /// a single process's adamw_optimizer); the schedule counts steps.
  std::int64_t adam_step(std::int64_t step) const { return step - scaler_.state().skipped; }

  /// The rates of the links to this rank's neighbours of higher rank (each
  /// link is probed from one end), with echoes over the running links. A
  /// link too fast for the payload to tell reports 0; a probe that fails
  /// is left out (the step goes on: a dead peer is the inbox's business).
  /// The payload is 64 KiB, or about 25 ms at the rate last measured on a
  /// slower link (at least 8 KiB): a probe of a throttled link costs tens
  /// of milliseconds, not seconds.
  std::vector<schedule::link_measurement> probe_links();

  node& node_;
  const dist_train_options& o_;
  int rank_;
  const rank_weights& weights_;
  token_dataset& data_;
  model_config cfg_;
  Backend& be_;     ///< where the stages compute
  bool on_device_;  ///< be_ is not the host: activations go through host memory, buckets stay on the device
  int stage_ = 0, replica_ = 0, mb_ = 1, m_ = 1;
  bool first_ = false, last_ = false;
  int steps_done_ = 0;
  int last_step_ = 0;  ///< the step this rank stops after: o_.steps, or a drain's
  int snapshot_every_ = o_.snapshot_every;  ///< in force; the coordinator's verdicts may change it
  double compute_s_ = 0;  ///< this step's seconds inside forward and backward (host backends)
  std::map<int, double> probe_rates_;  ///< neighbour rank -> the rate last probed (bytes/s; 0 = too fast)
  /// Updated from the coordinator's norm each step, identically on every
  /// rank (and in the coordinator).
  loss_scaler scaler_;

  std::shared_ptr<train_inbox> inbox_;
  std::string coordinator_id_;
  caf::actor mailbox_, dp_actor_;
  caf::actor keeper_;  ///< this rank's snapshot keeper (snapshot_every > 0)
  std::shared_ptr<stage_beacon> beacon_ = std::make_shared<stage_beacon>();
  /// The DP-group actor's work that waits for no message (for the
  /// coordinator's question; the watchdog judges only the stage's calls).
  std::shared_ptr<stage_beacon> dp_beacon_ = std::make_shared<stage_beacon>();
  /// The stage thread's work that is neither a compute call nor a wait
  /// (its setup: device groups, the model, a restore; link probes), for
  /// the same question.
  std::shared_ptr<stage_beacon> work_beacon_ = std::make_shared<stage_beacon>();
  caf::actor watchdog_;  ///< the stage's watchdog ("train-watch")
  std::unique_ptr<train_comm> comm_;
  rank_rings rings_;
  stage_model model_;
  std::unique_ptr<stage_compute> compute_;
  std::vector<std::int32_t> ids_, targets_;

  /// The buckets, built and restored here, then the DP-group actor's alone;
  /// held here too only so that they are released after the companion
  /// below has drained its stream.
  std::shared_ptr<dp_group> buckets_;
  std::map<int, int> slot_of_;  ///< bucket id -> slot in the DP group
  int dp_size_ = 0;             ///< buckets in the DP group
  std::int64_t params_left_ = 0;  ///< --save: parameter values this rank keeps and has yet to send
  int handed_ = 0;              ///< buckets handed to the DP group this step
  // The stage actor's state; only its handlers touch it.
  struct step_state {
    int step = 0;
    std::size_t pc = 0;                               ///< the next instruction of the program
    std::map<std::pair<int, int>, in_flight> flight;  ///< by (micro-batch, chunk)
    std::vector<int> backwards;                       ///< backwards run, per chunk
    double loss = 0;
    bool head_enqueued = false;
    bool snapshot = false;  ///< this step's snapshot goes to the keeper
  };
  std::vector<schedule::instruction> program_;  ///< this stage's part of the pipeline schedule
  step_state st_;
  caf::event_based_actor* stage_self_ = nullptr;  ///< the stage actor, while it runs
  std::shared_ptr<std::promise<void>> stage_done_;
  /// Whether the stage is over (stage_done_ has its outcome): set by
  /// end_stage, or by the actor's cleanup when it ended any other way.
  std::shared_ptr<std::atomic<bool>> stage_settled_;
  std::unique_ptr<inbox_waiter> waiter_;  ///< the stage actor's waits
  int reduced_ = 0;  ///< the DP group's answers this step
  /// The most of this step's reductions the DP group ran side by side
  /// (its answers say; the step's report carries it).
  int rings_side_by_side_ = 0;
  /// The most of the last update's jobs (clipping or loss scaling: one per
  /// bucket) the DP group ran side by side; the next step's report carries
  /// it, since a step's report leaves before its update.
  int updates_side_by_side_ = 0;
  std::string reduce_error_;
  std::function<void()> on_reduced_;  ///< set while the reductions are waited for
  /// be_'s companion for the DP actor (device backends only). Late, so it
  /// is destroyed early: its stream is drained before the buffers its
  /// queued work may still use (after a failed step) go back.
  std::unique_ptr<Backend> dp_be_;
  /// The device groups: the data-parallel group, and the head's where its
  /// ring differs. Last, so they are finalised (or aborted: a peer gone)
  /// before the companion drains its stream, which a collective waiting on
  /// a dead peer would never let it do.
  std::unique_ptr<device_group> dp_coll_, head_coll_;
};

}  // namespace corolla::train_detail
