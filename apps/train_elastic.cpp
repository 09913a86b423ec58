// `corolla train --pp P --dp D --elastic`: the local launcher that keeps a
// job going when ranks die or hang, links or speeds change, or machines
// join. What the job runs next is the scheduler actor's decision
// (actors/train_scheduler.hpp: the grid of the ranks left, or with
// --cluster the planner's plan on the workers left; a plan that pays on
// measured links and speeds, --probe-every; a larger grid or plan with the
// machines that joined). This launcher executes the decisions: it runs the
// rank processes (here, or on joined machines), commits the survivors'
// in-memory snapshots after a failure, lays the next grid out and prints.
//
// After a failure the new grid continues from the newest state that
// survived (the in-memory snapshots' step, else the latest committed
// checkpoint, re-sharded: layout-independent checkpoints,
// actors/train_store.hpp), or from the start; after a drain, from the
// drain step (held in memory, or its checkpoint). Every step is printed once: steps replayed
// are computed again but not printed again. The global batch, the data
// order and the hyper-parameters never change, so the losses are those of
// the failure-free run up to the reduction order.
//
// After a failure the survivors keep their processes and in-memory
// snapshots (hold_snapshots); a drain the same (drain_to_memory: every
// rank holds the drain step's snapshot), unless workers may join from
// other machines. The new grid's local ranks run in those processes
// (apps/rank_hold.hpp; more ranks than survivors start new ones) and read
// their state from the holders' memory; survivors left over are ended once
// the new grid completes a step. A grid with a rank on a joined worker's
// machine goes through the disk (flushed snapshots assembled into a
// checkpoint; a drain's checkpoint), except when it fails before its
// first step: the processes it ran in hold the step it read still.
#include <unistd.h>

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

#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_scheduler.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "apps/launcher_takeover.hpp"
#include "apps/plan_print.hpp"
#include "apps/scratch_dir.hpp"
#include "apps/self_process.hpp"
#include "apps/train_args.hpp"
#include "apps/train_job_file.hpp"
#include "apps/train_lobby.hpp"
#include "net/endpoint.hpp"
#include "apps/train_replan_event.hpp"
#include "apps/train_step_lines.hpp"
#include "schedule/cluster.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

/// A launcher taking over from `t`'s (dead): the processes of its job still
/// alive, what they hold (held: the running grid's newest step, else the
/// step that grid read, still held by the processes it read from), and
/// the ranks that died with it (`lost`). Returns the failure's reason.
std::string take_over(const train_args& a, const takeover_state& t, const dist_train_options& o,
                      const model_config& cfg, node& n, launcher_replicas* replicas, held_snapshots& held,
                      std::vector<int>& lost) {
  // The dead launcher's job file (its ranks read it long ago; it holds the token).
  if (const fs::path f = t.job_file; !f.empty() && is_job_file(f.string(), launcher_job_file_prefix)) {
    std::error_code ec;
    fs::remove(f, ec);
  }
  std::vector<takeover_process> live;
  for (const takeover_process& p : t.processes) {
    if (p.alive()) {
      held.processes.push_back({p.pid, p.node_id, p.endpoint, {}});
      end_on_stop_signal(p.pid);  // stopping this launcher stops them too
      live.push_back(p);
    } else if (p.rank >= 0) {
      lost.push_back(p.rank);
    }
  }
  std::fprintf(stderr, "elastic: the launcher (pid %d) is gone after step %d; this one (pid %d) carries the job on "
               "with %zu of its processes\n", static_cast<int>(t.launcher), t.printed, static_cast<int>(::getpid()),
               held.processes.size());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"event", "takeover"},
                                       {"pid", static_cast<int>(::getpid())},
                                       {"from_pid", static_cast<int>(t.launcher)},
                                       {"after_step", t.printed},
                                       {"processes", held.processes.size()}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  // Every survivor hears at once that this is its launcher now (no
  // minute's wait, no second takeover), with the steps printed so far.
  if (replicas) {
    replicas->grid(&n, live, t.job, t.run);
    replicas->grid(nullptr, {}, {}, 0);
  }
  choose_held_step(n, o, cfg, o.layout.world(), held.processes, t.run, held);
  if (held.restore.step == 0 && o.from_memory.step > 0)
    choose_held_step(n, o, cfg, static_cast<int>(o.from_memory.holder_of.size()), held.processes, o.from_memory.run,
                     held);
  return "the launcher (the coordinator, pid " + std::to_string(t.launcher) + ") died";
}

