// The training job's coordinator (actors/train_job.hpp,
// run_train_coordinator): an event-based actor that gathers the ranks,
// sums their reports step by step, hands out norms and verdicts, commits
// checkpoints and saves the model. It never blocks on its ranks: each
// message it needs next comes to it as an actor message (stall_watch's
// awaits, with the stall check); at a verdict step it asks the elastic
// scheduler actor and goes on with the answer. What it calls may take
// time: the launcher's hooks (on_roster, on_step), a checkpoint's commit,
// the model's save; the actor is detached for them.
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_save.hpp"
#include "actors/train_scheduler.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_stall.hpp"
#include "actors/train_store.hpp"
#include "model/block.hpp"
#include "model/head.hpp"
#include "schedule/snapshot_interval.hpp"

namespace corolla {

namespace {

namespace coord_msg {
/// Starts the job (the actor's first message to itself).
using start_atom = caf::atom_constant<caf::atom("tcstart")>;
/// Starts step N (or ends the run after the last).
using step_atom = caf::atom_constant<caf::atom("tcstep")>;
/// The moment given to a failing rank's own reason is over.
using fail_atom = caf::atom_constant<caf::atom("tcfail")>;
}  // namespace coord_msg

/// One message the coordinator waits for (stall_watch::await's arguments).
struct wanted {
  const char* type;
  std::int64_t step;
  int slot, from;
  std::string what;
  bool judge = true;
  int hop = 0;
};

class coordinator {
 public:
  coordinator(node& n, const dist_train_options& o, const model_config& cfg, const coordinator_hooks& hooks,
              std::shared_ptr<train_inbox> inbox)
      : node_(n),
        o_(o),
        cfg_(cfg),
        hooks_(hooks),
        world_(o.layout.world()),
        job_(checkpoint_key(o, cfg)),
        join_(join_key(o, cfg)),
        scaler_(o.optimizer.loss_scale),
        inbox_(inbox ? std::move(inbox) : std::make_shared<train_inbox>()),
        stall_(n, o.layout, o.hang_s, inbox_, o.timeout) {}

  /// Runs the job in an actor of its own; returns the last step run.
  int run() {
    auto finished = done_->get_future();
    caf::actor a = node_.system().spawn<caf::detached>([this](caf::event_based_actor* self) -> caf::behavior {
      self_ = self;
      stall_.bind(self);
      // Ended by anything but settle (an exit message): run must not wait
      // for ever.
      // A failure being reported says more than the exit that cut it
      // short. (Only shared state here: run() may already be past its
      // wait for the actor, and this object gone, when this runs.)
      self->attach_functor([done = done_, settled = settled_, failure = failure_](const caf::error& reason) {
        if (settled->exchange(true)) return;
        done->set_exception(*failure ? *failure
                                     : std::make_exception_ptr(
                                           train_error("the coordinator ended: " + error_message(reason))));
      });
      self->send(self, coord_msg::start_atom::value);
      return behavior();
    });
    // The actor quits in the handler that settles; it uses this object
    // until then.
    auto gone = [&] {
      caf::scoped_actor waiter{node_.system()};
      waiter->wait_for(a);
    };
    try {
      const int last = finished.get();
      gone();
      return last;
    } catch (...) {
      gone();
      throw;
    }
  }

  ~coordinator() { release(); }

 private:
  caf::behavior behavior() {
    return {
        [this](coord_msg::start_atom) { guard([&] { start(); }); },
        [this](coord_msg::step_atom, int step) { guard([&] { begin_step(step); }); },
        [this](inbox_delivery_atom, std::uint64_t token, remote_message& m) {
          guard([&] { stall_.waiter().on_delivery(token, std::move(m)); });
        },
        [this](inbox_failure_atom, std::uint64_t token, std::string& reason) {
          guard([&] { stall_.waiter().on_failure(token, reason); });
        },
        [this](inbox_deadline_atom, std::uint64_t timer) { guard([&] { stall_.waiter().on_deadline(timer); }); },
        [this](stall_check_atom, std::uint64_t wait, int phase) { guard([&] { stall_.on_check(wait, phase); }); },
        [this](coord_msg::fail_atom) { abort_ranks(); },
    };
  }

