// actors/train_scheduler.cpp — see actors/train_scheduler.hpp.
#include "actors/train_scheduler.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/errors.hpp"
#include "schedule/regrid.hpp"
#include "schedule/replan.hpp"

namespace corolla {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

/// "a, b, c" of the machines' names.
std::string names_of(const std::vector<schedule::machine_offer>& machines) {
  std::string s;
  for (const auto& m : machines) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}

std::string printf_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string printf_line(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

/// The scheduler's state: the running grid or plan, the membership, the
/// measurements, and the switch a drain verdict chose.
struct scheduler_state {
  scheduler_setup setup;
  train_layout layout;  ///< the grid running (as the launcher laid it out)
  // --cluster
  std::optional<schedule::cluster_members> members;
  std::optional<schedule::cluster_description> machines;  ///< present, with what was measured
  std::optional<schedule::plan> running;
  schedule::change_watch watch;  ///< a link counts as changed when probes in a row agree
  // --pp/--dp: ranks [0, local) are the launcher's, the rest run on `joined`.
  int local = 0;
  std::vector<schedule::machine_offer> joined;
  // Each rank's compute seconds since the last probe step.
  std::vector<double> computed;
  int computed_steps = 0;
  // The measured cost of switching grids: the longest from starting one to
  // its first step, or from a decision to the next grid's first step.
  double switch_s = 0;
  clock_type::time_point grid_started = clock_type::now();
  bool grid_stepped = false;
  std::optional<clock_type::time_point> decided_at;
  /// The switch a drain verdict chose, made when the job has drained, and
  /// (--cluster) the machines that join with it.
  std::optional<grid_decision> planned;
  std::vector<schedule::machine_offer> joiners;
  /// Verdicts waiting for the lobby's answer, by ask, with who asked. A
  /// grid started, drained or failed, or the asker ending (it is
  /// monitored), answers them at once (no drain): whoever asked is gone,
  /// and the answer, not the lobby's, releases it (a promise holds its
  /// asker, and a detached actor's thread lives while it is held).
  struct unanswered_verdict {
    caf::strong_actor_ptr asker;
    caf::typed_response_promise<drain_verdict> rp;
  };
  std::map<std::uint64_t, unanswered_verdict> unanswered;
  std::uint64_t asks = 0;

  /// Answers every unanswered verdict (of `asker` only, when given) with
  /// no drain.
  void answer_moot(const caf::actor_addr* asker = nullptr) {
    for (auto it = unanswered.begin(); it != unanswered.end();) {
      if (asker && caf::actor_cast<caf::actor_addr>(it->second.asker) != *asker) {
        ++it;
        continue;
      }
      it->second.rp.deliver(drain_verdict{});
      it = unanswered.erase(it);
    }
  }

  rank_machines where() const {
    rank_machines w;
    w.local = local;
    w.joined = joined;
    if (members) {
      w.by_worker = true;
      w.workers = members->joined();
    }
    return w;
  }

  std::optional<schedule::grid> grid_for(int ranks, std::string* why) const {
    schedule::grid_limits limits;
    limits.ranks = ranks;
    limits.n_layers = setup.cfg.n_layers;
    limits.global_batch = setup.batch;
    limits.micro_batch = setup.micro_batch;
    limits.chunks = layout.chunks;
    limits.prefer_pp = layout.pp;
    return schedule::regrid(limits, why);
  }

  void on_step(const dist_step_report& r) {
    if (computed.size() != r.compute_s.size()) {
      computed.assign(r.compute_s.size(), 0.0);  // a new grid
      computed_steps = 0;
    }
    for (std::size_t i = 0; i < r.compute_s.size(); ++i) computed[i] += r.compute_s[i];
    ++computed_steps;
    if (!grid_stepped) {
      grid_stepped = true;
      switch_s = std::max(switch_s, seconds_since(grid_started));
    }
    if (decided_at) {
      switch_s = std::max(switch_s, seconds_since(*decided_at));  // a whole switch, drain or restore included
      decided_at.reset();
    }
  }

  /// --probe-every: a measured change of links or speeds that makes another plan pay.
  bool probe_drain(const dist_step_report& r, drain_verdict& v) {
    auto worker_of = [&](int rank) {
      const std::string& name = layout.worker_names.at(static_cast<std::size_t>(rank));
      for (const auto& w : machines->workers)
        if (w.name == name) return w.rank;
      return -1;
    };
    std::vector<schedule::link_measurement> seen;
    for (const auto& l : r.links)
      if (const int x = worker_of(l.from), y = worker_of(l.to); x >= 0 && y >= 0) seen.push_back({x, y, l.bandwidth});
    std::vector<std::string> link_changes, speed_changes;
    machines = schedule::with_measurements(*machines, watch.sustained(*machines, seen), {}, &link_changes);
    // Compute per step, against the cost model's figure for the same work,
    // averaged over at least 8 steps (one step's few milliseconds on a busy
    // host say little).
    if (computed_steps >= 8) {
      std::vector<schedule::compute_measurement> speeds = schedule::modeled_compute(*machines, *running);
      for (auto& x : speeds)
        for (std::size_t rank = 0; rank < computed.size(); ++rank)
          if (worker_of(static_cast<int>(rank)) == x.worker) x.seconds = computed[rank] / computed_steps;
      computed.assign(computed.size(), 0.0);
      computed_steps = 0;
      machines = schedule::with_compute(*machines, watch.sustained_compute(*machines, speeds), {}, &speed_changes);
    }
    if (link_changes.empty() && speed_changes.empty()) return false;
    for (const std::string& c : link_changes) v.notes.push_back("link " + c + " (step " + std::to_string(r.step) + ")");
    for (const std::string& c : speed_changes) v.notes.push_back(c + " (step " + std::to_string(r.step) + ")");
    // The drain stops the job after this step; the new plan runs the rest.
    const long left = static_cast<long>(setup.steps) - r.step;
    const schedule::replan_advice advice =
        schedule::advise_replan(*machines, *running, setup.cfg, setup.training, left, switch_s);
    v.notes.push_back(advice.why);
    if (!advice.move) return false;
    grid_decision d;
    d.changes = link_changes;
    d.changes.insert(d.changes.end(), speed_changes.begin(), speed_changes.end());
    d.cause = link_changes.empty()   ? "speeds changed"
              : speed_changes.empty() ? "links changed"
                                      : "links and speeds changed";
    d.predicted_from_s = advice.current_s;
    d.predicted_to_s = advice.next_s;
    d.plan = advice.next;
    d.machines = machines;
    planned = std::move(d);
    return true;
  }

  /// --cluster: machines that joined as absent workers of the file, when
  /// the planner's plan with them pays over the running one.
  bool cluster_join_drain(const dist_step_report& r, const std::vector<schedule::machine_offer>& pool,
                          drain_verdict& v) {
    const std::vector<schedule::machine_offer> joining = members->candidates(pool, &v.notes);
    if (joining.empty()) return false;
    const std::string names = names_of(joining);
    schedule::cluster_description grown;
    schedule::plan moved;
    try {
      grown = members->with_joined(joining, *machines);
      moved = schedule::renumber_plan(*running, *machines, grown);
    } catch (const std::exception& e) {
      v.notes.push_back("worker(s) " + names + " cannot join: " + e.what());
      return false;
    }
    // The cost model prices the running plan with the joined workers idle
    // against the planner's plan with them, over the steps left.
    const long left = static_cast<long>(setup.steps) - r.step;
    const schedule::replan_advice advice =
        schedule::advise_replan(grown, moved, setup.cfg, setup.training, left, switch_s);
    v.notes.push_back("worker(s) " + names + " offer(s) to join after step " + std::to_string(r.step) + ": " +
                      advice.why);
    if (!advice.move) return false;
    grid_decision d;
    d.changes = {"worker(s) " + names + " joined"};
    d.cause = "workers joined";
    d.predicted_from_s = advice.current_s;
    d.predicted_to_s = advice.next_s;
    d.plan = advice.next;
    d.machines = std::move(grown);
    planned = std::move(d);
    joiners = joining;  // they join once the job has drained
    return true;
  }

  /// --pp/--dp: pooled workers, when a larger grid fits and the saving over
  /// the steps left pays the measured switch (20 % margin).
  bool grid_join_drain(const dist_step_report& r, const std::vector<schedule::machine_offer>& pool,
                       drain_verdict& v) {
    std::vector<schedule::machine_offer> waiting;
    for (const auto& w : pool)
      if (std::none_of(joined.begin(), joined.end(), [&](const auto& j) { return j.node_id == w.node_id; }))
        waiting.push_back(w);
    if (waiting.empty()) return false;
    const int have = local + static_cast<int>(joined.size());
    std::string why;
    const auto g = grid_for(have + static_cast<int>(waiting.size()), &why);
    if (!g || g->pp * g->dp <= layout.world()) return false;  // no larger grid fits: they wait
    // The global batch splits over more ranks: a step is predicted to take
    // world / new world of this one's, over the steps left.
    const int grown_world = g->pp * g->dp;
    const double saving = static_cast<double>(setup.steps - r.step) * r.seconds *
                          (1.0 - static_cast<double>(layout.world()) / grown_world);
    if (saving < 1.2 * switch_s) {
      v.notes.push_back(printf_line("%zu worker(s) wait: growing to %dx%d would save about %.2f s over the %d step(s) "
                                    "left, a switch costs about %.2f s",
                                    waiting.size(), g->pp, g->dp, saving, setup.steps - r.step, switch_s));
      return false;
    }
    grid_decision d;
    d.layout = even_layout(setup.cfg.n_layers, g->pp, g->dp, layout.chunks);
    d.where.local = local;
    d.where.joined = joined;
    for (const auto& w : waiting)
      if (static_cast<int>(d.where.joined.size()) < grown_world - local) d.where.joined.push_back(w);
    std::vector<schedule::machine_offer> fresh(d.where.joined.begin() + static_cast<long>(joined.size()),
                                               d.where.joined.end());
    const std::string names = names_of(fresh);
    d.changes = {"worker(s) " + names + " joined"};
    d.cause = "workers joined";
    d.ranks_left = d.layout.world();
    v.notes.push_back(printf_line("worker(s) %s joined: growing %s to %dx%d after step %d (about %.2f s saved)",
                                  names.c_str(), layout.describe().c_str(), g->pp, g->dp, r.step, saving));
    planned = std::move(d);
    return true;
  }

  drain_verdict verdict(const drain_query& q) {
    drain_verdict v;
    planned.reset();
    joiners.clear();
    if (setup.probing && running && probe_drain(q.report, v)) {
      v.drain = true;
      return v;
    }
    if (setup.joins && q.pool_ok)
      v.drain = members ? cluster_join_drain(q.report, q.pool, v) : grid_join_drain(q.report, q.pool, v);
    return v;
  }

  grid_decision drained(int last) {
    decided_at = clock_type::now();
    if (!planned) {
      grid_decision d;
      d.stop = "the job stopped after step " + std::to_string(last) + " of " + std::to_string(setup.steps) +
               " without a re-plan";
      return d;
    }
    grid_decision d = std::move(*planned);
    planned.reset();
    if (d.plan) {
      running = d.plan;
      machines = d.machines;
      if (!joiners.empty()) members->join(joiners);
      d.where = where();
      d.ranks_left = machines->size();
      d.left_unit = "worker(s)";
    } else {
      joined = d.where.joined;
    }
    joiners.clear();
    return d;
  }

  grid_decision failed(const std::vector<int>& lost, const std::string& reason) {
    decided_at = clock_type::now();
    planned.reset();  // a drain the failure cut short
    joiners.clear();
    grid_decision d;
    if (machines) {
      // The lost ranks' machines go; the planner plans again on the rest,
      // free to choose depth, width, placement and micro-batch.
      std::vector<std::string> gone;
      for (int r : lost) gone.push_back(layout.worker_names.at(static_cast<std::size_t>(r)));
      members->lose(gone);  // absent again: a machine may join as one of them later
      try {
        machines = members->present(&*machines);
      } catch (const std::exception& x) {
        d.stop = reason + "; cannot continue: " + x.what();
        return d;
      }
      d.ranks_left = machines->size();
      d.left_unit = "worker(s)";
      if (d.ranks_left < setup.min_ranks) {
        d.stop = reason + "; " + std::to_string(d.ranks_left) + " worker(s) left, fewer than --min-ranks " +
                 std::to_string(setup.min_ranks);
        return d;
      }
      schedule::plan p;
      try {
        p = setup.planner(*machines);  // the planner checks the setup against what is left, and may refuse it
      } catch (const std::exception& x) {
        d.stop = reason + "; cannot plan on the workers left: " + x.what();
        return d;
      }
      if (!p.feasible) {
        d.stop = reason + "; no feasible plan on the workers left: " + p.reason;
        return d;
      }
      running = p;
      d.plan = p;
      d.machines = machines;
      d.where = where();
      return d;
    }
    // The lost: the launcher's processes below `local`, joined workers' above.
    std::vector<schedule::machine_offer> kept;
    for (std::size_t i = 0; i < joined.size(); ++i)
      if (std::find(lost.begin(), lost.end(), local + static_cast<int>(i)) == lost.end()) kept.push_back(joined[i]);
    local -= static_cast<int>(std::count_if(lost.begin(), lost.end(), [&](int r) { return r < local; }));
    joined = std::move(kept);
    d.ranks_left = local + static_cast<int>(joined.size());
    if (d.ranks_left < setup.min_ranks) {
      d.stop = reason + "; " + std::to_string(d.ranks_left) + " rank(s) left, fewer than --min-ranks " +
               std::to_string(setup.min_ranks);
      return d;
    }
    std::string why;
    const auto g = grid_for(d.ranks_left, &why);
    if (!g) {
      d.stop = reason + "; cannot continue: " + why;
      return d;
    }
    d.layout = even_layout(setup.cfg.n_layers, g->pp, g->dp, layout.chunks);
    // A grid smaller than the ranks left leaves workers out first.
    if (d.layout.world() < local) local = d.layout.world();
    joined.resize(static_cast<std::size_t>(d.layout.world() - local));
    d.where = where();
    return d;
  }
};

/// A drain step's verdict, or what stopped it (the planner, a measurement
/// that does not fit) as an error value: the scheduler stays up, and the
/// coordinator that asked fails the job with it.
caf::expected<drain_verdict> decide(scheduler_state& s, const drain_query& q) {
  try {
    return s.verdict(q);
  } catch (const std::exception& e) {
    return make_error(errc::remote_error, std::string("the verdict of step ") + std::to_string(q.report.step) +
                                              " failed: " + e.what());
  }
}

template <class Promise>
void deliver(Promise& rp, caf::expected<drain_verdict> v) {
  if (v)
    rp.deliver(std::move(*v));
  else
    rp.deliver(std::move(v.error()));
}

caf::behavior scheduler_actor(caf::stateful_actor<scheduler_state>* self, scheduler_setup setup) {
  auto& st = self->state;
  st.layout = setup.layout;
  st.local = setup.layout.world();
  if (setup.file) {
    st.members.emplace(*setup.file, setup.standby);
    st.machines = st.members->present();
  }
  if (setup.file && setup.plan) st.running = setup.plan;
  st.setup = std::move(setup);
  self->set_down_handler([self](caf::down_msg& dm) { self->state.answer_moot(&dm.source); });
  return {
      [self](sched_msg::started_atom, const train_layout& l, std::int64_t started_ns) {
        auto& s = self->state;
        s.answer_moot();
        s.layout = l;
        s.grid_started = clock_type::time_point(std::chrono::nanoseconds(started_ns));
        s.grid_stepped = false;
        s.computed.clear();  // measurements of the previous grid's ranks
        s.computed_steps = 0;
      },
      [self](sched_msg::step_atom, const dist_step_report& r) { self->state.on_step(r); },
      [self](sched_msg::verdict_atom, drain_query& q) -> caf::result<drain_verdict> {
        const caf::actor pool = self->state.setup.pool;
        if (!self->state.setup.joins || !pool) {
          caf::expected<drain_verdict> v = decide(self->state, q);
          if (!v) return std::move(v.error());
          return std::move(*v);
        }
        // Who is pooled now: asked of the lobby without blocking (other
        // messages, a step's report, are taken meanwhile). An answer that
        // comes after the verdict was answered moot (the grid changed, or
        // whoever asked ended) decides nothing.
        auto& s = self->state;
        const std::uint64_t ask = ++s.asks;
        // (Who asked, before the promise takes the sender from the message;
        // monitored: an asker that ends has its verdict answered at once.)
        caf::strong_actor_ptr asker = self->current_sender();
        if (asker) self->monitor(asker);
        auto rp = self->make_response_promise<drain_verdict>();
        s.unanswered.emplace(ask, scheduler_state::unanswered_verdict{std::move(asker), rp});
        // The verdict on `asked` (with `note` first among its notes).
        auto answer = [self, ask](drain_query asked, std::string note) {
          auto it = self->state.unanswered.find(ask);
          if (it == self->state.unanswered.end()) return;
          auto waiting = std::move(it->second.rp);
          self->state.unanswered.erase(it);
          caf::expected<drain_verdict> v = decide(self->state, asked);
          if (v && !note.empty()) v->notes.insert(v->notes.begin(), std::move(note));
          deliver(waiting, std::move(v));
        };
        self->request(pool, lobby_answer_timeout, sched_msg::pool_atom::value)
            .then(
                [answer, q](std::vector<std::string>& flat) mutable {
                  q.pool = pool_of_flat(flat);
                  q.pool_ok = true;
                  answer(std::move(q), {});
                },
                [self, answer, q](caf::error& e) mutable {
                  q.pool.clear();
                  q.pool_ok = false;  // nobody can join now
                  answer(std::move(q), "the lobby did not answer: " + self->system().render(e));
                });
        return rp;
      },
      [self](sched_msg::drained_atom, int last) {
        self->state.answer_moot();
        return self->state.drained(last);
      },
      [self](sched_msg::failed_atom, const std::vector<int>& lost, const std::string& reason) {
        self->state.answer_moot();
        return self->state.failed(lost, reason);
      },
  };
}

}  // namespace

std::vector<std::string> flat_pool(const std::vector<schedule::machine_offer>& pool) {
  std::vector<std::string> flat;
  for (const schedule::machine_offer& w : pool) {
    flat.push_back(w.node_id);
    flat.push_back(w.name);
    flat.push_back(w.machine);
  }
  return flat;
}

std::vector<schedule::machine_offer> pool_of_flat(const std::vector<std::string>& flat) {
  std::vector<schedule::machine_offer> pool;
  for (std::size_t i = 0; i + 2 < flat.size(); i += 3) pool.push_back({flat[i], flat[i + 1], flat[i + 2]});
  return pool;
}

const schedule::machine_offer* rank_machines::of(const train_layout& l, int rank) const {
  if (by_worker) {
    auto it = workers.find(l.worker_names.at(static_cast<std::size_t>(rank)));
    return it == workers.end() ? nullptr : &it->second;
  }
  return rank >= local ? &joined.at(static_cast<std::size_t>(rank - local)) : nullptr;
}

train_scheduler::train_scheduler(scheduler_setup setup) {
  // A bad --standby is the caller's error, before any actor starts.
  if (setup.file) schedule::cluster_members check(*setup.file, setup.standby);
  config_ = std::make_unique<caf::actor_system_config>();
  config_->set("scheduler.max-threads", static_cast<std::int64_t>(1));
  system_ = std::make_unique<caf::actor_system>(*config_);
  // Detached: actors of other systems (the coordinator's node, the lobby's)
  // send to it, and a detached receiver is woken on its own thread, never
  // scheduled on the sender's system.
  actor_ = system_->spawn<caf::detached>(scheduler_actor, std::move(setup));
}

train_scheduler::~train_scheduler() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  actor_ = caf::actor{};
  system_.reset();  // waits for the actor
}

template <class R, class... Ts>
R train_scheduler::ask(Ts&&... xs) {
  caf::scoped_actor self{*system_};
  R out;
  std::string failure;
  // The scheduler answers from its own state at once; no network is involved.
  self->request(actor_, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { failure = system_->render(e); });
  if (!failure.empty()) throw std::runtime_error("the training scheduler failed: " + failure);
  return out;
}

void train_scheduler::started(const train_layout& l) {
  // Stamped here: the actor may take its mailbox later on a busy host.
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch());
  caf::anon_send(actor_, sched_msg::started_atom::value, l, static_cast<std::int64_t>(now.count()));
}

void train_scheduler::step(const dist_step_report& r) { caf::anon_send(actor_, sched_msg::step_atom::value, r); }

drain_verdict train_scheduler::verdict(const drain_query& q) {
  return ask<drain_verdict>(sched_msg::verdict_atom::value, q);
}

grid_decision train_scheduler::drained(int last) { return ask<grid_decision>(sched_msg::drained_atom::value, last); }

grid_decision train_scheduler::failed(const std::vector<int>& lost, const std::string& reason) {
  return ask<grid_decision>(sched_msg::failed_atom::value, lost, reason);
}

}  // namespace corolla
