// One rank of a pipeline x data-parallel training job (actors/train_job.hpp):
// joining, the stage actor's steps, the DP group's requests and the end
// (the runtime's state: actors/train_rank_runtime.hpp; its setup:
// train_rank_setup.cpp).
#include "actors/train_rank_runtime.hpp"

namespace corolla {

namespace train_detail {

using schedule::pipeline_op;

rank_runtime::rank_runtime(node& n, const dist_train_options& o, int rank, const rank_weights& weights,
                           token_dataset& data, Backend* compute)
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

void rank_runtime::run(const std::string& coordinator) {
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
    start_watchdog();  // with hang_s 0 it only obeys the harness's stall
    {
      // Work, not a rank stuck, for the coordinator's stall check (a big
      // model loads for minutes).
      beacon_mark setting_up(*work_beacon_, "setup");
      if (o_.collectives == dp_collectives::device) join_device_groups();
      build_model();
      if (o_.resume) {
        restore();
        for (stage& part : model_.parts) part.params_changed();  // 16-bit compute copies follow the restored weights
      }
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
    // A holding rank keeps what its keeper holds in memory for the next
    // grid (its process waits for the launcher); else it goes to disk.
    if (!o_.hold_snapshots) flush_snapshots();
    throw;
  }
}

rank_runtime::~rank_runtime() {
  if (inbox_) inbox_->close();
  if (watchdog_) {
    node_.unpublish("train-watch");
    caf::anon_send_exit(watchdog_, caf::exit_reason::user_shutdown);
    caf::scoped_actor waiter{node_.system()};
    waiter->wait_for(watchdog_);  // it calls into this runtime
  }
  // A holding rank's keeper outlives the runtime: the next grid reads
  // from it while the process waits (run_train_rank's caller keeps the
  // node up).
  if (keeper_ && !o_.hold_snapshots) {
    node_.unpublish(snapshot_keeper_name(comm_->job()));
    caf::anon_send_exit(keeper_, caf::exit_reason::user_shutdown);
  }
  if (mailbox_) {
    node_.unpublish("train");
    caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
  }
}

void rank_runtime::run_actors() {
  auto program = (o_.layout.chunks > 1 ? schedule::make_interleaved(o_.layout.pp, m_, o_.layout.chunks)
                                       : schedule::make_1f1b(o_.layout.pp, m_))
                     .programs[static_cast<std::size_t>(stage_)];
  // From here on only the DP-group actor touches the buckets.
  dp_size_ = buckets_->size();
  slot_of_ = buckets_->slots();
  dp_actor_ = spawn_dp_group(node_, buckets_, dp_beacon_);
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

void rank_runtime::stop_dp_actor() {
  caf::anon_send_exit(dp_actor_, caf::exit_reason::user_shutdown);
  caf::scoped_actor waiter{node_.system()};
  waiter->wait_for(dp_actor_);
}

void rank_runtime::run_step(const std::vector<schedule::instruction>& program, int step) {
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
                                  "activations of micro-batch " + std::to_string(k) + " from " + l.label(from), from);
        flight[key].x = to_compute(x.view({rows, D}));
        break;
      }
      case pipeline_op::forward: {
        compute_window w(*beacon_, "forward", compute_s_);
        compute_->forward(k, c, v, flight[key]);
        break;
      }
      case pipeline_op::send_act:
        comm_->send(l.rank_of((v + 1) % l.pp, replica_), train_msg::act, {step, index(k, v + 1), 0, rank_},
                    to_host(flight[key].y));
        break;
      case pipeline_op::recv_grad: {
        const int from = l.rank_of((v + 1) % l.pp, replica_);
        Tensor dy = comm_->receive(train_msg::grad, step, index(k, v), 0, rows * D,
                                   "gradient of micro-batch " + std::to_string(k) + " from " + l.label(from), from);
        flight[key].dy = to_compute(dy.view({rows, D}));
        break;
      }
      case pipeline_op::backward: {
        // The chunk's last backward of the step: its buckets are final.
        const bool final_backward = ++backwards[static_cast<std::size_t>(c)] == m_;
        {
          compute_window w(*beacon_, "backward", compute_s_);
          loss += compute_->backward(k, c, v, flight[key], final_backward, scaler_.scale(),
                                     [this, step](int block) { enqueue(block, step); });
        }
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

Tensor rank_runtime::to_compute(Tensor host) {
  if (!on_device_) return host;
  Tensor d = be_.empty(host.shape());
  be_.copy(host, d);
  return d;
}

Tensor rank_runtime::to_host(const Tensor& t) {
  if (t.dev().kind == device_kind::cpu) return t;
  Tensor h = Tensor::empty(t.shape());
  be_.copy(t, h);
  return h;
}

void rank_runtime::enqueue(int id, std::int64_t step) {
  std::shared_ptr<queue_marker> ready = on_device_ ? be_.mark() : nullptr;
  stage_self_->send(dp_actor_, dp_msg::reduce_atom::value, slot_of_.at(id), step, adam_step(step), std::move(ready));
  ++handed_;
}

void rank_runtime::wait_reductions(int step) {
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

void rank_runtime::optimizer_step(int step, double loss) {
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
  if (o_.probes_at(step)) {
    // Work, not a wait, for the coordinator's stall check; not a compute
    // call for the watchdog (a slow link's probe is no hang).
    beacon_mark probing(*work_beacon_, "link probe");
    report.links = probe_links();
  }
  comm_->send_coordinator(train_msg::report, encode_body(report));
  if (needs_global_norm()) {
    remote_message m = inbox_->take(train_key(train_msg::norm, comm_->job(), step, 0), o_.timeout,
                                    "gradient norm of step " + std::to_string(step) + " from the coordinator",
                                    schedule::from_coordinator);
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
  // A drained job's last step is always kept: the next layout starts
  // there (a checkpoint, or with drains_to_memory this step's snapshot).
  if (o_.saves_at(step, last_step_)) tell_dp(dp_msg::save_atom::value, step);
}

std::vector<schedule::link_measurement> rank_runtime::probe_links() {
  std::vector<schedule::link_measurement> out;
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
      out.push_back({rank_, q, m->bps / 8});
    } else if (m.error().category() == error_category &&
               m.error().code() == static_cast<std::uint8_t>(errc::invalid_argument)) {
      out.push_back({rank_, q, 0});
    } else {
      spdlog::warn("{}: cannot probe the link to {}: {}", o_.layout.label(rank_), o_.layout.label(q),
                   error_message(m.error()));
      continue;
    }
    probe_rates_[q] = out.back().bandwidth;
  }
  return out;
}

void rank_runtime::take_verdict(int step) {
  remote_message m = inbox_->take(train_key(train_msg::drain, comm_->job(), step, 0), o_.timeout,
                                  "the coordinator's verdict after step " + std::to_string(step), schedule::from_coordinator);
  auto note = decode_train_step(m.body);
  if (!note) throw train_error("bad verdict from the coordinator: " + error_message(note.error()));
  if (note->snapshot_every > 0) snapshot_every_ = note->snapshot_every;  // --snapshot-every auto
  if (note->value != 0) {
    last_step_ = step;
    spdlog::info("{} stops after step {}: the job is re-planned", o_.layout.label(rank_), step);
  }
}

void rank_runtime::finish() {
  // Done: other ranks may finish and leave first; only the coordinator
  // going away now would be a failure.
  inbox_->drain(coordinator_id_);
  comm_->send_coordinator(train_msg::done, encode_body(train_step_note{last_step_, rank_, 0, comm_->job()}));
  inbox_->take(train_key(train_msg::finish, comm_->job(), last_step_, 0), o_.timeout, "the coordinator's end of the job",
               schedule::from_coordinator);
  inbox_->close();
}

}  // namespace train_detail

int run_train_rank(node& n, const dist_train_options& o, int rank, const std::string& coordinator,
                   const rank_weights& weights, token_dataset& data, Backend* compute) {
  if (rank < 0 || rank >= o.layout.world())
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside a job of " +
                                std::to_string(o.layout.world()) + " ranks");
  if (!weights.be || !weights.blocks || !weights.head) throw std::invalid_argument("run_train_rank: incomplete weights");
  check_layout(o.layout, weights.cfg.n_layers);
  if (o.synthetic.enabled() && (o.synthetic.forward_s.size() != static_cast<std::size_t>(o.layout.pp) ||
                                o.synthetic.backward_s.size() != static_cast<std::size_t>(o.layout.pp)))
    throw std::invalid_argument("synthetic compute needs one forward and one backward time per stage");
  train_detail::rank_runtime rt(n, o, rank, weights, data, compute);
  rt.run(coordinator);
  return rt.last_step();
}

}  // namespace corolla