  /// Runs a step of the job; what it throws fails the job.
  template <class F>
  void guard(F&& f) {
    if (*failure_ || *settled_) return;
    try {
      f();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  // ---- the end ------------------------------------------------------------

  /// The failure path: ranks that fail tell the coordinator why before
  /// their nodes say goodbye; a vague reason gets a moment for the root
  /// cause to arrive.
  void fail(std::exception_ptr e) {
    *failure_ = e;
    stall_.waiter().cancel();  // the inbox forgets this actor's wait
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      reason_ = x.what();
    } catch (...) {
      reason_ = "unknown failure";
    }
    if (is_vague_failure(reason_)) {
      self_->delayed_send(caf::actor_cast<caf::actor>(self_), std::chrono::milliseconds(300), coord_msg::fail_atom::value);
      return;
    }
    abort_ranks();
  }

  void abort_ranks() {
    std::string reason = reason_;
    try {
      if (is_vague_failure(reason))
        if (auto better = inbox_->failure()) reason = *better;
      inbox_->close();
      // Every rank that joined, also those whose join was not taken yet.
      for (const std::string& id : inbox_->named_peers()) {
        auto a = node_.remote_actor(id, "train");
        if (!a) continue;
        remote_message m;
        m.type = train_msg::abort;
        m.body = encode_abort_body("the job failed: " + reason, run_);
        caf::anon_send(*a, std::move(m));
      }
    } catch (const std::exception& e) {
      // The job's own failure is what run() reports.
      spdlog::warn("training job {}: telling the ranks the job failed: {}", o_.layout.describe(), e.what());
    }
    settle(reason != reason_ ? std::make_exception_ptr(train_error(reason)) : *failure_, 0);
  }

  /// The job's end, either way; the actor quits. Nothing may use this
  /// object after the promise is kept (run() then destroys it).
  void settle(std::exception_ptr failure, int last) {
    if (settled_->exchange(true)) return;
    release();
    auto* self = self_;
    auto done = done_;
    self->quit();
    if (failure)
      done->set_exception(failure);
    else
      done->set_value(last);
  }

  /// Closes the inbox, unpublishes the coordinator, stops its mailbox.
  void release() {
    inbox_->close();
    if (mailbox_) {
      node_.unpublish("train-coord");
      caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
      mailbox_ = nullptr;
    }
  }

  // ---- waits --------------------------------------------------------------

  /// The messages `ws` one after another, each handed to `each` with its
  /// index; then `then`.
  void take_each(std::shared_ptr<const std::vector<wanted>> ws, std::size_t i,
                 std::function<void(std::size_t, remote_message)> each, std::function<void()> then) {
    for (; i < ws->size(); ++i) {
      const wanted& w = (*ws)[i];
      auto later = [this, ws, i, each, then](remote_message m) {
        each(i, std::move(m));
        take_each(ws, i + 1, each, then);
      };
      auto m = stall_.await(w.type, w.step, w.slot, w.from, w.what, std::move(later), w.judge, w.hop);
      if (!m) return;  // its delivery goes on
      each(i, std::move(*m));
    }
    then();
  }

  /// One message of `type` for `step` from every rank (of `ranks`; all by default).
  void take_all(const char* type, std::int64_t step, const std::string& what, bool judge,
                std::function<void(int, remote_message)> each, std::function<void()> then,
                std::vector<int> ranks = {}) {
    if (ranks.empty())
      for (int r = 0; r < world_; ++r) ranks.push_back(r);
    auto ws = std::make_shared<std::vector<wanted>>();
    for (int r : ranks) ws->push_back({type, step, r, r, what, judge});
    take_each(ws, 0, [ws, each](std::size_t i, remote_message m) { each((*ws)[i].from, std::move(m)); },
              std::move(then));
  }

  void send(int rank, const char* type, std::vector<std::uint8_t> body) {
    auto a = node_.remote_actor(ids_.at(rank), "train");
    if (!a) throw train_error("cannot reach " + o_.layout.label(rank) + ": " + error_message(a.error()));
    remote_message m;
    m.type = type;
    m.body = std::move(body);
    caf::anon_send(*a, std::move(m));
  }

  // ---- the start ----------------------------------------------------------

  void start() {
    inbox_->set_job(run_);
    auto mb = start_train_mailbox(node_, inbox_, "train-coord", /*joins_only_from_strangers=*/true);
    if (!mb) throw train_error("cannot publish the coordinator: " + error_message(mb.error()));
    mailbox_ = *mb;
    gather(0);
  }

  // Every rank's join, checked against this job, then the roster to all.
  void gather(int rank) {
    for (; rank < world_; ++rank) {
      auto later = [this, rank](remote_message m) {
        joined(rank, std::move(m));
        gather(rank + 1);
      };
      auto m = stall_.waiter().await(train_key(train_msg::join, 0, 0, rank), "join of rank " + std::to_string(rank),
                                     schedule::from_unknown, std::move(later));
      if (!m) return;
      joined(rank, std::move(*m));
    }
    const auto body = encode_body(roster_);
    stall_.set_run(run_, ids_);
    for (int r = 0; r < world_; ++r) send(r, train_msg::roster, body);
    if (hooks_.on_roster) hooks_.on_roster(roster_.peers, run_);
    spdlog::info("training job {}: all {} ranks joined", o_.layout.describe(), world_);
    first_step();
  }

  void joined(int rank, remote_message m) {
    auto j = decode_train_join(m.body);
    if (!j) throw train_error("bad join from node " + m.from_node + ": " + error_message(j.error()));
    if (j->world != world_ || j->job_key != join_)
      throw train_error("rank " + std::to_string(rank) + " (node " + m.from_node + ") belongs to another job: '" +
                        j->job_key + "' of " + std::to_string(j->world) + " ranks, this one is '" + join_ + "' of " +
                        std::to_string(world_));
    ids_[rank] = m.from_node;
    inbox_->name_peer(m.from_node, o_.layout.label(rank));
    roster_.job = run_;
    roster_.peers.push_back({rank, m.from_node, j->endpoint});
  }

  void first_step() {
    if (o_.resume && o_.from_memory.step > 0) {
      // The ranks read the failed grid's in-memory snapshots.
      try {
        if (const auto st = parse_loss_scale_text(o_.from_memory.loss_scale)) scaler_.set_state(*st);
      } catch (const std::invalid_argument& e) {
        throw train_error(std::string(e.what()) + " in the snapshots");
      }
      first_ = o_.from_memory.step + 1;
    } else if (o_.resume) {
      const int s = latest_checkpoint_step(o_.checkpoint_dir);
      if (s == 0) throw train_error("no checkpoint in " + o_.checkpoint_dir.string() + " to resume from");
      check_manifest(o_.checkpoint_dir, s, job_);
      if (const auto st = checkpoint_loss_scale(o_.checkpoint_dir, s)) scaler_.set_state(*st);
      first_ = s + 1;
    }
    last_time_ = std::chrono::steady_clock::now();
    last_ = o_.steps;  // a drain moves it closer
    begin_step(first_);
  }

  // ---- a step -------------------------------------------------------------

  void begin_step(int step) {
    if (step > last_) {
      end_run();
      return;
    }
    r_ = dist_step_report{};
    r_.step = step;
    sum_squares_ = 0;
    r_.compute_s.assign(static_cast<std::size_t>(world_), 0.0);
    take_all(
        train_msg::report, step, "report of step " + std::to_string(step), true,
        [this](int rank, remote_message m) { add_report(rank, m); }, [this] { reported(); });
  }

  void add_report(int rank, const remote_message& m) {
    auto rep = decode_train_report(m.body);
    if (!rep) throw train_error("bad report from " + o_.layout.label(rank) + ": " + error_message(rep.error()));
    r_.loss += rep->loss;
    sum_squares_ += rep->sum_squares;
    r_.compute_s[static_cast<std::size_t>(rank)] = rep->compute_s;
    r_.rings_side_by_side = std::max(r_.rings_side_by_side, rep->rings_side_by_side);
    r_.updates_side_by_side = std::max(r_.updates_side_by_side, rep->updates_side_by_side);
    for (const schedule::link_measurement& l : rep->links)
      if (l.to > rank && l.to < world_) r_.links.push_back({rank, l.to, l.bandwidth});
  }

  void reported() {
    const int step = r_.step;
    // Ranks take the verdict on overflow from this norm of the scaled
    // gradients; the coordinator's scaler follows theirs step by step.
    const double scaled_norm = std::sqrt(sum_squares_);
    if (o_.optimizer.max_grad_norm > 0.0f || scaler_.dynamic())
      for (int rank = 0; rank < world_; ++rank)
        send(rank, train_msg::norm, encode_body(train_step_note{step, 0, scaled_norm, run_}));
    r_.loss_scale = scaler_.scale();
    r_.grad_norm = scaled_norm / r_.loss_scale;
    r_.skipped = scaler_.dynamic() && overflowed(scaled_norm);
    scaler_.update(r_.skipped);
    reported_at_ = std::chrono::steady_clock::now();
    r_.seconds = std::chrono::duration<double>(reported_at_ - last_time_).count();
    last_time_ = reported_at_;
    stall_.step_took(step, first_, r_.seconds);
    // In-memory snapshots: a printed step survives any one rank's loss.
    // Its buddy's keeper holds every rank's copy of it before it is
    // printed (train.kept; a few milliseconds, and the ranks go on). A
    // buddy's train.kept is not judged: it comes when a snapshot's copy
    // has crossed the link, which takes as long as the link needs while
    // the ranks, done with the step, may wait for this coordinator.
    if (o_.snapshots_at(step, snapshot_every_) && step < o_.steps) {
      std::vector<int> keeping;
      for (int rank = 0; rank < world_; ++rank)
        if (snapshot_buddy(o_.layout, rank) >= 0) keeping.push_back(rank);
      if (!keeping.empty()) {
        take_all(
            train_msg::kept, step, "the buddy's copy of the snapshot of step " + std::to_string(step), false,
            [](int, remote_message) {}, [this] { kept(true); }, keeping);
        return;
      }
      kept(true);
      return;
    }
    kept(false);
  }

  void kept(bool snapshot) {
    const int step = r_.step;
    if (snapshot) {
      r_.snapshot_copy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - reported_at_).count();
      if (adapts_snapshots_) copies_s_.push_back(r_.snapshot_copy_s);
    }
    if (adapts_snapshots_ && step > first_) steps_s_.push_back(r_.seconds);  // the first includes the grid's start
    const bool verdict = o_.verdict_at(step);
    if (verdict && adapts_snapshots_) choose_snapshot_interval(r_);
    r_.snapshot_every = snapshot_every_;
    if (hooks_.on_step) hooks_.on_step(r_);
    if (!verdict) return after_verdict();
    // Every rank waits at this step boundary for the verdict (and, with
    // --snapshot-every auto, takes the interval from it).
    if (!hooks_.scheduler || o_.checkpoint_dir.empty()) return give_verdict(false);
    drain_query q;
    q.report = r_;
    // Bounded as every wait of the job is, plus the scheduler's own wait
    // for the lobby: a scheduler that never answers fails the job.
    self_->request(hooks_.scheduler, o_.timeout + lobby_answer_timeout, sched_msg::verdict_atom::value, std::move(q))
        .then(
            [this](drain_verdict& v) {
              guard([&] {
                if (hooks_.on_verdict_notes) hooks_.on_verdict_notes(v.notes);
                give_verdict(v.drain);
              });
            },
            [this](caf::error& e) {
              guard([&] { throw train_error("the training scheduler failed: " + error_message(e)); });
            });
  }

