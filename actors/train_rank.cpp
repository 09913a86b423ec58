// One rank of a pipeline x data-parallel training job (actors/train_job.hpp).
#include <algorithm>
#include <chrono>
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
#include "actors/link_probe.hpp"
#include "actors/node.hpp"
#include "actors/stage_compute.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_roster.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "model/error.hpp"
#include "model/head.hpp"
#include "model/stage.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "schedule/pipeline.hpp"

namespace corolla {

namespace {

using schedule::pipeline_op;

class rank_runtime {
 public:
  rank_runtime(node& n, const dist_train_options& o, int rank, const rank_weights& weights, token_dataset& data,
               Backend* compute)
      : node_(n),
        o_(o),
        rank_(rank),
        weights_(weights),
        data_(data),
        cfg_(weights.cfg),
        be_(compute ? *compute : *weights.be),
        on_device_(be_.dev().kind != device_kind::cpu),
        scaler_(o.optimizer.loss_scale) {
    if (on_device_) {
      dp_be_ = be_.companion();
      if (!dp_be_)
        throw train_error("the " + be_.name() + " backend gives no second instance for the data-parallel " +
                          "group's optimiser thread");
    }
    const train_layout& l = o_.layout;
    stage_ = l.stage_of(rank);
    replica_ = l.replica_of(rank);
    first_ = stage_ == 0;
    last_ = stage_ == l.pp - 1;
    mb_ = o_.micro_batch_size();
    m_ = o_.micro_batches();
    rings_ = rings_of(l, rank);
    last_step_ = o_.steps;
  }

  /// Joins the job, links to the ranks it exchanges with, trains, leaves.
  void run(const std::string& coordinator) {
    inbox_ = std::make_shared<train_inbox>();
    auto mailbox = start_train_mailbox(node_, inbox_, "train");
    if (!mailbox) throw train_error("cannot publish the training mailbox: " + error_message(mailbox.error()));
    mailbox_ = *mailbox;
    // Ranks of a multi-host job may start well before rank 0 listens.
    connect_options co;
    co.timeout = o_.timeout;
    auto coord = node_.connect(coordinator, co);
    if (!coord) throw train_error("cannot reach the coordinator at " + coordinator + ": " + error_message(coord.error()));
    inbox_->name_peer(*coord, "the coordinator");
    coordinator_id_ = *coord;
    // Until the roster comes: the coordinator hears why a join failed.
    comm_ = std::make_unique<train_comm>(node_, inbox_, rank_, std::vector<std::string>{}, *coord, o_.timeout);
    try {
      comm_ = join_train_job(node_, o_, cfg_, rank_, inbox_, *comm_, rings_);
      if (o_.snapshot_every > 0 && !o_.checkpoint_dir.empty()) start_keeper();
      if (o_.collectives == dp_collectives::device) join_device_groups();
      build_model();
      if (o_.resume) {
        restore();
        for (stage& part : model_.parts) part.params_changed();  // 16-bit compute copies follow the restored weights
      }
      run_actors();
      finish();
    } catch (const std::exception& e) {
      // The coordinator hears why before this node's goodbye reaches it
      // (node::stop hands sent messages to the link first), and names the
      // root cause.
      if (comm_ && !inbox_->closing())
        try {
          comm_->send_coordinator(train_msg::abort,
                                  encode_abort_body(o_.layout.label(rank_) + " failed: " + e.what(), comm_->job()));
        } catch (const std::exception&) {
        }
      flush_snapshots();
      throw;
    }
  }

  ~rank_runtime() {
    if (inbox_) inbox_->close();
    if (keeper_) {
      node_.unpublish("train-snap");
      caf::anon_send_exit(keeper_, caf::exit_reason::user_shutdown);
    }
    if (mailbox_) {
      node_.unpublish("train");
      caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
    }
  }

 private:
  // ---- model ------------------------------------------------------------------

