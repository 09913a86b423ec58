// One rank's stage actor (actors/train_rank_runtime.hpp): the pipeline
// schedule's steps as a state machine driven by messages, its requests to
// the DP-group actor beside it, and the end of the job.
#include "actors/train_rank_runtime.hpp"

namespace corolla::train_detail {

using schedule::pipeline_op;

namespace {

namespace stage_msg {
/// Starts step N (or ends the stage after the last).
using step_atom = caf::atom_constant<caf::atom("stgstep")>;
}  // namespace stage_msg

}  // namespace

// Templates first: the handlers below use them.

template <class F>
void rank_runtime::guard(F&& f) {
  if (*stage_settled_) return;
  try {
    f();
  } catch (...) {
    end_stage(std::current_exception());
  }
}

template <class... Results, class Then, class... Ts>
void rank_runtime::ask_dp(Then then, Ts... xs) {
  stage_self_->request(dp_actor_, caf::infinite, xs...)
      .then([this, then](Results&... r) { guard([&] { then(std::move(r)...); }); },
            [this](caf::error& e) {
              guard([&] { throw train_error("the data-parallel group failed: " + error_message(e)); });
            });
}

template <class... Ts>
void rank_runtime::tell_dp(std::function<void()> then, Ts... xs) {
  ask_dp<std::string>(
      [then](std::string e) {
        if (!e.empty()) throw train_error(e);
        then();
      },
      xs...);
}

void rank_runtime::run_actors() {
  program_ = (o_.layout.chunks > 1 ? schedule::make_interleaved(o_.layout.pp, m_, o_.layout.chunks)
                                   : schedule::make_1f1b(o_.layout.pp, m_))
                 .programs[static_cast<std::size_t>(stage_)];
  // From here on only the DP-group actor touches the buckets.
  dp_size_ = buckets_->size();
  slot_of_ = buckets_->slots();
  params_left_ = buckets_->kept_param_values();
  dp_actor_ = spawn_dp_group(node_, buckets_, dp_beacon_);
  waiter_ = std::make_unique<inbox_waiter>(inbox_, o_.timeout);
  stage_done_ = std::make_shared<std::promise<void>>();
  stage_settled_ = std::make_shared<std::atomic<bool>>(false);
  auto finished = stage_done_->get_future();
  auto* self = this;
  caf::actor stage = node_.system().spawn<caf::detached>([self](caf::event_based_actor* stage_self) -> caf::behavior {
    self->stage_self_ = stage_self;
    self->waiter_->bind(stage_self);
    // Ended by anything but end_stage (an exit message): run_actors must
    // not wait for ever.
    stage_self->attach_functor([done = self->stage_done_, settled = self->stage_settled_](const caf::error& reason) {
      if (!settled->exchange(true))
        done->set_exception(std::make_exception_ptr(train_error("the stage actor ended: " + error_message(reason))));
    });
    // The DP-group actor ending first (it outlives the stage otherwise)
    // would leave a request to it unanswered.
    stage_self->monitor(self->dp_actor_);
    stage_self->set_down_handler([self](caf::down_msg& d) {
      self->guard([&] {
        throw train_error("the data-parallel group stopped: " +
                          (d.reason ? error_message(d.reason) : std::string("it finished")));
      });
    });
    stage_self->send(stage_self, stage_msg::step_atom::value, self->steps_done_ + 1);
    return self->stage_behavior();
  });
  // The actor quits in the handler that ends the stage; its handlers use
  // this runtime until then.
  auto stage_gone = [&] {
    caf::scoped_actor waiter{node_.system()};
    waiter->wait_for(stage);
  };
  try {
    finished.get();
  } catch (...) {
    stage_gone();
    // Unblock the DP-group actor's waits before it goes away.
    inbox_->fail("rank " + std::to_string(rank_) + " stopped");
    stop_dp_actor();
    throw;
  }
  stage_gone();
  stop_dp_actor();
}

void rank_runtime::stop_dp_actor() {
  caf::anon_send_exit(dp_actor_, caf::exit_reason::user_shutdown);
  caf::scoped_actor waiter{node_.system()};
  waiter->wait_for(dp_actor_);
}

caf::behavior rank_runtime::stage_behavior() {
  return {
      [this](stage_msg::step_atom, int step) { guard([&] { begin_step(step); }); },
      [this](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
        guard([&] { waiter_->on_delivery(token, std::move(m)); });
      },
      [this](inbox_failure_atom, std::uint64_t token, std::string& reason) {
        guard([&] { waiter_->on_failure(token, reason); });
      },
      [this](inbox_deadline_atom, std::uint64_t timer) { guard([&] { waiter_->on_deadline(timer); }); },
      [this](dp_msg::reduced_atom, int, std::string& error, int side_by_side) {
        guard([&] {
          ++reduced_;
          rings_side_by_side_ = std::max(rings_side_by_side_, side_by_side);
          if (!error.empty() && reduce_error_.empty()) reduce_error_ = std::move(error);
          if (on_reduced_) check_reductions();
        });
      },
  };
}

void rank_runtime::end_stage(std::exception_ptr failure) {
  if (stage_settled_->exchange(true)) return;
  if (failure)
    stage_done_->set_exception(failure);
  else
    stage_done_->set_value();
  stage_self_->quit();
}

// ---- the program ------------------------------------------------------------------

void rank_runtime::begin_step(int step) {
  if (step > last_step_) {
    end_steps();
    return;
  }
  st_ = step_state{};
  st_.step = step;
  st_.backwards.assign(static_cast<std::size_t>(o_.layout.chunks), 0);
  handed_ = 0;
  reduced_ = 0;
  rings_side_by_side_ = 0;
  reduce_error_.clear();
  compute_s_ = 0;
  data_.next_batch(o_.batch, o_.seq, ids_, targets_);
  compute_->begin_step(ids_, targets_);
  advance();
}

void rank_runtime::land(std::pair<int, int> key, bool grad, const Tensor& t) {
  const std::int64_t rows = static_cast<std::int64_t>(mb_) * o_.seq;
  in_flight& f = st_.flight[key];
  (grad ? f.dy : f.x) = to_compute(t.view({rows, cfg_.hidden_size}));
}

void rank_runtime::advance() {
  const train_layout& l = o_.layout;
  const int V = l.virtual_stages();
  const int step = st_.step;
  const std::int64_t numel = static_cast<std::int64_t>(mb_) * o_.seq * cfg_.hidden_size;
  // Messages of micro-batch k for virtual stage v are filed under index
  // k * V + v (the receiver's virtual stage).
  auto index = [V](int k, int v) { return k * V + v; };
  while (st_.pc < program_.size()) {
    const schedule::instruction& ins = program_[st_.pc];
    const int k = ins.micro_batch;
    const int c = ins.chunk;
    const int v = l.virtual_stage(stage_, c);
    const std::pair<int, int> key{k, c};
    switch (ins.op) {
      case pipeline_op::load_micro_batch: break;
      case pipeline_op::recv_act:
      case pipeline_op::recv_grad: {
        const bool grad = ins.op == pipeline_op::recv_grad;
        const int from = l.rank_of((grad ? v + 1 : v - 1) % l.pp, replica_);
        const std::string what = (grad ? "gradient" : "activations") + std::string(" of micro-batch ") +
                                 std::to_string(k) + " from " + l.label(from);
        const char* type = grad ? train_msg::grad : train_msg::act;
        auto later = [this, key, grad, what, numel](remote_message m) {
          land(key, grad, train_comm::tensor_of(m, numel, what));
          ++st_.pc;
          advance();
        };
        auto m = await(comm_->key(type, step, index(k, v)), what, from, later);
        if (!m) return;  // its handler goes on
        land(key, grad, train_comm::tensor_of(*m, numel, what));
        break;
      }
      case pipeline_op::forward: {
        compute_window w(*beacon_, "forward", compute_s_);
        compute_->forward(k, c, v, st_.flight[key]);
        break;
      }
      case pipeline_op::send_act:
        comm_->send(l.rank_of((v + 1) % l.pp, replica_), train_msg::act, {step, index(k, v + 1), 0, rank_},
                    to_host(st_.flight[key].y));
        break;
      case pipeline_op::backward: {
        // The chunk's last backward of the step: its buckets are final.
        const bool final_backward = ++st_.backwards[static_cast<std::size_t>(c)] == m_;
        {
          compute_window w(*beacon_, "backward", compute_s_);
          st_.loss += compute_->backward(k, c, v, st_.flight[key], final_backward, scaler_.scale(),
                                         [this, step](int block) { enqueue(block, step); });
        }
        if (v == 0) st_.flight.erase(key);  // nothing to send back: done with this micro-batch
        break;
      }
      case pipeline_op::send_grad:
        comm_->send(l.rank_of((v - 1) % l.pp, replica_), train_msg::grad, {step, index(k, v - 1), 0, rank_},
                    to_host(st_.flight[key].dx));
        st_.flight.erase(key);
        break;
      case pipeline_op::reduce_grads:
        if (model_.head_part && !model_.adapter && !st_.head_enqueued) {  // a LoRA job's head has no bucket
          enqueue(head_bucket, step);
          st_.head_enqueued = true;
        }
        break;
      case pipeline_op::optimizer_step:
        ++st_.pc;
        optimizer_step();  // its last phase calls advance again
        return;
    }
    ++st_.pc;
  }
  // A message to itself: a run of many steps does not nest calls.
  stage_self_->send(stage_self_, stage_msg::step_atom::value, step + 1);
}

void rank_runtime::end_steps() {
  // --save: the coordinator asks for the parameters this rank keeps, one
  // piece at a time; then finish.
  if (!o_.save_dir.empty() && last_step_ == o_.steps) {
    inbox_->drain(coordinator_id_);  // its peers may finish and leave now
    answer_params_ask(0);
    return;
  }
  finish();
}

void rank_runtime::answer_params_ask(int n) {
  if (params_left_ == 0) {
    finish();
    return;
  }
  auto on_ask = [this, n](remote_message m) {
    auto p = decode_train_packet(m.body);
    if (!p) throw train_error("a malformed ask for parameters from the coordinator: " + error_message(p.error()));
    tell_dp(
        [this, n, sent = p->hi - p->lo] {
          // The DP group refused any range but the next unsent one.
          params_left_ -= sent;
          answer_params_ask(n + 1);
        },
        dp_msg::publish_atom::value, o_.steps, p->index, n, p->lo, p->hi);
  };
  if (auto m = await(comm_->key(train_msg::params_ask, o_.steps, 0, n), "the coordinator's ask for parameters",
                     schedule::from_coordinator, on_ask, coordinator_timeout()))
    on_ask(std::move(*m));
}

void rank_runtime::finish() {
  // Done: other ranks may finish and leave first; only the coordinator
  // going away now would be a failure.
  inbox_->drain(coordinator_id_);
  comm_->send_coordinator(train_msg::done, encode_body(train_step_note{last_step_, rank_, 0, comm_->job()}));
  auto over = [this] {
    inbox_->close();
    end_stage(nullptr);
  };
  if (await(comm_->key(train_msg::finish, last_step_, 0), "the coordinator's end of the job",
            schedule::from_coordinator, [over](remote_message) { over(); }, coordinator_timeout()))
    over();
}

// ---- the DP group -------------------------------------------------------------------

void rank_runtime::enqueue(int id, std::int64_t step) {
  std::shared_ptr<queue_marker> ready = on_device_ ? be_.mark() : nullptr;
  stage_self_->send(dp_actor_, dp_msg::reduce_atom::value, slot_of_.at(id), step, adam_step(step), std::move(ready));
  ++handed_;
}

void rank_runtime::wait_reductions(std::function<void()> then) {
  if (handed_ != dp_size_)
    throw train_error("internal: " + std::to_string(handed_) + " of " + std::to_string(dp_size_) +
                      " buckets handed to the DP group in step " + std::to_string(st_.step));
  on_reduced_ = std::move(then);
  waiter_->expect("the data-parallel group did not reduce the buckets of step " + std::to_string(st_.step) +
                  " within " + std::to_string(o_.timeout.count()) + " ms");
  check_reductions();
}

void rank_runtime::check_reductions() {
  if (reduced_ < handed_) {
    waiter_->progress();  // each answer may take the timeout
    return;
  }
  waiter_->settle();
  std::function<void()> next = std::move(on_reduced_);
  on_reduced_ = nullptr;
  if (!reduce_error_.empty()) throw train_error(reduce_error_);
  next();
}

// ---- the optimizer step ---------------------------------------------------------------

void rank_runtime::optimizer_step() {
  wait_reductions([this] {
    // Without the global norm every update is in already: the snapshot
    // leaves before the report (with it, after the update). The
    // coordinator prints the step once every buddy said it holds its copy.
    st_.snapshot = keeper_ && o_.snapshots_at(st_.step, snapshot_every_) && st_.step < o_.steps;
    auto norm = [this] {
      if (!needs_global_norm()) return report_step(0);
      ask_dp<double>([this](double sum_squares) { report_step(sum_squares); }, dp_msg::norm_atom::value,
                     std::int64_t{st_.step});
    };
    if (st_.snapshot && !needs_global_norm())
      tell_dp(norm, dp_msg::snapshot_atom::value, st_.step, loss_scale_text(scaler_));
    else
      norm();
  });
}

void rank_runtime::report_step(double sum_squares) {
  const int step = st_.step;
  train_report report{rank_, step, st_.loss, sum_squares, comm_->job()};
  // A device queues its work: the host's time in the calls says nothing.
  report.compute_s = on_device_ ? 0.0 : compute_s_;
  report.rings_side_by_side = rings_side_by_side_;
  report.updates_side_by_side = updates_side_by_side_;  // the step before's
  updates_side_by_side_ = 0;
  if (o_.probes_at(step)) {
    // Work, not a wait, for the coordinator's stall check; not a compute
    // call for the watchdog (a slow link's probe is no hang).
    beacon_mark probing(*work_beacon_, "link probe");
    report.links = probe_links();
  }
  comm_->send_coordinator(train_msg::report, encode_body(report));
  if (!needs_global_norm()) return after_update(false);
  auto m = await(comm_->key(train_msg::norm, step, 0),
                 "gradient norm of step " + std::to_string(step) + " from the coordinator", schedule::from_coordinator,
                 [this](remote_message m) { apply_norm(m); }, coordinator_timeout());
  if (m) apply_norm(*m);
}

void rank_runtime::apply_norm(const remote_message& m) {
  auto note = decode_train_step(m.body);
  if (!note) throw train_error("bad gradient norm from the coordinator: " + error_message(note.error()));
  // Every rank sees the same norm, so all skip an overflowed step (the
  // parameters stay as they are everywhere: nothing to gather).
  const bool skip = scaler_.dynamic() && overflowed(note->value);
  if (skip) {
    scaler_.update(true);
    return after_update(true);
  }
  const double coef = grad_coefficient(note->value, scaler_.scale(), o_.optimizer.max_grad_norm);
  ask_dp<std::string, int>(
      [this](std::string error, int side_by_side) {
        if (!error.empty()) throw train_error(error);
        updates_side_by_side_ = side_by_side;  // in the next step's report
        scaler_.update(false);
        after_update(false);
      },
      dp_msg::update_atom::value, std::int64_t{st_.step}, adam_step(st_.step), coef);
}

void rank_runtime::after_update(bool skip) {
  // Every bucket's update is in (waited for, or just made): 16-bit compute
  // copies are converted again before the next forward.
  if (!skip && model_.adapter)
    model_.refresh_factors();  // the model's own weights are frozen
  else if (!skip)
    for (stage& part : model_.parts) part.params_changed();
  // Before the verdict: the coordinator waits for the buddies' copies
  // before it decides (train.kept).
  if (st_.snapshot && needs_global_norm())
    tell_dp([this] { take_verdict(); }, dp_msg::snapshot_atom::value, st_.step, loss_scale_text(scaler_));
  else
    take_verdict();
}

void rank_runtime::take_verdict() {
  if (!o_.verdict_at(st_.step)) return save_step();
  auto m = await(comm_->key(train_msg::drain, st_.step, 0),
                 "the coordinator's verdict after step " + std::to_string(st_.step), schedule::from_coordinator,
                 [this](remote_message m) {
                   apply_verdict(m);
                   save_step();
                 },
                 coordinator_timeout());
  if (!m) return;
  apply_verdict(*m);
  save_step();
}

void rank_runtime::apply_verdict(const remote_message& m) {
  auto note = decode_train_step(m.body);
  if (!note) throw train_error("bad verdict from the coordinator: " + error_message(note.error()));
  if (note->snapshot_every > 0) snapshot_every_ = note->snapshot_every;  // --snapshot-every auto
  if (note->value != 0) {
    last_step_ = st_.step;
    spdlog::info("{} stops after step {}: the job is re-planned", o_.layout.label(rank_), st_.step);
  }
}

void rank_runtime::save_step() {
  // A drained job's last step is always kept: the next layout starts
  // there (a checkpoint, or with drains_to_memory this step's snapshot).
  if (o_.saves_at(st_.step, last_step_)) {
    tell_dp([this] { advance(); }, dp_msg::save_atom::value, st_.step);
    return;
  }
  advance();
}

}  // namespace corolla::train_detail