  /// The verdict of this step to every rank: go on, or (`stop`) stop here.
  void give_verdict(bool stop) {
    const int step = r_.step;
    train_step_note note{step, 0, stop ? 1.0 : 0.0, run_};
    note.snapshot_every = o_.snapshot_auto ? snapshot_every_ : 0;
    for (int rank = 0; rank < world_; ++rank) send(rank, train_msg::drain, encode_body(note));
    if (stop) {
      last_ = step;
      spdlog::info("training job {}: drained after step {}", o_.layout.describe(), last_);
    }
    after_verdict();
  }

  /// The step's checkpoint, if due, then the next step.
  void after_verdict() {
    const int step = r_.step;
    if (!o_.saves_at(step, last_)) {
      next_step();
      return;
    }
    take_all(
        train_msg::saved, step, "checkpoint shard of step " + std::to_string(step), true, [](int, remote_message) {},
        [this, step] {
          const bool scale_state = scaler_.dynamic() || scaler_.state().skipped > 0;
          commit_checkpoint(o_.checkpoint_dir, step, world_, job_, o_.layout.describe(),
                            scale_state ? &scaler_.state() : nullptr);
          next_step();
        });
  }

  /// Step after step without nesting calls: the next starts from a
  /// message to itself.
  void next_step() { self_->send(caf::actor_cast<caf::actor>(self_), coord_msg::step_atom::value, r_.step + 1); }

