// `corolla train --pp P --dp D --elastic`: the local launcher that keeps a
// job going when ranks die or hang. On a failure that lost ranks it asks
// schedule::regrid for the grid of the ranks left (with --cluster: the
// planner, on the cluster without the lost ranks' workers), continues from the
// latest committed checkpoint re-sharded to that grid (layout-independent
// checkpoints, actors/train_store.hpp), or from the start when there is
// none, and prints every step once: steps replayed after the checkpoint are
// computed again but not printed again. The global batch, the data order
// and the hyper-parameters never change, so the losses are those of the
// failure-free run up to the reduction order.
//
// With --cluster and --probe-every it also re-plans when a link changes
// under the job: the ranks' measured link rates go into the cluster
// description (schedule::with_measurements), and when
// schedule::advise_replan says another plan pays off, the coordinator
// stops the job at that probe step, where every rank waits for its verdict
// (a committed checkpoint there), and the new plan continues from it: no
// step is lost or replayed.
//
// With --cluster --standby, machines join as the file's absent workers
// (apps/train_cluster_members.hpp): at --join-check-every steps
// schedule::advise_replan prices the running plan on the description with
// them against the planner's plan there, and the job drains and moves
// when that pays.
//
// A failure takes the checkpoint-restart path of issue 20 (what the
// elastic scheduler falls back to when a failure takes state that exists
// nowhere else); re-planning in place from replicas' memory is not built yet.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "apps/plan_print.hpp"
#include "apps/scratch_dir.hpp"
#include "apps/train_args.hpp"
#include "apps/train_cluster_members.hpp"
#include "apps/train_lobby.hpp"
#include "apps/train_replan_event.hpp"
#include "schedule/cluster.hpp"
#include "schedule/membership.hpp"
#include "schedule/regrid.hpp"
#include "schedule/replan.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

/// "a, b, c" of the workers' names.
std::string names_of(const std::vector<lobby_worker>& workers) {
  std::string s;
  for (const lobby_worker& w : workers) s += (s.empty() ? "" : ", ") + w.name;
  return s;
}

}  // namespace

