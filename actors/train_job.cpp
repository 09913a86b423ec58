// Layout rules of a training job, and its coordinator (actors/train_job.hpp).
#include "actors/train_job.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_stall.hpp"
#include "actors/train_store.hpp"
#include "model/transformer.hpp"
#include "schedule/snapshot_interval.hpp"

namespace corolla {

// ---- layout ---------------------------------------------------------------------

std::string train_layout::label(int rank) const {
  std::string s = "rank " + std::to_string(rank) + " (stage " + std::to_string(stage_of(rank)) + ", replica " +
                  std::to_string(replica_of(rank));
  for (int c = 0; c < chunks; ++c) {
    const auto v = static_cast<std::size_t>(virtual_stage(stage_of(rank), c));
    if (v + 1 < boundaries.size())
      s += (c == 0 ? ", blocks " : ", ") + std::to_string(boundaries[v]) + ".." + std::to_string(boundaries[v + 1] - 1);
  }
  if (rank >= 0 && static_cast<std::size_t>(rank) < worker_names.size())
    s += ", worker " + worker_names[static_cast<std::size_t>(rank)];
  return s + ")";
}

std::string train_layout::describe() const {
  std::string s = std::to_string(pp) + "x" + std::to_string(dp);
  if (chunks > 1) s += " v" + std::to_string(chunks);
  for (std::size_t i = 0; i + 1 < boundaries.size(); ++i)
    s += " [" + std::to_string(boundaries[i]) + "," + std::to_string(boundaries[i + 1]) + ")";
  return s;
}

train_layout even_layout(int n_layers, int pp, int dp, int chunks) {
  if (pp < 1 || dp < 1) throw std::invalid_argument("--pp and --dp must be at least 1");
  if (chunks < 1) throw std::invalid_argument("--chunks must be at least 1");
  const int v = pp * chunks;
  if (v > n_layers)
    throw std::invalid_argument(chunks == 1 ? std::to_string(pp) + " pipeline stages for a model of " +
                                                  std::to_string(n_layers) + " blocks (every stage needs at least one block)"
                                            : std::to_string(pp) + " stages x " + std::to_string(chunks) +
                                                  " chunks for a model of " + std::to_string(n_layers) +
                                                  " blocks (every chunk needs at least one block)");
  train_layout l;
  l.pp = pp;
  l.dp = dp;
  l.chunks = chunks;
  l.boundaries.push_back(0);
  for (int s = 0; s < v; ++s) l.boundaries.push_back(l.boundaries.back() + n_layers / v + (s < n_layers % v ? 1 : 0));
  return l;
}

void check_layout(const train_layout& l, int n_layers) {
  if (l.pp < 1 || l.dp < 1 || l.chunks < 1)
    throw std::invalid_argument("a layout needs at least one stage, replica and chunk");
  const int v = l.virtual_stages();
  if (static_cast<int>(l.boundaries.size()) != v + 1)
    throw std::invalid_argument("a layout of " + std::to_string(v) + " (virtual) stages needs " + std::to_string(v + 1) +
                                " block boundaries, not " + std::to_string(l.boundaries.size()));
  if (l.boundaries.front() != 0 || l.boundaries.back() != n_layers)
    throw std::invalid_argument("the stages must cover blocks 0.." + std::to_string(n_layers - 1) + " (layout " +
                                l.describe() + ")");
  for (int s = 0; s < v; ++s)
    if (l.boundaries[static_cast<std::size_t>(s)] >= l.boundaries[static_cast<std::size_t>(s + 1)])
      throw std::invalid_argument("stage " + std::to_string(s) + " of layout " + l.describe() + " has no blocks");
}

int dist_train_options::micro_batch_size() const {
  if (batch < 1 || seq < 1) throw std::invalid_argument("--batch and --seq must be positive");
  if (batch % layout.dp != 0)
    throw std::invalid_argument("--batch " + std::to_string(batch) + " does not split over " + std::to_string(layout.dp) +
                                " data-parallel replicas");
  const int per_replica = batch / layout.dp;
  const int mb = micro_batch > 0 ? micro_batch : (layout.pp > 1 ? 1 : per_replica);
  if (per_replica % mb != 0)
    throw std::invalid_argument("--micro-batch " + std::to_string(mb) + " does not divide the " +
                                std::to_string(per_replica) + " sequences each replica gets per step");
  return mb;
}

int dist_train_options::micro_batches() const {
  const int m = batch / layout.dp / micro_batch_size();
  if (layout.chunks > 1 && m % layout.pp != 0)
    throw std::invalid_argument("interleaved 1F1B (--chunks " + std::to_string(layout.chunks) + ") needs the " +
                                std::to_string(m) + " micro-batches per replica to be a multiple of --pp " +
                                std::to_string(layout.pp));
  return m;
}

std::string checkpoint_key(const dist_train_options& o, const model_config& cfg) {
  return "layers=" + std::to_string(cfg.n_layers) + " hidden=" + std::to_string(cfg.hidden_size) +
         " vocab=" + std::to_string(cfg.vocab_size) + " batch=" + std::to_string(o.batch) +
         " seq=" + std::to_string(o.seq);
}

const char* dp_collectives_name(dp_collectives c) { return c == dp_collectives::device ? "device" : "host"; }

dp_collectives parse_dp_collectives(const std::string& s) {
  if (s == "host") return dp_collectives::host;
  if (s == "device") return dp_collectives::device;
  throw std::invalid_argument("--collectives must be host or device, got '" + s + "'");
}

std::set<std::string> param_buckets(const train_layout& l, int rank) {
  std::set<std::string> out;
  const int stage = l.stage_of(rank);
  for (int c = 0; c < l.chunks; ++c) {
    const auto v = static_cast<std::size_t>(l.virtual_stage(stage, c));
    for (int b = l.boundaries.at(v); b < l.boundaries.at(v + 1); ++b) out.insert(bucket_name(b));
  }
  if (stage == 0 || stage == l.pp - 1) out.insert(bucket_name(head_bucket));
  return out;
}

std::string join_key(const dist_train_options& o, const model_config& cfg) {
  const auto& w = o.optimizer.adamw;
  char opt[256];
  std::snprintf(opt, sizeof opt, " run: steps=%d lr=%.9g betas=%.9g,%.9g eps=%.9g wd=%.9g clip=%.9g", o.steps,
                static_cast<double>(w.lr), static_cast<double>(w.beta1), static_cast<double>(w.beta2),
                static_cast<double>(w.eps), static_cast<double>(w.weight_decay),
                static_cast<double>(o.optimizer.max_grad_norm));
  const lr_schedule& s = o.optimizer.schedule;
  std::string k = checkpoint_key(o, cfg) + " layout=" + o.layout.describe() +
                  " micro=" + std::to_string(o.micro_batch_size()) + opt + " warmup=" + std::to_string(s.warmup_steps) +
                  " cosine=" + (s.cosine ? "1" : "0") + " checkpoint_every=" + std::to_string(o.checkpoint_every) +
                  " probe_every=" + std::to_string(o.probe_every) +
                  " snapshot_every=" + std::to_string(o.snapshot_every) +
                  " drain_every=" + std::to_string(o.drain_every) +
                  " drain_to_memory=" + (o.drains_to_memory() ? "1" : "0") +
                  " resume=" + (o.resume ? "1" : "0") + " save=" + (o.save_dir.empty() ? "0" : "1") +
                  " synthetic=" + (o.synthetic.enabled() ? "1" : "0") +
                  " compute=" + dtype_name(o.compute) + " collectives=" + dp_collectives_name(o.collectives);
  const loss_scaling& ls = o.optimizer.loss_scale;
  k += std::string(" loss_scale=") + loss_scaling_name(ls);
  if (ls.dynamic)
    k += " init=" + std::to_string(ls.init_scale) + " growth_interval=" + std::to_string(ls.growth_interval) +
         " min=" + std::to_string(ls.min_scale);
  return k;
}

// ---- coordinator ---------------------------------------------------------------------

namespace {

class coordinator {
 public:
  coordinator(node& n, const dist_train_options& o, const model_config& cfg, std::shared_ptr<train_inbox> inbox)
      : node_(n),
        o_(o),
        cfg_(cfg),
        world_(o.layout.world()),
        job_(checkpoint_key(o, cfg)),
        join_(join_key(o, cfg)),
        scaler_(o.optimizer.loss_scale),
        inbox_(std::move(inbox)) {}