  /// --snapshot-every auto, at a verdict step: the interval from the next
  /// step on, from the copies and steps measured since the last verdict.
  void choose_snapshot_interval(dist_step_report& r) {
    const double copy_s = schedule::median_of(copies_s_), step_s = schedule::median_of(steps_s_);
    const int next = schedule::snapshot_interval(copy_s, step_s, snapshot_every_);
    if (!copies_s_.empty()) {  // a window without a snapshot step measured nothing: keep it
      copies_s_.clear();
      steps_s_.clear();
    }
    if (next == snapshot_every_) return;
    spdlog::info("training job {}: in-memory snapshots every {} step(s) after step {} (copies took {:.3f} s, steps "
                 "{:.3f} s)",
                 o_.layout.describe(), next, r.step, copy_s, step_s);
    snapshot_every_ = next;
    r.snapshot_median_copy_s = copy_s;
    r.snapshot_median_step_s = step_s;
  }

  // ---- the end of the run -------------------------------------------------

  void end_run() {
    if (!o_.save_dir.empty() && last_ == o_.steps) {
      save_model();
      return;
    }
    all_done();
  }

  // Replica 0 of every stage sends its blocks (rank 0 the head), one
  // piece at a time as asked (actors/train_save.hpp), watched as the steps
  // are: a rank that stops sending is named.
  void save_model() {
    // Each group goes to the file once its pieces came (a group of one
    // piece read in place from its message; the model never gathered);
    // the file takes its name once all came. The next piece is asked for
    // as one comes, so it travels while the last is written: the
    // coordinator holds at most a group and two pieces, a rank one piece.
    // (A LoRA job's save is its adapter: save_writer.)
    const lora_config* lora = o_.lora ? &o_.lora->config : nullptr;
    saving_ = std::make_unique<save_writer>(o_, cfg_);
    auto asks =
        std::make_shared<const std::vector<param_ask>>(plan_param_asks(o_.layout, cfg_, o_.message_piece_bytes, lora));
    auto ws = std::make_shared<std::vector<wanted>>();
    for (const param_ask& a : *asks) ws->push_back({train_msg::params, o_.steps, a.bucket, a.rank, a.what(), true, a.n});
    auto ask = [this, asks](std::size_t i) {
      if (i >= asks->size()) return;
      const param_ask& a = (*asks)[i];
      send(a.rank, train_msg::params_ask, encode_body(train_packet{o_.steps, a.bucket, a.n, -1, run_, a.lo, a.hi}));
    };
    ask(0);
    auto groups =
        std::make_shared<param_group_builder>(cfg_, lora ? std::optional<lora_config>(*lora) : std::nullopt);
    take_each(
        ws, 0,
        [this, asks, ask, groups](std::size_t i, remote_message m) {
          ask(i + 1);
          const param_ask& a = (*asks)[i];
          const std::optional<param_set> group = groups->add(a, std::move(m.tensors), o_.layout.label(a.rank));
          if (group) saving_->write(a.bucket, *group);
        },
        [this] {
          saving_->commit();
          saving_.reset();
          all_done();
        });
  }