int launch_local_elastic(const train_args& a, dist_train_options o, const model_config& cfg,
                         const schedule::cluster_description* cluster, const schedule::plan* plan) {
  if (o.collectives == dp_collectives::device)
    throw std::invalid_argument("--elastic re-plans host collectives only (NCCL groups are fixed at start): use "
                                "--collectives host");
  // With --cluster: the machines still there, which the planner plans on
  // again, with the links measured so far; and the plan running on them.
  std::optional<schedule::cluster_description> machines;
  std::optional<schedule::plan> running;
  // With --cluster: who of the file is there (--standby and lost workers
  // are not), and which joined machines stand for which workers.
  std::optional<cluster_members> members;
  if (cluster) {
    members.emplace(*cluster, std::set<std::string>(a.standby.begin(), a.standby.end()));
    machines = members->present();
  }
  if (cluster && plan) running = *plan;
  const bool probing = running && o.probe_every > 0;
  // A drain writes a checkpoint where the next plan starts, and in-memory
  // snapshots are flushed to one when ranks fail: without
  // --checkpoint-dir, a private one that goes with the job.
  std::optional<scratch_dir> drains;
  if ((probing || o.snapshot_every > 0) && o.checkpoint_dir.empty())
    o.checkpoint_dir = drains.emplace("corolla-elastic").path();
  const schedule::training_setup setup = training_setup_of(a);
  const bool uniform_links = !o.link_profiles.empty();
  const std::string link_profile = uniform_links ? o.link_profiles.back() : std::string();
  const auto start = clock_type::now();
  int printed = 0;  // the last step printed: replayed steps are not printed again
  int steps_run = 0;
  double last_loss = 0;
  std::optional<replan_event> pending;
  nlohmann::json replans = nlohmann::json::array();
  // The measured cost of switching grids: the longest from starting one to
  // its first step (rank processes, joins, a restore, one step), or from a
  // drain or failure to the next grid's first step.
  double switch_s = 0;
  clock_type::time_point grid_started;
  bool grid_stepped = false;
  // The re-plan a drain was asked for: its event and the plan to continue on.
  struct planned_switch {
    replan_event event;
    schedule::plan next;                  ///< --cluster: the plan to continue on
    std::optional<train_layout> grown;    ///< workers joined: the larger grid
    std::vector<lobby_worker> joiners;    ///< ... and the workers running its highest ranks
    /// --cluster: machines that joined as absent workers of the file, and
    /// the description with them (`next` is planned on it).
    std::vector<lobby_worker> cluster_joiners;
    std::optional<schedule::cluster_description> grown_machines;
  };
  std::optional<planned_switch> drained;

  // Workers may join a --pp/--dp job (apps/train_lobby.hpp): ranks [0,
  // local) are this launcher's processes, the rest run on `joined`.
  std::optional<train_lobby> lobby;
  int local = o.layout.world();
  std::vector<lobby_worker> joined;
  // With --cluster only when machines may join: --standby, or a --join-listen given.
  if (a.join_check_every > 0 && (!cluster || !a.standby.empty() || !a.join_listen.empty())) {
    lobby.emplace(a.join_listen.empty() ? "tcp://127.0.0.1:0" : a.join_listen);
    o.drain_every = a.join_check_every;
    if (o.checkpoint_dir.empty()) o.checkpoint_dir = drains.emplace("corolla-elastic").path();
    std::fprintf(stderr, "elastic: workers join with: corolla train --join %s\n", lobby->endpoint().c_str());
    if (a.json)
      std::printf("%s\n", nlohmann::json{{"event", "lobby"}, {"endpoint", lobby->endpoint()}}.dump().c_str());
    std::fflush(stdout);
  }
  auto grid_for = [&](int ranks, std::string* why) {
    schedule::grid_limits limits;
    limits.ranks = ranks;
    limits.n_layers = cfg.n_layers;
    limits.global_batch = o.batch;
    limits.micro_batch = o.micro_batch;
    limits.chunks = o.layout.chunks;
    limits.prefer_pp = o.layout.pp;
    return schedule::regrid(limits, why);
  };
  schedule::change_watch watch;  // a link counts as changed when probes in a row agree

  // Each rank's compute seconds since the last probe step.
  std::vector<double> computed;
  int computed_steps = 0;
  // --snapshot-every auto: the interval the coordinator chose last, which
  // the next grid starts with.
  int snapshot_every = o.snapshot_every;
  coordinator_hooks hooks;
  hooks.on_step = [&](const dist_step_report& r) {
    if (r.snapshot_median_copy_s > 0) {
      snapshot_every = r.snapshot_every;
      std::fprintf(stderr,
                   "elastic: in-memory snapshots every %d step(s) after step %d (a snapshot's copies took %.3f s, a "
                   "step %.3f s)\n",
                   r.snapshot_every, r.step, r.snapshot_median_copy_s, r.snapshot_median_step_s);
      if (a.json)
        std::printf("%s\n", nlohmann::json{{"event", "snapshot_every"},
                                           {"step", r.step},
                                           {"every", r.snapshot_every},
                                           {"copy_s", r.snapshot_median_copy_s},
                                           {"step_s", r.snapshot_median_step_s}}
                                .dump()
                                .c_str());
    }
    if (computed.size() != r.compute_s.size()) {
      computed.assign(r.compute_s.size(), 0.0);  // a new grid
      computed_steps = 0;
    }
    for (std::size_t i = 0; i < r.compute_s.size(); ++i) computed[i] += r.compute_s[i];
    ++computed_steps;
    if (!grid_stepped) {
      grid_stepped = true;
      switch_s = std::max(switch_s, std::chrono::duration<double>(clock_type::now() - grid_started).count());
    }
    if (pending) {
      const double took = std::chrono::duration<double>(clock_type::now() - pending->failed_at).count();
      pending->print(a, true);
      replans.push_back(pending->json(took, true));
      pending.reset();
      switch_s = std::max(switch_s, took);  // a whole switch, drain or restore included
    }
    if (r.step <= printed) return;
    printed = r.step;
    ++steps_run;
    last_loss = r.loss;
    print_step(a, o, r);
  };
  // The verdicts at drain steps: a measured change that makes another plan
  // pay (--probe-every), workers that joined.
  std::function<bool(const dist_step_report&)> probe_drain, join_drain;
  if (probing)
    probe_drain = [&](const dist_step_report& r) {
      auto worker_of = [&](int rank) {
        const std::string& name = o.layout.worker_names.at(static_cast<std::size_t>(rank));
        for (const auto& w : machines->workers)
          if (w.name == name) return w.rank;
        return -1;
      };
      std::vector<schedule::link_measurement> seen;
      for (const auto& l : r.links)
        if (const int x = worker_of(l.from), y = worker_of(l.to); x >= 0 && y >= 0) seen.push_back({x, y, l.bytes_per_s});
      std::vector<std::string> link_changes, speed_changes;
      machines = schedule::with_measurements(*machines, watch.sustained(*machines, seen), {}, &link_changes);
      // Compute per step, against the cost model's figure for the same work,
      // averaged over at least 8 steps (one step's few milliseconds on a
      // busy host say little).
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
      for (const std::string& c : link_changes) std::fprintf(stderr, "elastic: link %s (step %d)\n", c.c_str(), r.step);
      for (const std::string& c : speed_changes) std::fprintf(stderr, "elastic: %s (step %d)\n", c.c_str(), r.step);
      // The drain stops the job after this step; the new plan runs the rest.
      const long left = static_cast<long>(o.steps) - r.step;
      const schedule::replan_advice advice = schedule::advise_replan(*machines, *running, cfg, setup, left, switch_s);
      std::fprintf(stderr, "elastic: %s\n", advice.why.c_str());
      if (!advice.move) return false;
      replan_event ev;
      ev.changes = link_changes;
      ev.changes.insert(ev.changes.end(), speed_changes.begin(), speed_changes.end());
      ev.cause = link_changes.empty() ? "speeds changed" : speed_changes.empty() ? "links changed" : "links and speeds changed";
      ev.predicted_from_s = advice.current_s;
      ev.predicted_to_s = advice.next_s;
      ev.from = o.layout.describe();
      planned_switch sw;
      sw.event = std::move(ev);
      sw.next = advice.next;
      drained = std::move(sw);
      return true;
    };
  if (lobby && members)
    join_drain = [&](const dist_step_report& r) {
      std::vector<lobby_worker> pool;
      try {
        pool = lobby->pool();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "elastic: %s\n", e.what());
        return false;
      }
      const std::vector<lobby_worker> joining = members->candidates(pool);
      if (joining.empty()) return false;
      const std::string names = names_of(joining);
      schedule::cluster_description grown;
      schedule::plan moved;
      try {
        grown = members->with_joined(joining, *machines);
        moved = schedule::renumber_plan(*running, *machines, grown);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "elastic: worker(s) %s cannot join: %s\n", names.c_str(), e.what());
        return false;
      }
      // The cost model prices the running plan with the joined workers idle
      // against the planner's plan with them, over the steps left.
      const long left = static_cast<long>(o.steps) - r.step;
      const schedule::replan_advice advice = schedule::advise_replan(grown, moved, cfg, setup, left, switch_s);
      std::fprintf(stderr, "elastic: worker(s) %s offer(s) to join after step %d: %s\n", names.c_str(), r.step,
                   advice.why.c_str());
      if (!advice.move) return false;
      planned_switch s;
      s.event.changes = {"worker(s) " + names + " joined"};
      s.event.cause = "workers joined";
      s.event.predicted_from_s = advice.current_s;
      s.event.predicted_to_s = advice.next_s;
      s.event.from = o.layout.describe();
      s.next = advice.next;
      s.cluster_joiners = joining;
      s.grown_machines = std::move(grown);
      drained = std::move(s);
      return true;
    };
  else if (lobby)
    join_drain = [&](const dist_step_report& r) {
      std::vector<lobby_worker> waiting, pool;
      try {
        pool = lobby->pool();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "elastic: %s\n", e.what());
        return false;
      }
      for (const lobby_worker& w : pool)
        if (std::none_of(joined.begin(), joined.end(), [&](const lobby_worker& j) { return j.node_id == w.node_id; }))
          waiting.push_back(w);
      if (waiting.empty()) return false;
      const int have = local + static_cast<int>(joined.size());
      std::string why;
      const auto g = grid_for(have + static_cast<int>(waiting.size()), &why);
      if (!g || g->pp * g->dp <= o.layout.world()) return false;  // no larger grid fits: they wait
      // Pays off? The global batch splits over more ranks: a step is
      // predicted to take world / new world of this one's, over the steps
      // left, against the measured cost of a switch (20 % margin).
      const int grown_world = g->pp * g->dp;
      const double saving = static_cast<double>(o.steps - r.step) * r.seconds *
                            (1.0 - static_cast<double>(o.layout.world()) / grown_world);
      if (saving < 1.2 * switch_s) {
        std::fprintf(stderr, "elastic: %zu worker(s) wait: growing to %dx%d would save about %.2f s over the %d step(s) "
                             "left, a switch costs about %.2f s\n",
                     waiting.size(), g->pp, g->dp, saving, o.steps - r.step, switch_s);
        return false;
      }
      planned_switch s;
      s.grown = even_layout(cfg.n_layers, g->pp, g->dp, o.layout.chunks);
      s.joiners = joined;
      for (const lobby_worker& w : waiting)
        if (static_cast<int>(s.joiners.size()) < g->pp * g->dp - local) s.joiners.push_back(w);
      std::string names;
      for (std::size_t i = joined.size(); i < s.joiners.size(); ++i)
        names += (names.empty() ? "" : ", ") + s.joiners[i].name;
      s.event.changes = {"worker(s) " + names + " joined"};
      s.event.cause = "workers joined";
      s.event.from = o.layout.describe();
      std::fprintf(stderr, "elastic: worker(s) %s joined: growing %s to %dx%d after step %d (about %.2f s saved)\n",
                   names.c_str(), o.layout.describe().c_str(), g->pp, g->dp, r.step, saving);
      drained = std::move(s);
      return true;
    };
  if (probe_drain || join_drain)
    hooks.drain = [&](const dist_step_report& r) {
      if (probe_drain && probe_drain(r)) return true;
      return join_drain && join_drain(r);
    };
  remote_ranks remote;
  // Ranks on joined machines: with --cluster, those whose worker a joined
  // machine stands for; else the grid's highest ranks from `local` on.
  auto machine_of = [&](int rank) -> const lobby_worker* {
    if (members) return members->machine_of(o.layout.worker_names.at(static_cast<std::size_t>(rank)));
    return rank >= local ? &joined.at(static_cast<std::size_t>(rank - local)) : nullptr;
  };
  remote.is_remote = [&](int rank) { return machine_of(rank) != nullptr; };
  remote.assign = [&](int rank, const std::vector<std::string>& args, const std::string& job) {
    lobby->assign(machine_of(rank)->node_id, args, job);
  };
  remote.gone = [&]() -> std::optional<std::string> {
    std::vector<lobby_worker> pool;
    try {
      pool = lobby->pool();
    } catch (const std::exception&) {
      return std::nullopt;  // no answer says nothing about the workers
    }
    for (int rank = 0; rank < o.layout.world(); ++rank)
      if (const lobby_worker* m = machine_of(rank);
          m && std::none_of(pool.begin(), pool.end(), [&](const lobby_worker& w) { return w.node_id == m->node_id; }))
        return o.layout.label(rank) + " is down: its worker " + m->name + " left the pool";
    return std::nullopt;
  };
  for (;;) {
    std::vector<int> lost;
    try {
      grid_started = clock_type::now();
      grid_stepped = false;
      computed.clear();  // measurements of the previous grid's ranks
      computed_steps = 0;
      o.snapshot_every = snapshot_every;
      const bool any_remote = !joined.empty() || (members && members->any_joined());
      const int last = run_local_job(a, o, cfg, hooks, &lost, any_remote ? &remote : nullptr);
      if (last >= o.steps) break;
      if (!drained)
        throw train_error("the job stopped after step " + std::to_string(last) + " of " + std::to_string(o.steps) +
                          " without a re-plan");
      // Drained after `last` for a better plan: it continues from there.
      replan_event ev = std::move(drained->event);
      if (drained->grown) {
        // Workers joined: the larger grid, their ranks the highest.
        o.layout = *drained->grown;
        joined = std::move(drained->joiners);
        if (uniform_links) {
          const std::size_t world = static_cast<std::size_t>(o.layout.world());
          o.link_profiles.assign(world * world, link_profile);
        }
        drained.reset();
        ev.failed_at = clock_type::now();
        ev.resume_step = last;
        ev.last_done = last;
        ev.to = o.layout.describe();
        ev.ranks_left = o.layout.world();
        o.resume = true;
        ev.bytes = static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, last));
        pending = std::move(ev);
        continue;
      }
      running = std::move(drained->next);
      const bool grew = drained->grown_machines.has_value();
      if (grew) {
        machines = std::move(*drained->grown_machines);
        members->join(drained->cluster_joiners);
      }
      drained.reset();
      ev.failed_at = clock_type::now();
      ev.resume_step = last;
      ev.last_done = last;
      use_plan(*machines, *running, o, a.link_profile);
      ev.to = o.layout.describe();
      ev.ranks_left = machines->size();
      o.resume = true;
      ev.bytes = static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, last));
      std::fprintf(stderr, "elastic: drained after step %d; re-planned %s: ", last,
                   grew ? "with the workers that joined" : "on what was measured");
      print_plan(stderr, *machines, *running);
      pending = std::move(ev);
    } catch (const train_error& e) {
      const auto failed_at = clock_type::now();
      drained.reset();  // a drain the failure cut short
      if (pending) {
        pending->print(a, false);
        replans.push_back(pending->json(0, false));
        pending.reset();
      }
      // A failure that lost no rank (bad weights, a full disk) would fail
      // again on any grid.
      if (lost.empty()) throw;
      replan_event ev;
      ev.reason = e.what();
      ev.lost = lost;
      ev.lost_labels = labels(o.layout, lost);
      ev.from = o.layout.describe();
      ev.last_done = printed;
      ev.failed_at = failed_at;
      // The survivors flushed what they hold in memory: the newest step
      // every rank's state survived becomes a checkpoint (no step lost).
      if (o.snapshot_every > 0) {
        // Up to the last step printed: a later one's loss was never shown.
        const memory_recovery rec =
            commit_memory_snapshots(o.checkpoint_dir, o.layout.world(), cfg.n_layers, checkpoint_key(o, cfg),
                                    o.layout.describe(), printed);
        ev.from_memory = rec.step > 0;
        if (rec.step > 0)
          std::fprintf(stderr, "elastic: the survivors' snapshots of step %d cover every rank (%d rank(s) flushed)\n",
                       rec.step, rec.holders);
        else
          std::fprintf(stderr, "elastic: no complete in-memory snapshot (%s); falling back to %s\n", rec.why_not.c_str(),
                       latest_checkpoint_step(o.checkpoint_dir) > 0 ? "the last checkpoint" : "the start");
      }
      if (machines) {
        // The lost ranks' machines go; the planner plans again on the rest,
        // free to choose depth, width, placement and micro-batch.
        std::vector<std::string> gone;
        for (int r : lost) gone.push_back(o.layout.worker_names.at(static_cast<std::size_t>(r)));
        members->lose(gone);  // absent again: a machine may join as one of them later
        try {
          machines = members->present(&*machines);
        } catch (const std::exception& x) {
          throw train_error(std::string(e.what()) + "; cannot continue: " + x.what());
        }
        ev.ranks_left = machines->size();
        ev.left_unit = "worker(s)";
        if (ev.ranks_left < a.min_ranks)
          throw train_error(std::string(e.what()) + "; " + std::to_string(ev.ranks_left) +
                            " worker(s) left, fewer than --min-ranks " + std::to_string(a.min_ranks));
        const schedule::plan p = plan_on(a, cfg, *machines);
        if (!p.feasible) throw train_error(std::string(e.what()) + "; no feasible plan on the workers left: " + p.reason);
        use_plan(*machines, p, o, a.link_profile);
        running = p;
        std::fprintf(stderr, "elastic: re-planned on %d worker(s) of %s: ", machines->size(), machines->name.c_str());
        print_plan(stderr, *machines, p);
      } else {
        // The lost: this launcher's processes below `local`, joined workers' above.
        std::vector<lobby_worker> kept;
        for (std::size_t i = 0; i < joined.size(); ++i)
          if (std::find(lost.begin(), lost.end(), local + static_cast<int>(i)) == lost.end()) kept.push_back(joined[i]);
        local -= static_cast<int>(std::count_if(lost.begin(), lost.end(), [&](int r) { return r < local; }));
        joined = std::move(kept);
        ev.ranks_left = local + static_cast<int>(joined.size());
        if (ev.ranks_left < a.min_ranks)
          throw train_error(std::string(e.what()) + "; " + std::to_string(ev.ranks_left) +
                            " rank(s) left, fewer than --min-ranks " + std::to_string(a.min_ranks));
        std::string why;
        const auto g = grid_for(ev.ranks_left, &why);
        if (!g) throw train_error(std::string(e.what()) + "; cannot continue: " + why);
        o.layout = even_layout(cfg.n_layers, g->pp, g->dp, o.layout.chunks);
        // A grid smaller than the ranks left leaves workers out first.
        if (o.layout.world() < local) local = o.layout.world();
        joined.resize(static_cast<std::size_t>(o.layout.world() - local));
        const std::size_t world = static_cast<std::size_t>(o.layout.world());
        if (uniform_links) o.link_profiles.assign(world * world, link_profile);
      }
      ev.to = o.layout.describe();
      const int left = ev.ranks_left;
      ev.resume_step = o.checkpoint_dir.empty() ? 0 : latest_checkpoint_step(o.checkpoint_dir);
      // Without a checkpoint the job starts over: the same initialisation
      // (--seed, or the model's weights) and the same data order.
      o.resume = ev.resume_step > 0;
      if (o.resume) ev.bytes = static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, ev.resume_step));
      std::fprintf(stderr, "elastic: %s; %d %s left: %s -> %s\n", e.what(), left, ev.left_unit, ev.from.c_str(),
                   ev.to.c_str());
      pending = std::move(ev);
    }
  }
  print_local_summary(a, o, steps_run, last_loss, clock_type::now() - start, {{"replans", replans}});
  return 0;
}

}  // namespace corolla::app