  ~coordinator() {
    if (inbox_) inbox_->close();
    if (mailbox_) {
      node_.unpublish("train-coord");
      caf::anon_send_exit(mailbox_, caf::exit_reason::user_shutdown);
    }
  }

  int run(const coordinator_hooks& hooks) {
    if (!inbox_) inbox_ = std::make_shared<train_inbox>();
    inbox_->set_job(run_);
    auto mb = start_train_mailbox(node_, inbox_, "train-coord", /*joins_only_from_strangers=*/true);
    if (!mb) throw train_error("cannot publish the coordinator: " + error_message(mb.error()));
    mailbox_ = *mb;
    try {
      gather(hooks);
      int first = 1;
      if (o_.resume && o_.from_memory.step > 0) {
        // The ranks read the failed grid's in-memory snapshots.
        try {
          if (const auto st = parse_loss_scale_text(o_.from_memory.loss_scale)) scaler_.set_state(*st);
        } catch (const std::invalid_argument& e) {
          throw train_error(std::string(e.what()) + " in the snapshots");
        }
        first = o_.from_memory.step + 1;
      } else if (o_.resume) {
        const int s = latest_checkpoint_step(o_.checkpoint_dir);
        if (s == 0) throw train_error("no checkpoint in " + o_.checkpoint_dir.string() + " to resume from");
        check_manifest(o_.checkpoint_dir, s, job_);
        if (const auto st = checkpoint_loss_scale(o_.checkpoint_dir, s)) scaler_.set_state(*st);
        first = s + 1;
      }
      auto last_time = std::chrono::steady_clock::now();
      int last = o_.steps;  // a drain moves it closer
      for (int step = first; step <= last; ++step) {
        dist_step_report r;
        r.step = step;
        double sum_squares = 0;
        r.compute_s.assign(static_cast<std::size_t>(world_), 0.0);
        for (int rank = 0; rank < world_; ++rank) {
          auto rep = decode_train_report(take(train_msg::report, step, rank, "report of step " + std::to_string(step)));
          if (!rep) throw train_error("bad report from " + o_.layout.label(rank) + ": " + error_message(rep.error()));
          r.loss += rep->loss;
          sum_squares += rep->sum_squares;
          r.compute_s[static_cast<std::size_t>(rank)] = rep->compute_s;
          for (const schedule::link_measurement& l : rep->links)
            if (l.to > rank && l.to < world_) r.links.push_back({rank, l.to, l.bandwidth});
        }
        // Ranks take the verdict on overflow from this norm of the scaled
        // gradients; the coordinator's scaler follows theirs step by step.
        const double scaled_norm = std::sqrt(sum_squares);
        if (o_.optimizer.max_grad_norm > 0.0f || scaler_.dynamic())
          for (int rank = 0; rank < world_; ++rank)
            send(rank, train_msg::norm, encode_body(train_step_note{step, 0, scaled_norm, run_}));
        r.loss_scale = scaler_.scale();
        r.grad_norm = scaled_norm / r.loss_scale;
        r.skipped = scaler_.dynamic() && overflowed(scaled_norm);
        scaler_.update(r.skipped);
        const auto now = std::chrono::steady_clock::now();
        r.seconds = std::chrono::duration<double>(now - last_time).count();
        last_time = now;
        stall_.step_took(step, first, r.seconds);
        // In-memory snapshots: a printed step survives any one rank's loss.
        // Its buddy's keeper holds every rank's copy of it before it is
        // printed (train.kept; a few milliseconds, and the ranks go on).
        if (o_.snapshots_at(step, snapshot_every_) && step < o_.steps) {
          for (int rank = 0; rank < world_; ++rank)
            if (snapshot_buddy(o_.layout, rank) >= 0)
              take(train_msg::kept, step, rank, "the buddy's copy of the snapshot of step " + std::to_string(step));
          r.snapshot_copy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
          if (adapts_snapshots_) copies_s_.push_back(r.snapshot_copy_s);
        }
        if (adapts_snapshots_ && step > first) steps_s_.push_back(r.seconds);  // the first includes the grid's start
        const bool verdict = o_.verdict_at(step);
        if (verdict && adapts_snapshots_) choose_snapshot_interval(r);
        r.snapshot_every = snapshot_every_;
        if (hooks.on_step) hooks.on_step(r);
        if (verdict) {
          // Every rank waits at this step boundary for the verdict (and,
          // with --snapshot-every auto, takes the interval from it).
          const bool stop = hooks.drain && !o_.checkpoint_dir.empty() && hooks.drain(r);
          train_step_note note{step, 0, stop ? 1.0 : 0.0, run_};
          note.snapshot_every = o_.snapshot_auto ? snapshot_every_ : 0;
          for (int rank = 0; rank < world_; ++rank) send(rank, train_msg::drain, encode_body(note));
          if (stop) {
            last = step;
            spdlog::info("training job {}: drained after step {}", o_.layout.describe(), last);
          }
        }
        if (o_.saves_at(step, last)) {
          for (int rank = 0; rank < world_; ++rank)
            take(train_msg::saved, step, rank, "checkpoint shard of step " + std::to_string(step));
          const bool scale_state = scaler_.dynamic() || scaler_.state().skipped > 0;
          commit_checkpoint(o_.checkpoint_dir, step, world_, job_, o_.layout.describe(), scale_state ? &scaler_.state() : nullptr);
        }
      }
      if (!o_.save_dir.empty() && last == o_.steps) save_model();
      for (int rank = 0; rank < world_; ++rank) take(train_msg::done, last, rank, "end of training");
      inbox_->close();
      for (int rank = 0; rank < world_; ++rank) send(rank, train_msg::finish, encode_body(train_step_note{last, 0, 0, run_}));
      return last;
    } catch (const std::exception& e) {
      // Ranks that fail tell the coordinator why before their nodes say
      // goodbye; give the root cause a moment to arrive.
      std::string reason = e.what();
      if (is_vague_failure(reason)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (auto better = inbox_->failure()) reason = *better;
      }
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
      if (reason != e.what()) throw train_error(reason);
      throw;
    }
  }