  void all_done() {
    take_all(train_msg::done, last_, "end of training", true, [](int, remote_message) {}, [this] {
      inbox_->close();
      for (int rank = 0; rank < world_; ++rank)
        send(rank, train_msg::finish, encode_body(train_step_note{last_, 0, 0, run_}));
      settle(nullptr, last_);
    });
  }

  node& node_;
  const dist_train_options& o_;
  model_config cfg_;
  const coordinator_hooks& hooks_;
  int world_;
  std::string job_, join_;
  /// Mirrors every rank's loss scaler (they update from the same norms), to
  /// report each step's scale and write it into checkpoints.
  loss_scaler scaler_;
  /// This run's id, drawn at random: every message after the roster
  /// carries it, and only messages with it are taken.
  std::uint64_t run_ = std::random_device{}() * std::uint64_t{0x100000000} + std::random_device{}() + 1;
  std::shared_ptr<train_inbox> inbox_;
  /// The waits, and when nothing comes while every rank is up, who or what
  /// the job is stuck on.
  stall_watch stall_;
  caf::event_based_actor* self_ = nullptr;
  caf::actor mailbox_;
  std::map<int, std::string> ids_;
  train_roster roster_;
  /// The run's first and last step, the step being summed and its sums.
  int first_ = 1, last_ = 0;
  dist_step_report r_;
  double sum_squares_ = 0;
  std::chrono::steady_clock::time_point last_time_, reported_at_;
  /// The in-memory snapshot interval in force (--snapshot-every; with
  /// auto, what choose_snapshot_interval chose), and since the last
  /// verdict step the seconds snapshot copies took and the steps took.
  int snapshot_every_ = o_.snapshot_every;
  std::vector<double> copies_s_, steps_s_;
  /// --snapshot-every auto with verdict steps to change it at (without
  /// them nothing is measured: the interval stays).
  bool adapts_snapshots_ = o_.snapshot_auto && (o_.probe_every > 0 || o_.drain_every > 0);
  /// What --save writes (group by group, as the ranks' parameters come);
  /// nothing stays unless every group came.
  std::unique_ptr<save_writer> saving_;
  /// The failure being reported (set once; shared with the actor's exit
  /// handler), and its text.
  std::shared_ptr<std::exception_ptr> failure_ = std::make_shared<std::exception_ptr>();
  std::string reason_;
  /// run()'s answer, kept once.
  std::shared_ptr<std::promise<int>> done_ = std::make_shared<std::promise<int>>();
  std::shared_ptr<std::atomic<bool>> settled_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

void run_train_coordinator(node& n, const dist_train_options& o, const model_config& cfg,
                           const std::function<void(const dist_step_report&)>& on_step,
                           std::shared_ptr<train_inbox> inbox) {
  coordinator_hooks hooks;
  hooks.on_step = on_step;
  run_train_coordinator(n, o, cfg, hooks, std::move(inbox));
}

int run_train_coordinator(node& n, const dist_train_options& o, const model_config& cfg, const coordinator_hooks& hooks,
                          std::shared_ptr<train_inbox> inbox) {
  check_layout(o.layout, cfg.n_layers);
  check_message_piece_bytes(o.message_piece_bytes);
  coordinator c(n, o, cfg, hooks, std::move(inbox));
  return c.run();
}

}  // namespace corolla