  void build_model() {
    // One part per chunk (one without interleaving): virtual stage
    // c * pp + stage runs blocks [boundaries[v], boundaries[v+1]).
    model_.parts.reserve(static_cast<std::size_t>(o_.layout.chunks));
    for (int c = 0; c < o_.layout.chunks; ++c) {
      const auto v = static_cast<std::size_t>(o_.layout.virtual_stage(stage_, c));
      const int first = o_.layout.boundaries[v];
      const int last = o_.layout.boundaries[v + 1];
      std::vector<param_set> blocks = weights_.blocks(first, last);
      if (static_cast<int>(blocks.size()) != last - first)
        throw train_error("the weights gave " + std::to_string(blocks.size()) + " blocks for blocks " +
                          std::to_string(first) + ".." + std::to_string(last - 1));
      for (param_set& b : blocks) place_params(b, be_);  // no-op where they already are
      model_.parts.emplace_back(cfg_, first, std::move(blocks), be_);
      model_.parts.back().grads();
      model_.parts.back().set_compute_dtype(o_.compute);
    }
    if (first_ || last_) {
      param_set h = weights_.head();
      place_params(h, be_);
      model_.head_part.emplace(cfg_, std::move(h), be_);
      model_.head_part->grads();
    }
    compute_ = make_stage_compute(o_, model_, be_, stage_, replica_);
    // The DP group owns the buckets from here on: every block's, and the head's.
    dp_group_setup s;
    s.options = &o_;
    s.rank = rank_;
    s.label = o_.layout.label(rank_);
    // Parameters are the same on every replica: replica 0 of each stage
    // writes (and sends) its blocks', rank 0 the head's, which the last
    // stage holds too.
    s.keeps_block_params = replica_ == 0;
    s.keeps_head_params = rank_ == 0;
    s.global_norm = needs_global_norm();
    s.compute = &be_;
    s.math = dp_be_ ? dp_be_.get() : &be_;
    s.comm = comm_.get();
    s.inbox = inbox_;
    s.keeper = keeper_;
    s.buddy = keeper_ ? snapshot_buddy(o_.layout, rank_) : -1;
    s.buddy_params = buddy_needs_params(o_.layout, rank_);
    buckets_ = std::make_shared<dp_group>(std::move(s));
    const bool device_coll = o_.collectives == dp_collectives::device;
    for (stage& part : model_.parts)
      for (int i = 0; i < part.size(); ++i)
        buckets_->add_bucket(part.first() + i, &part.params()[static_cast<std::size_t>(i)],
                             &part.grads()[static_cast<std::size_t>(i)], &rings_.dp,
                             device_coll ? group_of(rings_.dp) : nullptr);
    if (model_.head_part)
      buckets_->add_bucket(head_bucket, &model_.head_part->params(), &model_.head_part->grads(), &rings_.head,
                           device_coll ? group_of(rings_.head) : nullptr);
  }

  // ---- device collectives -------------------------------------------------------

  /// Joins this rank's device groups: the data-parallel group, then the
  /// head's where it differs (every rank joins in that order: a join blocks
  /// until the whole group is in).
  void join_device_groups() {
    const std::string me = o_.layout.label(rank_);
    if (!on_device_)
      throw train_error(me + " computes on the cpu: --collectives device needs every rank on a device (--device cuda)");
    if (!be_.has_device_groups())
      throw train_error("--collectives device: the " + be_.name() + " backend of " + me +
                        " has no device collectives (corolla was built without NCCL)");
    dp_coll_ = join_device_group(be_, *comm_, inbox_, o_, rings_.dp, 0);
    if (rings_.head.ranks != rings_.dp.ranks) head_coll_ = join_device_group(be_, *comm_, inbox_, o_, rings_.head, 1);
  }

  /// The device group of ring `r` (null: a group of one).
  device_group* group_of(const ring& r) const {
    if (r.size() < 2) return nullptr;
    if (&r == &rings_.dp) return dp_coll_.get();
    return head_coll_ ? head_coll_.get() : dp_coll_.get();  // the head's ring is the DP ring's (pp = 1)
  }

  // ---- checkpoints -----------------------------------------------------------------