 private:
  /// Rank `rank`'s message, watching for a job that stopped (train_stall.hpp).
  /// A buddy's train.kept is not judged: it comes when a snapshot's copy
  /// has crossed the link, which takes as long as the link needs while the
  /// ranks, done with the step, may wait for this coordinator.
  std::vector<std::uint8_t> take(const char* type, std::int64_t step, int rank, const std::string& what) {
    const bool judge = std::string(type) != train_msg::kept;
    return stall_.take(*inbox_, type, step, rank, what, o_.timeout, judge).body;
  }

  void send(int rank, const char* type, std::vector<std::uint8_t> body) {
    auto a = node_.remote_actor(ids_.at(rank), "train");
    if (!a) throw train_error("cannot reach " + o_.layout.label(rank) + ": " + error_message(a.error()));
    remote_message m;
    m.type = type;
    m.body = std::move(body);
    caf::anon_send(*a, std::move(m));
  }

  // Every rank's join, checked against this job, then the roster to all.
  void gather(const coordinator_hooks& hooks) {
    train_roster roster;
    roster.job = run_;
    for (int rank = 0; rank < world_; ++rank) {
      remote_message m = inbox_->take(train_key(train_msg::join, 0, 0, rank), o_.timeout,
                                      "join of rank " + std::to_string(rank));
      auto j = decode_train_join(m.body);
      if (!j) throw train_error("bad join from node " + m.from_node + ": " + error_message(j.error()));
      if (j->world != world_ || j->job_key != join_)
        throw train_error("rank " + std::to_string(rank) + " (node " + m.from_node + ") belongs to another job: '" +
                          j->job_key + "' of " + std::to_string(j->world) + " ranks, this one is '" + join_ + "' of " +
                          std::to_string(world_));
      ids_[rank] = m.from_node;
      inbox_->name_peer(m.from_node, o_.layout.label(rank));
      roster.peers.push_back({rank, m.from_node, j->endpoint});
    }
    const auto body = encode_body(roster);
    stall_.set_run(run_, ids_);
    for (int rank = 0; rank < world_; ++rank) send(rank, train_msg::roster, body);
    if (hooks.on_roster) hooks.on_roster(roster.peers, run_);
    spdlog::info("training job {}: all {} ranks joined", o_.layout.describe(), world_);
  }

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