/// Prints the scheduler's lines for stderr.
void print_notes(const std::vector<std::string>& notes) {
  for (const std::string& n : notes) std::fprintf(stderr, "elastic: %s\n", n.c_str());
}

}  // namespace

int launch_local_elastic(const train_args& a, dist_train_options o, const model_config& cfg,
                         const schedule::cluster_description* cluster, const schedule::plan* plan) {
  if (o.collectives == dp_collectives::device)
    throw std::invalid_argument("--elastic re-plans host collectives only (NCCL groups are fixed at start): use "
                                "--collectives host");
  const bool probing = cluster && plan && o.probe_every > 0;
  // Started by a rank process after the launcher before died
  // (apps/launcher_takeover.hpp): its grid, where it was.
  std::optional<takeover_state> took;
  std::unique_ptr<node> takeover_node;  // its links to the survivors, until its first grid
  struct remove_file {                  // the lock that let one process start this launcher
    std::string path;
    ~remove_file() {
      std::error_code ec;
      if (!path.empty()) fs::remove(path, ec);
    }
  } takeover_lock;
  if (!a.take_over.empty()) {
    took = read_takeover_file(a.take_over);
    takeover_lock.path = takeover_lock_path(took->token, took->launcher);
    takeover_node = start_node(rank_node_options("tcp://127.0.0.1:0"), "takeover");
    // The newest state any survivor keeps (the one the launcher asked last
    // may have died with it).
    took = newest_takeover_state(*takeover_node, std::move(*took));
    o = job_from_json_text(took->job, "job description of the launcher taken over");
  }
  // A drain writes a checkpoint where the next plan starts, and in-memory
  // snapshots are flushed to one when ranks fail: without
  // --checkpoint-dir, a private one that goes with the job.
  std::optional<scratch_dir> drains;
  if ((probing || o.snapshot_every > 0) && o.checkpoint_dir.empty())
    o.checkpoint_dir = drains.emplace("corolla-elastic").path();
  else if (took && a.checkpoint_dir.empty() && !o.checkpoint_dir.empty() &&
           o.checkpoint_dir.parent_path() == fs::temp_directory_path() &&
           o.checkpoint_dir.filename().string().rfind("corolla-elastic-", 0) == 0)
    drains.emplace(scratch_dir::existing_t{}, o.checkpoint_dir);  // the private one of the launcher before
  // Workers may join (apps/train_lobby.hpp); with --cluster only when
  // machines may: --standby, or a --join-listen given.
  std::optional<train_lobby> lobby;
  bool remote_machines = false;  // whether workers may join from other machines
  if (a.join_check_every > 0 && (!cluster || !a.standby.empty() || !a.join_listen.empty())) {
    launcher_listen(a);  // a wildcard --join-listen is refused before anything starts
    // Workers on other machines: their ranks' snapshots and checkpoints
    // must reach this launcher, through a file system they all share.
    if (!a.join_listen.empty() && !is_loopback_host(net::tcp_endpoint_host(a.join_listen)) && a.checkpoint_dir.empty())
      throw std::invalid_argument("--join-listen " + a.join_listen +
                                  " takes workers from other machines: give --checkpoint-dir on a file system every "
                                  "machine shares (the ranks' snapshots and checkpoints meet there)");
    remote_machines = !a.join_listen.empty() && !is_loopback_host(net::tcp_endpoint_host(a.join_listen));
    lobby.emplace(a.join_listen.empty() ? "tcp://127.0.0.1:0" : a.join_listen);
    o.drain_every = a.join_check_every;
    if (o.checkpoint_dir.empty()) o.checkpoint_dir = drains.emplace("corolla-elastic").path();
    std::fprintf(stderr, "elastic: workers join with: corolla train --join %s\n", lobby->endpoint().c_str());
    if (a.json)
      std::printf("%s\n", nlohmann::json{{"event", "lobby"}, {"endpoint", lobby->endpoint()}}.dump().c_str());
    std::fflush(stdout);
  }

  // The launcher's state lives on in the rank processes, and one of them
  // carries the job on if this process dies (apps/launcher_takeover.hpp):
  // for grids whose ranks all run here and hold snapshots.
  std::optional<launcher_replicas> replicas;
  const std::string takeover_token = o.takeover_token.empty() ? new_takeover_token() : o.takeover_token;
  if (o.snapshot_every > 0) {
    replicas.emplace(takeover_token);
    end_on_stop_signals();  // stopping this launcher on purpose still stops the job
  }

  // --cluster: the file's workers present now (a failure takes its
  // ranks' workers away): what a launcher taking over plans on. Measured
  // links and speeds are not carried over; it measures them again.
  std::vector<std::string> present;
  std::set<std::string> setup_standby_override;  // a launcher taking over: the workers absent then
  if (cluster) {
    std::set<std::string> absent(a.standby.begin(), a.standby.end());
    if (took && took->ledger.contains("present") && took->ledger.at("present").is_array()) {
      std::set<std::string> kept;
      for (const auto& w : took->ledger.at("present"))
        if (w.is_string()) kept.insert(w.get<std::string>());
      absent.clear();
      for (const schedule::worker_spec& w : cluster->workers)
        if (!kept.count(w.name)) absent.insert(w.name);
    }
    for (const schedule::worker_spec& w : cluster->workers)
      if (!absent.count(w.name)) present.push_back(w.name);
    if (took) setup_standby_override = absent;
  }

  scheduler_setup setup;
  setup.layout = o.layout;
  setup.steps = o.steps;
  setup.batch = o.batch;
  setup.micro_batch = o.micro_batch;
  setup.cfg = cfg;
  setup.training = training_setup_of(a);
  price_lora(setup.training, cfg, o.lora);  // re-plans price the adapter only (and QLoRA's frozen blocks)
  setup.min_ranks = a.min_ranks;
  if (cluster) {
    setup.file = *cluster;
    setup.standby = took ? setup_standby_override : std::set<std::string>{a.standby.begin(), a.standby.end()};
    if (plan) setup.plan = *plan;
    setup.planner = [&a, &cfg, lora = o.lora](const schedule::cluster_description& c) {
      return plan_on(a, cfg, c, 0, 0, lora);
    };
  }
  setup.probing = probing;
  setup.joins = lobby.has_value();
  if (lobby) setup.pool = lobby->actor();
  train_scheduler scheduler(std::move(setup));

  const bool uniform_links = !o.link_profiles.empty();
  const std::string link_profile = uniform_links ? o.link_profiles.back() : std::string();
  auto start = clock_type::now();
  double started_unix = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  int printed = 0;  // the last step printed: replayed steps are not printed again
  int steps_run = 0;
  double last_loss = 0;
  std::optional<replan_event> pending;
  nlohmann::json replans = nlohmann::json::array();
  int deadlocks = 0;
  if (took) {
    const nlohmann::json& l = took->ledger;
    printed = took->printed;
    steps_run = l.value("steps_run", 0);
    last_loss = l.value("last_loss", 0.0);
    deadlocks = l.value("deadlocks", 0);
    if (l.contains("replans") && l.at("replans").is_array()) replans = l.at("replans");
    started_unix = l.value("started", started_unix);
    const double ran = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                       started_unix;
    start -= std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(std::max(0.0, ran)));
  }
  // What a launcher taking over from this one starts from.
  auto ledger = [&] {
    nlohmann::json l{{"replans", replans},     {"steps_run", steps_run}, {"last_loss", last_loss},
                     {"started", started_unix}, {"deadlocks", deadlocks}};
    if (cluster) l["present"] = present;
    return l;
  };
  // --snapshot-every auto: the interval the coordinator chose last, which
  // the next grid starts with.
  int snapshot_every = o.snapshot_every;
  rank_machines where;  // which machine runs each rank of the grid
  where.local = o.layout.world();
  where.by_worker = cluster != nullptr;

  // The progress bar is cleared before any other line: the elastic
  // launcher writes its own (snapshots, notes, re-plans) between steps.
  step_lines lines(a);
  coordinator_hooks hooks;
  hooks.on_step = [&](const dist_step_report& r) {
    scheduler.step(r);
    if (r.snapshot_median_copy_s > 0 || pending) lines.clear();
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
    if (pending) {
      const double took = std::chrono::duration<double>(clock_type::now() - pending->failed_at).count();
      pending->print(a, true);
      replans.push_back(pending->json(took, true));
      pending.reset();
    }
    if (r.step <= printed) return;
    printed = r.step;
    ++steps_run;
    last_loss = r.loss;
    // A successor knows the step was printed before it is.
    if (replicas) replicas->publish(printed, ledger());
    lines.step(o, r);
  };
  // The verdicts at drain steps: a measured change that makes another plan
  // pay (--probe-every), machines that joined (the scheduler asks the
  // lobby). The coordinator asks the scheduler actor; the notes come here.
  if (probing || lobby) {
    hooks.scheduler = scheduler.actor();
    hooks.on_verdict_notes = [&lines](const std::vector<std::string>& notes) {
      if (!notes.empty()) lines.clear();
      print_notes(notes);
    };
  }
  remote_ranks remote;
  remote.is_remote = [&](int rank) { return where.of(o.layout, rank) != nullptr; };
  remote.assign = [&](int rank, const std::vector<std::string>& args, const std::string& job) {
    lobby->assign(where.of(o.layout, rank)->node_id, args, job);
  };
  remote.gone = [&]() -> std::optional<std::string> {
    std::vector<lobby_worker> pool;
    try {
      pool = lobby->pool();
    } catch (const std::exception&) {
      return std::nullopt;  // no answer says nothing about the workers
    }
    for (int rank = 0; rank < o.layout.world(); ++rank)
      if (const lobby_worker* m = where.of(o.layout, rank);
          m && std::none_of(pool.begin(), pool.end(), [&](const lobby_worker& w) { return w.node_id == m->node_id; }))
        return o.layout.label(rank) + " is down: its worker " + m->name + " left the pool";
    return std::nullopt;
  };
  // Lays the decided grid out: the plan on its machines, or the grid.
  auto lay_out = [&](const grid_decision& d) {
    where = d.where;
    if (d.machines) {
      present.clear();
      for (const schedule::worker_spec& w : d.machines->workers) present.push_back(w.name);
    }
    if (d.plan) {
      use_plan(*d.machines, *d.plan, o, a.link_profile);
      return;
    }
    o.layout = d.layout;
    if (uniform_links) {
      const std::size_t world = static_cast<std::size_t>(o.layout.world());
      o.link_profiles.assign(world * world, link_profile);
    }
  };
  auto event_of = [&](const grid_decision& d) {
    replan_event ev;
    ev.changes = d.changes;
    ev.cause = d.cause;
    ev.predicted_from_s = d.predicted_from_s;
    ev.predicted_to_s = d.predicted_to_s;
    ev.ranks_left = d.ranks_left;
    ev.left_unit = d.left_unit;
    ev.from = o.layout.describe();
    return ev;
  };
  constexpr int max_deadlock_restarts = 3;
  // The processes of a failed or drained grid's ranks, holding the
  // snapshots the grid after it reads (o.from_memory): that grid's local
  // ranks run in them (run_local_job moves those out); the others are
  // ended once it completes a step.
  std::vector<holder_process> holders;
  struct ended {  // ends (SIGKILL) and reaps the processes it is given, also on the way out
    std::vector<holder_process>& ps;
    void now() {
      std::vector<pid_t> pids;
      for (const holder_process& p : ps) pids.push_back(p.pid);
      terminate_all(pids, std::chrono::milliseconds(0));
      ps.clear();
    }
    ~ended() { now(); }
  } end_holders{holders};
  // The processes of `held` (a failed or drained grid's) become the
  // holders the next grid reads from and runs in; the old ones are ended.
  auto hold_from = [&](held_snapshots& held) {
    end_holders.now();
    holders.swap(held.processes);
    o.from_memory = held.restore;
  };
  hooks.on_step = [&, then = hooks.on_step](const dist_step_report& r) {
    // The new grid's first step: its own snapshots protect it from now on.
    if (pending) end_holders.now();
    // Every process of the job names this launcher by now (the others are
    // ended): no second takeover can start, the lock has done its work.
    if (!takeover_lock.path.empty()) {
      std::error_code ec;
      fs::remove(takeover_lock.path, ec);
      takeover_lock.path.clear();
    }
    then(r);
  };
  // What the rank processes are told from the first grid on (a launcher
  // that took over: the steps printed and the re-plans before it).
  if (replicas) replicas->publish(printed, ledger());
  for (;;) {
    std::vector<int> lost;
    // Survivors keep what they hold in memory for the next grid (workers
    // on other machines write to the shared --checkpoint-dir instead).
    o.hold_snapshots = o.snapshot_every > 0 && !where.any();
    // A drain too, unless the next grid may run on another machine (a
    // --join-listen off loopback), which could not reach them: it reads
    // the drain step's checkpoint from the shared --checkpoint-dir.
    o.drain_to_memory = o.hold_snapshots && !remote_machines;
    // Ranks that may carry the job on without this launcher: not in a grid
    // with a joined worker's rank (those die with it, as before).
    o.takeover_token = replicas && o.hold_snapshots ? takeover_token : std::string();
    o.launcher_pid = static_cast<int>(::getpid());
    held_snapshots held;
    held.newest = &printed;
    held.reusable = &holders;
    held.replicas = replicas ? &*replicas : nullptr;
    bool launcher_lost = false;  // this launcher took over from one that died
    ended end_held{held.processes};  // the survivors or drained ranks, unless they become the holders
    try {
      scheduler.started(o.layout);
      o.snapshot_every = snapshot_every;
      if (took) {
        launcher_lost = true;
        const std::string why = take_over(a, *took, o, cfg, *takeover_node, replicas ? &*replicas : nullptr, held, lost);
        took.reset();
        takeover_node->stop();
        takeover_node.reset();
        throw train_error(why);
      }
      const int last = run_local_job(a, o, cfg, hooks, &lost, where.any() ? &remote : nullptr, &held);
      if (last >= o.steps) break;
      lines.clear();
      // Drained after `last` for a better plan: it continues from there.
      const grid_decision d = scheduler.drained(last);
      if (!d.stop.empty()) throw train_error(d.stop);
      replan_event ev = event_of(d);
      ev.failed_at = clock_type::now();
      ev.resume_step = last;
      ev.last_done = last;
      lay_out(d);
      ev.to = o.layout.describe();
      o.resume = true;
      if (!o.drains_to_memory()) {
        o.from_memory = {};  // from the drain step's checkpoint
        ev.bytes = static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, last));
      } else if (held.restore.step > 0) {
        // The drained ranks hold the drain step: the next grid reads it
        // from their memory, and runs in their processes.
        hold_from(held);
        ev.resume_step = held.restore.step;
        ev.bytes = static_cast<double>(held.bytes);
        ev.from_memory = true;
      } else {
        // Not expected (every rank drained alive): replay from what is left.
        end_holders.now();
        o.from_memory = {};
        ev.resume_step = latest_checkpoint_step(o.checkpoint_dir);
        o.resume = ev.resume_step > 0;
        ev.bytes = o.resume ? static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, ev.resume_step)) : 0.0;
        std::fprintf(stderr, "elastic: the drained ranks' snapshots are incomplete (%s); continuing from %s\n",
                     held.why_not.c_str(), o.resume ? "the last checkpoint" : "the start");
      }
      if (d.plan) {
        // One write: a log line from another thread must not split the prefix from the plan.
        std::fprintf(stderr, "elastic: drained after step %d; re-planned %s: %s", last,
                     d.cause == "workers joined" ? "with the workers that joined" : "on what was measured",
                     plan_text(*d.machines, *d.plan).c_str());
      }
      pending = std::move(ev);
    } catch (const train_error& e) {
      lines.clear();
      const auto failed_at = clock_type::now();
      if (pending) {
        pending->print(a, false);
        replans.push_back(pending->json(0, false));
        pending.reset();
      }
      // A failure that lost no rank (bad weights, a full disk) would fail
      // again on any grid. A deadlock (a message lost with every rank
      // alive, train_stall blaming nobody) starts the grid again from the
      // snapshots, a few times at most: one that keeps coming is a bug.
      const bool deadlock = dynamic_cast<const train_stall*>(&e) != nullptr;
      if (lost.empty() && !launcher_lost && (!deadlock || ++deadlocks > max_deadlock_restarts)) throw;
      // The newest step every rank's state survived in the survivors'
      // memory is where the next grid starts (no printed step lost): read
      // from their processes, or flushed and assembled into a checkpoint.
      bool flushed = false;  // the survivors' snapshots, assembled into a checkpoint
      std::size_t memory_bytes = 0;
      auto falling_back = [&](const std::string& why_not) {
        std::fprintf(stderr, "elastic: no complete in-memory snapshot (%s); falling back to %s\n", why_not.c_str(),
                     latest_checkpoint_step(o.checkpoint_dir) > 0 ? "the last checkpoint" : "the start");
      };
      if (held.restore.step > 0) {
        // Held in memory (run_local_job asked the keepers): the survivors'
        // newest step, or, when this grid failed before a step of its own
        // (also one with a joined worker's rank), the step it read, from
        // the processes that still hold it. The next grid reads it from
        // them and runs in them.
        const bool again = held.restore.run == o.from_memory.run;
        hold_from(held);
        memory_bytes = held.bytes;
        if (again)
          std::fprintf(stderr, "elastic: nothing newer than the snapshots of step %d, still held in memory (%d "
                               "process(es))\n", held.restore.step, held.holders);
        else
          std::fprintf(stderr, "elastic: the survivors' snapshots of step %d cover every rank (%d rank(s) hold them "
                               "in memory)\n", held.restore.step, held.holders);
      } else if (o.hold_snapshots) {
        end_holders.now();
        o.from_memory = {};
        falling_back(held.why_not);
      } else if (o.snapshot_every > 0) {
        o.from_memory = {};
        end_holders.now();
        // Up to the last step printed: a later one's loss was never shown.
        const memory_recovery rec =
            commit_memory_snapshots(o.checkpoint_dir, o.layout.world(), job_buckets(o, cfg.n_layers), checkpoint_key(o, cfg),
                                    o.layout.describe(), printed);
        flushed = rec.step > 0;
        if (flushed)
          std::fprintf(stderr, "elastic: the survivors' snapshots of step %d cover every rank (%d rank(s) flushed)\n",
                       rec.step, rec.holders);
        else
          falling_back(rec.why_not);
      }
      const bool from_memory = flushed || o.from_memory.step > 0;
      const grid_decision d = scheduler.failed(lost, e.what());
      if (!d.stop.empty()) throw train_error(d.stop);
      replan_event ev = event_of(d);
      ev.reason = e.what();
      ev.lost = lost;
      ev.lost_labels = labels(o.layout, lost);
      ev.last_done = printed;
      ev.failed_at = failed_at;
      ev.from_memory = from_memory;
      lay_out(d);
      if (d.plan) {
        std::fprintf(stderr, "elastic: re-planned on %d worker(s) of %s: %s", d.machines->size(),
                     d.machines->name.c_str(), plan_text(*d.machines, *d.plan).c_str());
      }
      ev.to = o.layout.describe();
      if (o.from_memory.step > 0) {
        ev.resume_step = o.from_memory.step;
        ev.bytes = static_cast<double>(memory_bytes);
        o.resume = true;
      } else {
        ev.resume_step = o.checkpoint_dir.empty() ? 0 : latest_checkpoint_step(o.checkpoint_dir);
        // Without a checkpoint the job starts over: the same initialisation
        // (--seed, or the model's weights) and the same data order.
        o.resume = ev.resume_step > 0;
        if (o.resume) ev.bytes = static_cast<double>(checkpoint_shard_bytes(o.checkpoint_dir, ev.resume_step));
      }
      std::fprintf(stderr, "elastic: %s; %d %s left: %s -> %s\n", e.what(), ev.ranks_left, ev.left_unit.c_str(), ev.from.c_str(),
                   ev.to.c_str());
      pending = std::move(ev);
    }
  }
  lines.finish();
  print_local_summary(a, o, cfg, steps_run, last_loss, clock_type::now() - start, {{"replans", replans}});
  return 0;
}

}  // namespace corolla::app