  /// Restores the latest checkpoint, whatever layout wrote it: this rank's
  /// blocks' parameters from the shard that holds them, its moment shards
  /// assembled from the pieces of the writers' shards.
  void restore() {
    const int step = latest_checkpoint_step(o_.checkpoint_dir);
    if (step == 0) throw train_error("no checkpoint in " + o_.checkpoint_dir.string() + " to resume from");
    check_manifest(o_.checkpoint_dir, step, checkpoint_key(o_, cfg_));
    buckets_->restore(checkpoint_shards(o_.checkpoint_dir, step));
    steps_done_ = step;
    // Also without scaling now: its skipped steps keep AdamW's count right.
    if (const auto st = checkpoint_loss_scale(o_.checkpoint_dir, step)) scaler_.set_state(*st);
    std::vector<std::int32_t> ids, targets;
    for (int s = 0; s < step; ++s) data_.next_batch(o_.batch, o_.seq, ids, targets);
    const std::string from = checkpoint_layout(o_.checkpoint_dir, step);
    spdlog::info("{} resumed from {} (step {}{})", o_.layout.label(rank_), checkpoint_step_dir(o_.checkpoint_dir, step).string(),
                 step, from.empty() || from == o_.layout.describe() ? "" : ", written by layout " + from);
  }

  // ---- in-memory snapshots (actors/train_snapshots.hpp) ---------------------------------

  void start_keeper() {
    snapshot_keeper_setup k;
    k.holder = rank_;
    k.owners = snapshot_owners(o_.layout, rank_);
    k.inbox = inbox_;
    k.dir = memory_snapshot_dir(o_.checkpoint_dir);
    k.coordinator = coordinator_id_;
    auto a = start_snapshot_keeper(node_, std::move(k), comm_->job());
    if (!a) throw train_error("cannot publish the snapshot keeper: " + error_message(a.error()));
    keeper_ = *a;
  }

  /// The job failed: the snapshots this rank holds go to disk, where the
  /// launcher assembles the newest complete step from every survivor's.
  void flush_snapshots() {
    if (keeper_) flush_snapshot_keeper(node_, keeper_, o_.layout.label(rank_));
  }

  // ---- the step ----------------------------------------------------------------------