  // Replica 0 of every stage sends its blocks (rank 0 the head).
  void save_model() {
    transformer model = transformer::init(cfg_, 0, cpu_backend());
    auto fill = [&](param_set& dst, int id, int rank) {
      // Watched as the steps are: a rank that stops sending is named.
      remote_message m =
          stall_.take_from(*inbox_, train_msg::params, o_.steps, id, rank, "parameters of " + bucket_name(id), o_.timeout);
      if (m.tensors.size() != 1 || m.tensors[0].numel() != dst.size() || m.tensors[0].type() != dtype::f32)
        throw train_error("parameters of " + bucket_name(id) + " from " + o_.layout.label(rank) + " have the wrong size");
      dst.flat().copy_from(m.tensors[0]);
    };
    fill(model.head(), head_bucket, 0);
    for (int v = 0; v < o_.layout.virtual_stages(); ++v)
      for (int b = o_.layout.boundaries[static_cast<std::size_t>(v)]; b < o_.layout.boundaries[static_cast<std::size_t>(v + 1)]; ++b)
        fill(model.blocks()[static_cast<std::size_t>(b)], b, o_.layout.rank_of(v % o_.layout.pp, 0));
    model.save(o_.save_dir);
  }

  node& node_;
  const dist_train_options& o_;
  model_config cfg_;
  int world_;
  std::string job_, join_;
  /// Mirrors every rank's loss scaler (they update from the same norms), to
  /// report each step's scale and write it into checkpoints.
  loss_scaler scaler_;
  /// This run's id, drawn at random: every message after the roster
  /// carries it, and only messages with it are taken.
  std::uint64_t run_ = std::random_device{}() * std::uint64_t{0x100000000} + std::random_device{}() + 1;
  std::shared_ptr<train_inbox> inbox_;
  caf::actor mailbox_;
  std::map<int, std::string> ids_;
  /// Nothing coming while every rank is up: who or what the job is stuck on.
  stall_watch stall_{node_, o_.layout, o_.hang_s};
  /// The in-memory snapshot interval in force (--snapshot-every; with
  /// auto, what choose_snapshot_interval chose), and since the last
  /// verdict step the seconds snapshot copies took and the steps took.
  int snapshot_every_ = o_.snapshot_every;
  std::vector<double> copies_s_, steps_s_;
  /// --snapshot-every auto with verdict steps to change it at (without
  /// them nothing is measured: the interval stays).
  bool adapts_snapshots_ = o_.snapshot_auto && (o_.probe_every > 0 || o_.drain_every > 0);
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
  coordinator c(n, o, cfg, std::move(inbox));
  // The trainer actor: detached (it blocks on its inbox), driving the steps;
  // this thread waits for it.
  auto done = std::make_shared<std::promise<int>>();
  auto finished = done->get_future();
  n.system().spawn<caf::detached>([&c, &hooks, done](caf::blocking_actor*) {
    try {
      done->set_value(c.run(hooks));
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  return finished.get();
}

}  // namespace corolla