  void run_actors() {
    auto program = (o_.layout.chunks > 1 ? schedule::make_interleaved(o_.layout.pp, m_, o_.layout.chunks)
                                         : schedule::make_1f1b(o_.layout.pp, m_))
                       .programs[static_cast<std::size_t>(stage_)];
    // From here on only the DP-group actor touches the buckets.
    dp_size_ = buckets_->size();
    slot_of_ = buckets_->slots();
    dp_actor_ = spawn_dp_group(node_, buckets_);
    auto* self = this;
    // Shared: the actor may still be inside set_value when this thread
    // wakes up and leaves.
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    node_.system().spawn<caf::detached>([self, program, done](caf::blocking_actor* stage_self) {
      try {
        self->stage_self_ = stage_self;
        for (int step = self->steps_done_ + 1; step <= self->last_step_; ++step) self->run_step(program, step);
        // --save: the parameters this rank keeps go to the coordinator.
        if (!self->o_.save_dir.empty() && self->last_step_ == self->o_.steps)
          self->tell_dp(dp_msg::publish_atom::value, self->o_.steps);
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
    try {
      finished.get();
    } catch (...) {
      // Unblock the DP-group actor's waits before it goes away.
      inbox_->fail("rank " + std::to_string(rank_) + " stopped");
      stop_dp_actor();
      throw;
    }
    stop_dp_actor();
  }

  // The DP-group actor's buckets point into this runtime's stages: it must
  // be gone before the runtime is (it may still be inside a handler).
  void stop_dp_actor() {
    caf::anon_send_exit(dp_actor_, caf::exit_reason::user_shutdown);
    caf::scoped_actor waiter{node_.system()};
    waiter->wait_for(dp_actor_);
  }

  void run_step(const std::vector<schedule::instruction>& program, int step) {
    handed_ = 0;
    compute_s_ = 0;
    data_.next_batch(o_.batch, o_.seq, ids_, targets_);
    compute_->begin_step(ids_, targets_);
    const train_layout& l = o_.layout;
    const int V = l.virtual_stages();
    const std::int64_t rows = static_cast<std::int64_t>(mb_) * o_.seq;
    const std::int64_t D = cfg_.hidden_size;
    // Messages of micro-batch k for virtual stage v are filed under index
    // k * V + v (the receiver's virtual stage).
    auto index = [V](int k, int v) { return k * V + v; };
    std::map<std::pair<int, int>, in_flight> flight;  // (micro-batch, chunk)
    std::vector<int> backwards(static_cast<std::size_t>(l.chunks), 0);
    double loss = 0;
    bool head_enqueued = false;
    for (const schedule::instruction& ins : program) {
      const int k = ins.micro_batch;
      const int c = ins.chunk;
      const int v = l.virtual_stage(stage_, c);
      const std::pair<int, int> key{k, c};
      switch (ins.op) {
        case pipeline_op::load_micro_batch: break;
        case pipeline_op::recv_act: {
          const int from = l.rank_of((v - 1) % l.pp, replica_);
          Tensor x = comm_->receive(train_msg::act, step, index(k, v), 0, rows * D,
                                    "activations of micro-batch " + std::to_string(k) + " from " + l.label(from));
          flight[key].x = to_compute(x.view({rows, D}));
          break;
        }
        case pipeline_op::forward: {
          const auto t0 = std::chrono::steady_clock::now();
          compute_->forward(k, c, v, flight[key]);
          compute_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          break;
        }
        case pipeline_op::send_act:
          comm_->send(l.rank_of((v + 1) % l.pp, replica_), train_msg::act, {step, index(k, v + 1), 0, rank_},
                      to_host(flight[key].y));
          break;
        case pipeline_op::recv_grad: {
          const int from = l.rank_of((v + 1) % l.pp, replica_);
          Tensor dy = comm_->receive(train_msg::grad, step, index(k, v), 0, rows * D,
                                     "gradient of micro-batch " + std::to_string(k) + " from " + l.label(from));
          flight[key].dy = to_compute(dy.view({rows, D}));
          break;
        }
        case pipeline_op::backward: {
          // The chunk's last backward of the step: its buckets are final.
          const bool final_backward = ++backwards[static_cast<std::size_t>(c)] == m_;
          const auto t0 = std::chrono::steady_clock::now();
          loss += compute_->backward(k, c, v, flight[key], final_backward, scaler_.scale(),
                                     [this, step](int block) { enqueue(block, step); });
          compute_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (v == 0) flight.erase(key);  // nothing to send back: done with this micro-batch
          break;
        }
        case pipeline_op::send_grad:
          comm_->send(l.rank_of((v - 1) % l.pp, replica_), train_msg::grad, {step, index(k, v - 1), 0, rank_},
                      to_host(flight[key].dx));
          flight.erase(key);
          break;
        case pipeline_op::reduce_grads:
          if (model_.head_part && !head_enqueued) {
            enqueue(head_bucket, step);
            head_enqueued = true;
          }
          break;
        case pipeline_op::optimizer_step:
          optimizer_step(step, loss);
          break;
      }
    }
  }

  /// A received (host) tensor where the stages compute.
  Tensor to_compute(Tensor host) {
    if (!on_device_) return host;
    Tensor d = be_.empty(host.shape());
    be_.copy(host, d);
    return d;
  }

  /// `t` in host memory, to send (returns once copied).
  Tensor to_host(const Tensor& t) {
    if (t.dev().kind == device_kind::cpu) return t;
    Tensor h = Tensor::empty(t.shape());
    be_.copy(t, h);
    return h;
  }

  // ---- the DP group -------------------------------------------------------------

  /// Whether updates wait for the coordinator's global gradient norm: to
  /// clip, or to learn whether a loss-scaled backward overflowed anywhere.
  /// Without it each bucket is updated as soon as it is reduced.
  bool needs_global_norm() const { return o_.optimizer.max_grad_norm > 0.0f || scaler_.dynamic(); }

  /// AdamW counts the updates made: steps skipped for overflow are not (as
  /// a single process's adamw_optimizer); the schedule counts steps.
  std::int64_t adam_step(std::int64_t step) const { return step - scaler_.state().skipped; }

  /// Hands bucket `id` to the DP group: its last backward of the step is
  /// queued. The schedules keep this invariant, which the download and the
  /// marker-less upload rely on: no op queued after a bucket's final
  /// backward reads or writes its parameters or gradients before the DP
  /// group answered (recomputation or split weight-gradient schedules would
  /// have to mark later).
  void enqueue(int id, std::int64_t step) {
    std::shared_ptr<queue_marker> ready = on_device_ ? be_.mark() : nullptr;
    stage_self_->send(dp_actor_, dp_msg::reduce_atom::value, slot_of_.at(id), step, adam_step(step), std::move(ready));
    ++handed_;
  }

  /// Waits for the DP group's answer to every bucket handed over this step.
  void wait_reductions(int step) {
    if (handed_ != dp_size_)
      throw train_error("internal: " + std::to_string(handed_) + " of " + std::to_string(dp_size_) +
                        " buckets handed to the DP group in step " + std::to_string(step));
    std::string error;
    for (int i = 0; i < handed_; ++i) {
      bool answered = false;
      stage_self_->receive(
          [&](dp_msg::reduced_atom, int, std::string& e) {
            answered = true;
            if (!e.empty() && error.empty()) error = std::move(e);
          },
          caf::after(o_.timeout) >> [] {});
      if (!answered) throw train_error("the data-parallel group did not reduce the buckets of step " + std::to_string(step) +
                                       " within " + std::to_string(o_.timeout.count()) + " ms");
    }
    if (!error.empty()) throw train_error(error);
  }

  /// A request to the DP group, answered with a `Result` (an error string
  /// for most: "" = done; the norm's double). Throws train_error when the
  /// DP group itself failed.
  template <class Result, class... Ts>
  Result ask_dp(Ts... xs) {
    Result r{};
    std::string failure;
    stage_self_->request(dp_actor_, caf::infinite, xs...)
        .receive([&](Result& x) { r = std::move(x); },
                 [&](caf::error& e) { failure = "the data-parallel group failed: " + to_string(e); });
    if (!failure.empty()) throw train_error(failure);
    return r;
  }

  /// Asks the DP group to do `xs`; throws its error.
  template <class... Ts>
  void tell_dp(Ts... xs) {
    if (std::string e = ask_dp<std::string>(xs...); !e.empty()) throw train_error(e);
  }

  void optimizer_step(int step, double loss) {
    wait_reductions(step);
    // Without the global norm every update is in already: the snapshot
    // leaves before the report (with it, after the update). The
    // coordinator prints the step once every buddy said it holds its copy.
    const bool snapshot = keeper_ && o_.snapshots_at(step, snapshot_every_) && step < o_.steps;
    if (snapshot && !needs_global_norm()) tell_dp(dp_msg::snapshot_atom::value, step, loss_scale_text(scaler_));
    double sum_squares = 0;
    bool skip = false;
    if (needs_global_norm()) sum_squares = ask_dp<double>(dp_msg::norm_atom::value, std::int64_t{step});
    train_report report{rank_, step, loss, sum_squares, comm_->job()};
    // A device queues its work: the host's time in the calls says nothing.
    report.compute_s = on_device_ ? 0.0 : compute_s_;
    if (o_.probes_at(step)) report.links = probe_links();
    comm_->send_coordinator(train_msg::report, encode_body(report));
    if (needs_global_norm()) {
      remote_message m = inbox_->take(train_key(train_msg::norm, comm_->job(), step, 0), o_.timeout,
                                      "gradient norm of step " + std::to_string(step) + " from the coordinator");
      auto note = decode_train_step(m.body);
      if (!note) throw train_error("bad gradient norm from the coordinator: " + error_message(note.error()));
      // Every rank sees the same norm, so all skip an overflowed step (the
      // parameters stay as they are everywhere: nothing to gather).
      skip = scaler_.dynamic() && overflowed(note->value);
      const double coef = grad_coefficient(note->value, scaler_.scale(), o_.optimizer.max_grad_norm);
      if (!skip) tell_dp(dp_msg::update_atom::value, std::int64_t{step}, adam_step(step), coef);
      scaler_.update(skip);
    }
    // Every bucket's update is in (waited for above, or just made): 16-bit
    // compute copies are converted again before the next forward.
    if (!skip)
      for (stage& part : model_.parts) part.params_changed();
    // Before the verdict: the coordinator waits for the buddies' copies
    // before it decides (train.kept).
    if (snapshot && needs_global_norm()) tell_dp(dp_msg::snapshot_atom::value, step, loss_scale_text(scaler_));
    if (o_.verdict_at(step)) take_verdict(step);
    // A drained job's last step is always saved: the next layout starts there.
    if (o_.checkpoints_at(step) || (step == last_step_ && last_step_ < o_.steps)) tell_dp(dp_msg::save_atom::value, step);
  }

  /// The rates of the links to this rank's neighbours of higher rank (each
  /// link is probed from one end), with echoes over the running links. A
  /// link too fast for the payload to tell reports 0; a probe that fails
  /// is left out (the step goes on: a dead peer is the inbox's business).
  /// The payload is 64 KiB, or about 25 ms at the rate last measured on a
  /// slower link (at least 8 KiB): a probe of a throttled link costs tens
  /// of milliseconds, not seconds.
  std::vector<train_link_rate> probe_links() {
    std::vector<train_link_rate> out;
    for (int q : neighbours_of(o_.layout, rank_, rings_)) {
      if (q <= rank_) continue;
      link_probe_options po;
      po.bytes = 64 << 10;
      if (const auto last = probe_rates_.find(q); last != probe_rates_.end() && last->second > 0)
        po.bytes = static_cast<std::size_t>(std::clamp(last->second * 0.025, 8192.0, 65536.0));
      po.rounds = 2;
      po.timeout = std::min(o_.timeout, std::chrono::milliseconds(10000));
      auto m = probe_link(node_, comm_->peer_id(q), po);
      if (m) {
        out.push_back({q, m->bps / 8});
      } else if (m.error().category() == error_category &&
                 m.error().code() == static_cast<std::uint8_t>(errc::invalid_argument)) {
        out.push_back({q, 0});
      } else {
        spdlog::warn("{}: cannot probe the link to {}: {}", o_.layout.label(rank_), o_.layout.label(q),
                     error_message(m.error()));
        continue;
      }
      probe_rates_[q] = out.back().bytes_per_s;
    }
    return out;
  }

  /// At a probe step: the coordinator's verdict on the measurements (a
  /// train.drain naming this step; value 1 = the layout changes, stop after
  /// it, 0 = go on). Waiting here keeps every rank at this step boundary
  /// while the scheduler decides, so a stop can never come too late.
  void take_verdict(int step) {
    remote_message m = inbox_->take(train_key(train_msg::drain, comm_->job(), step, 0), o_.timeout,
                                    "the coordinator's verdict after step " + std::to_string(step));
    auto note = decode_train_step(m.body);
    if (!note) throw train_error("bad verdict from the coordinator: " + error_message(note.error()));
    if (note->snapshot_every > 0) snapshot_every_ = note->snapshot_every;  // --snapshot-every auto
    if (note->value != 0) {
      last_step_ = step;
      spdlog::info("{} stops after step {}: the job is re-planned", o_.layout.label(rank_), step);
    }
  }

  // ---- the end ------------------------------------------------------------------

  void finish() {
    // Done: other ranks may finish and leave first; only the coordinator
    // going away now would be a failure.
    inbox_->drain(coordinator_id_);
    comm_->send_coordinator(train_msg::done, encode_body(train_step_note{last_step_, rank_, 0, comm_->job()}));
    inbox_->take(train_key(train_msg::finish, comm_->job(), last_step_, 0), o_.timeout, "the coordinator's end of the job");
    inbox_->close();
  }

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
  int handed_ = 0;              ///< buckets handed to the DP group this step
  caf::blocking_actor* stage_self_ = nullptr;  ///< the stage actor, while it runs
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

}  // namespace

void run_train_rank(node& n, const dist_train_options& o, int rank, const std::string& coordinator,
                    const rank_weights& weights, token_dataset& data, Backend* compute) {
  if (rank < 0 || rank >= o.layout.world())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a job of " +
                                std::to_string(o.layout.world()) + " ranks");
  if (!weights.be || !weights.blocks || !weights.head) throw std::invalid_argument("run_train_rank: incomplete weights");
  check_layout(o.layout, weights.cfg.n_layers);
  if (o.synthetic.enabled() && (o.synthetic.forward_s.size() != static_cast<std::size_t>(o.layout.pp) ||
                                o.synthetic.backward_s.size() != static_cast<std::size_t>(o.layout.pp)))
    throw std::invalid_argument("synthetic compute needs one forward and one backward time per stage");
  rank_runtime rt(n, o, rank, weights, data, compute);
  rt.run(coordinator);
}

}  // namespace corolla
