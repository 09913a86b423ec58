// The local launcher's job (apps/train_args.hpp, run_local_job): one
// `corolla train --rank R` process per rank of the grid on 127.0.0.1 (or a
// joined worker's, apps/train_lobby.hpp), the coordinator in this process,
// every rank reaped on the way out; on a failure, the ranks it lost.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_comm.hpp"
#include "actors/train_job.hpp"
#include "actors/train_snapshots.hpp"
#include "actors/train_store.hpp"
#include "actors/train_wire.hpp"
#include "apps/launcher_takeover.hpp"
#include "apps/rank_hold.hpp"
#include "apps/rank_processes.hpp"
#include "apps/self_process.hpp"
#include "apps/train_args.hpp"
#include "apps/train_lobby.hpp"
#include "apps/train_job_file.hpp"
#include "kernels/backend.hpp"
#include "schedule/process_match.hpp"
#include "schedule/snapshot_choice.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;

/// The device a locally launched rank computes on: with device
/// collectives rank r takes GPU r (one GPU per rank, as NCCL requires;
/// run_local_job checks there are enough); with --device cuda or auto,
/// GPU r mod the GPUs visible; else --device as given.
std::string rank_device(const train_args& a, int rank) {
  if (a.collectives == "device") return "cuda:" + std::to_string(rank);
  if (any_gpu(a.device)) return "cuda:" + std::to_string(rank % cuda_device_count());
  return a.device;
}

}  // namespace

void choose_held_step(node& n, const dist_train_options& o, const model_config& cfg, int world,
                      std::vector<holder_process>& procs, std::uint64_t run, held_snapshots& held) {
  std::vector<schedule::held_snapshot> copies;
  std::map<std::tuple<int, int, std::int64_t>, snapshot_listing> listings;  // (holder, owner, step) -> its listing
  std::map<int, std::size_t> process_of;  // a holder (its rank in that run's grid) -> its process in `procs`
  held.holders = 0;
  for (holder_process& p : procs) {
    p.buckets.clear();
    p.bytes.clear();
  }
  for (int i = 0; i < static_cast<int>(procs.size()); ++i) {
    const holder_process& p = procs[static_cast<std::size_t>(i)];
    if (p.pid <= 0) continue;
    // Over the link it has when it ran a rank of this job, else a new one.
    caf::expected<std::string> c = p.node_id;
    if (!n.peer_is_up(p.node_id)) {
      connect_options co;
      co.timeout = std::chrono::seconds(10);
      c = n.connect(p.endpoint, co);
    }
    auto x = c ? fetch_snapshot_index(n, p.node_id, run, std::chrono::seconds(10))
               : caf::expected<snapshot_index>(c.error());
    if (!x) {
      spdlog::warn("the process at {} does not list its snapshots: {}", p.endpoint, error_message(x.error()));
      continue;
    }
    ++held.holders;
    // Holders as ranks of that run's grid: the choice reads an owner's own
    // copy first (it has the parameters).
    if (!process_of.emplace(x->holder, static_cast<std::size_t>(i)).second) {
      spdlog::warn("two processes hold as rank {} of run {}: the one at {} is not read", x->holder, run, p.endpoint);
      continue;
    }
    for (const snapshot_listing& l : x->snapshots) {
      schedule::held_snapshot h;
      h.holder = x->holder;
      h.owner = l.owner;
      h.step = l.step;
      for (const auto& [name, values] : l.tensors)
        if (name.rfind("params.", 0) == 0) h.params.insert(name.substr(7));
      for (const auto& [bucket, range] : l.ranges) h.moments[bucket] = {range.lo, range.hi, range.n};
      copies.push_back(std::move(h));
      listings[{x->holder, l.owner, l.step}] = l;
    }
  }
  const std::vector<std::string> buckets = job_buckets(o, cfg.n_layers);
  const int latest = o.checkpoint_dir.empty() ? 0 : latest_checkpoint_step(o.checkpoint_dir);
  const schedule::snapshot_choice choice =
      schedule::choose_snapshot_step(copies, world, buckets, held.newest ? *held.newest : -1, latest);
  if (!choice.found()) {
    held.why_not = copies.empty() ? "no survivor holds a snapshot" : choice.why_not;
    return;
  }
  held.restore = {};
  held.bytes = 0;
  held.restore.step = static_cast<int>(choice.step);
  held.restore.run = run;
  for (const auto& [owner, holder] : choice.source) {
    const holder_process& p = procs.at(process_of.at(holder));
    held.restore.holder_of[owner] = p.node_id;
    held.restore.endpoints[p.node_id] = p.endpoint;
    const snapshot_listing& l = listings.at({holder, owner, choice.step});  // the copy read
    held.bytes += l.bytes();
    if (held.restore.loss_scale.empty()) held.restore.loss_scale = l.loss_scale;
  }
  // What each process holds of that step, for placing the next grid's ranks.
  for (const auto& [key, l] : listings)
    if (std::get<2>(key) == choice.step)
      for (const auto& [name, values] : l.tensors)
        if (name.rfind("params.", 0) == 0) {
          holder_process& p = procs.at(process_of.at(std::get<0>(key)));
          p.buckets.insert(name.substr(7));
          p.bytes[name.substr(7)] = 4.0 * static_cast<double>(values);  // f32
        }
}

std::vector<std::string> rank_args(const train_args& a, int rank, const std::string& coordinator, const std::string& job_file) {
  auto num = [](auto v) { return std::to_string(v); };

  // The job itself (layout, optimizer, links, checkpoints) is in the job
  // file; the flags say where the model and data are and who this rank is.
  std::vector<std::string> r{"train",        "--model",  a.model,       "--data",  a.data,
                             "--batch",      num(a.batch), "--seq",     num(a.seq), "--steps",
                             num(a.steps),   "--lr",     "0",           "--seed",  num(a.seed),
                             "--threads",    num(a.threads > 0 ? a.threads : 1), "--device", rank_device(a, rank), "--matmul", a.matmul, "--rank", num(rank),
                             "--coordinator", coordinator, "--external-coordinator", "--job-file", job_file,
                             "--listen",     launcher_listen(a)};  // a joined worker's rank listens on its own host
  return r;
}

void run_local_job(const train_args& a, const dist_train_options& o, const model_config& cfg,
                   const std::function<void(const dist_step_report&)>& on_step, std::vector<int>* lost) {
  coordinator_hooks hooks;
  hooks.on_step = on_step;
  run_local_job(a, o, cfg, hooks, lost);
}

int run_local_job(const train_args& a, const dist_train_options& o, const model_config& cfg,
                  const coordinator_hooks& given, std::vector<int>* lost, const remote_ranks* remote,
                  held_snapshots* held) {
  if (o.collectives == dp_collectives::device) {
    if (a.device != "auto" && a.device != "cuda")
      throw std::invalid_argument("--collectives device puts local rank r on GPU r: give --device cuda (or auto), not " +
                                  a.device);
    if (const int gpus = cuda_device_count(); gpus < o.layout.world())
      throw std::invalid_argument("--collectives device needs a GPU per rank: the job has " +
                                  std::to_string(o.layout.world()) + " ranks, " + std::to_string(gpus) +
                                  " GPU(s) are visible");
  }
  // On the address other machines reach this one at, when workers join from them.
  auto n = start_node(rank_node_options(launcher_listen(a)), "coordinator");
  const std::string endpoint = n->endpoint();
  spdlog::info("training {} on {} local ranks, coordinator at {}", o.layout.describe(), o.layout.world(), endpoint);
  // A fresh private file (write_job_file: 0600, never an existing path or link).
  const std::string job_text = job_to_json(o).dump() + "\n";
  // Held (locked) while this launcher lives: a sweep leaves it alone.
  const std::unique_ptr<held_job_file> held_file = write_job_file(launcher_job_file_prefix, job_text);
  const fs::path job_file = held_file->path();
  struct remove_file {
    fs::path p;
    ~remove_file() {
      remove_on_stop_signal({});
      std::error_code ec;
      fs::remove(p, ec);
    }
  } cleanup{job_file};
  remove_on_stop_signal(job_file.string());  // it holds the job's takeover token

  auto inbox = std::make_shared<train_inbox>();
  rank_processes ranks;
  std::atomic<bool> over{false};
  // A job reading from the memory of the grid before runs its local ranks
  // in the processes holding it, each where the most bytes of the
  // parameters it needs already are (schedule::match_processes).
  std::vector<int> in_process(static_cast<std::size_t>(o.layout.world()), -1);  // rank -> index into *reusable
  if (held && held->reusable && o.from_memory.step > 0) {
    std::vector<int> local;
    std::vector<std::set<std::string>> needs, holds;
    for (int r = 0; r < o.layout.world(); ++r)
      if (!(remote && remote->is_remote(r))) {
        local.push_back(r);
        needs.push_back(trained_buckets(o, r));
      }
    schedule::bucket_bytes bytes;  // so that the match weighs what would cross a link
    for (const holder_process& h : *held->reusable) {
      holds.push_back(h.pid > 0 ? h.buckets : std::set<std::string>{});
      bytes.insert(h.bytes.begin(), h.bytes.end());
    }
    const std::vector<int> m = schedule::match_processes(needs, holds, bytes);
    for (std::size_t i = 0; i < local.size(); ++i)
      if (m[i] >= 0 && (*held->reusable)[static_cast<std::size_t>(m[i])].pid > 0)
        in_process[static_cast<std::size_t>(local[i])] = m[i];
  }
  auto adopted = [&](int r) {
    const int p = in_process[static_cast<std::size_t>(r)];
    if (p < 0) return false;
    const holder_process& h = (*held->reusable)[static_cast<std::size_t>(p)];
    const rank_assignment next{rank_args(a, r, endpoint, job_file.string()), job_text, o.from_memory.run};
    caf::error err = assign_next_rank(*n, h.node_id, h.endpoint, next, std::chrono::seconds(10));
    // After a takeover a survivor may still be on its way from its failed
    // grid to holding (its door not yet open): a moment's wait.
    for (int tries = 0; err && error_code(err) == "unknown_actor" && tries < 20; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      err = assign_next_rank(*n, h.node_id, h.endpoint, next, std::chrono::seconds(10));
    }
    if (err) {
      spdlog::warn("the process holding at {} does not take {}: {}", h.endpoint, o.layout.label(r), error_message(err));
      return false;
    }
    ranks.adopt(h.pid);
    held->adopted.push_back(h);
    return true;
  };
  for (int r = 0; r < o.layout.world(); ++r) {
    if (remote && remote->is_remote(r)) {
      ranks.skip();
      remote->assign(r, rank_args(a, r, endpoint, job_file.string()), job_text);
    } else if (!adopted(r)) {
      ranks.start(rank_args(a, r, endpoint, job_file.string()), o.takeover_token.empty());
    }
  }
  // The processes now running ranks are no longer the caller's to end.
  if (held && held->reusable)
    std::erase_if(*held->reusable, [&](const holder_process& h) {
      return std::any_of(held->adopted.begin(), held->adopted.end(), [&](const holder_process& x) { return x.pid == h.pid; });
    });
  // A rank process that ends before the job does fails it at once (also
  // before it joined, when no link could report it); so does one that
  // stays stopped (stopped_limit_s: a hung rank, found before the peers'
  // timeout).
  std::set<int> signalled;  // ranks a signal ended while the job ran (the watcher's until it is joined)
  std::thread watcher([&] {
    ranks.watch(
        over,
        [&](int rank, const std::string& how) {
          if (how != "exit status 0" && !over) {
            if (how.rfind("signal", 0) == 0) signalled.insert(rank);
            inbox->fail(o.layout.label(rank) + " exited (" + how + ")");
          }
        },
        stopped_limit_s(o.hang_s),
        [&](int rank, double seconds) {
          // lost_ranks finds it stopped, and the launcher kills it.
          char took[32];
          std::snprintf(took, sizeof took, "%.1f", seconds);
          inbox->fail(o.layout.label(rank) + " is stopped (process state T: SIGSTOP or a debugger) for " + took + " s");
        });
  });
  // Workers' ranks are not this launcher's children: one whose worker went
  // away (before its rank joined, no link could say so) fails the job too.
  std::thread remote_watch;
  if (remote && remote->gone)
    remote_watch = std::thread([&] {
      while (!over) {
        if (auto why = remote->gone()) {
          inbox->fail(*why);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  struct join_on_exit {
    std::atomic<bool>& over;
    std::thread& t;
    ~join_on_exit() {
      over = true;
      if (t.joinable()) t.join();
    }
  } remote_watch_joined{over, remote_watch};
  coordinator_hooks hooks = given;
  // The processes that ran this job's ranks in: once it has a step of its
  // own, nobody reads the keepers of the run they held any more.
  std::atomic<bool> stepped{false};  // whether the job completed a step (set on the coordinator's thread)
  hooks.on_step = [&, then = hooks.on_step](const dist_step_report& r) {
    if (!stepped && held)
      for (const holder_process& h : held->adopted)
        if (auto keeper = n->remote_actor(h.node_id, snapshot_keeper_name(o.from_memory.run))) {
          remote_message drop;
          drop.type = train_msg::snap_drop;
          drop.body = encode_body(train_step_note{0, 0, 0, o.from_memory.run});
          caf::anon_send(*keeper, std::move(drop));
        }
    stepped = true;
    if (then) then(r);
  };
  // Who each rank is, for asking the survivors' keepers after a failure.
  std::map<int, train_peer> roster;
  std::uint64_t run_id = 0;
  launcher_replicas* replicas = held ? held->replicas : nullptr;
  struct detach_replicas {  // the launcher's node goes with this job
    launcher_replicas* r;
    ~detach_replicas() {
      if (r) r->grid(nullptr, {}, {}, 0);
    }
  } replicas_detached{replicas};
  hooks.on_roster = [&, then = given.on_roster](const std::vector<train_peer>& peers, std::uint64_t run) {
    for (const train_peer& p : peers) roster[p.rank] = p;
    run_id = run;
    if (replicas) {
      // Who a new launcher would find: this grid's processes, then those
      // holding the grid before's snapshots.
      std::vector<takeover_process> procs;
      for (const auto& [rank, p] : roster)
        if (const pid_t pid = ranks.pid(rank); pid > 0)
          procs.push_back({rank, pid, p.node_id, p.endpoint, process_start_time(pid)});
      if (held->reusable)
        for (const holder_process& h : *held->reusable)
          if (h.pid > 0) procs.push_back({-1, h.pid, h.node_id, h.endpoint, process_start_time(h.pid)});
      // A rank on another machine: a launcher here could not carry this grid on.
      replicas->grid(n.get(), std::move(procs), job_text, run, !o.takeover_token.empty(), job_file.string());
    }
    if (then) then(peers, run);
  };
  if (a.json)
    hooks.on_roster = [&, then = hooks.on_roster](const std::vector<train_peer>& peers, std::uint64_t run) {
      nlohmann::json list = nlohmann::json::array();
      for (const train_peer& p : peers)
      {
        const bool joined = remote && remote->is_remote(p.rank);
        nlohmann::json r = {{"rank", p.rank}, {"label", o.layout.label(p.rank)},
                            {"pid", joined ? 0 : ranks.pid(p.rank)}, {"endpoint", p.endpoint}};
        if (joined) r["joined"] = true;  // a worker's child process, not this launcher's
        if (static_cast<std::size_t>(p.rank) < o.layout.worker_names.size())
          r["worker"] = o.layout.worker_names[static_cast<std::size_t>(p.rank)];  // --cluster: the machine it stands for
        list.push_back(r);
      }
      std::printf("%s\n", nlohmann::json{{"event", "ranks"}, {"layout", o.layout.describe()}, {"ranks", list}}.dump().c_str());
      std::fflush(stdout);
      then(peers, run);
    };
  // A process that ran a rank in while holding (known before any roster).
  auto adopted_as = [&](int r) -> std::optional<holder_process> {
    if (!held) return std::nullopt;
    for (const holder_process& h : held->adopted)
      if (h.pid == ranks.pid(r)) return h;
    return std::nullopt;
  };
  // Rank r's process (no longer `ranks`' to watch or end) as a holder.
  auto release = [&](int r, std::vector<holder_process>& into) {
    holder_process h;
    if (const auto a = adopted_as(r)) {
      h = *a;
    } else if (const auto peer = roster.find(r); peer != roster.end()) {
      h = {ranks.pid(r), peer->second.node_id, peer->second.endpoint};
    } else {
      return;  // never joined: nobody knows where it listens
    }
    ranks.release(r);
    into.push_back(h);
  };
  int last = 0;
  try {
    last = run_train_coordinator(*n, o, cfg, hooks, inbox);
  } catch (...) {
    over = true;
    watcher.join();
    std::vector<int> gone;
    // Finding the lost ranks must not replace the job's own failure.
    try {
      gone = lost_ranks(ranks, signalled, o.layout.world(), std::current_exception());
    } catch (...) {
      gone.clear();
    }
    if (lost) *lost = gone;
    auto survived = [&](int r) { return std::find(gone.begin(), gone.end(), r) == gone.end() && ranks.pid(r) > 0; };
    // A grid that read the grid before's state from memory and failed
    // before a step of its own holds nothing newer: the processes it ran
    // in hold that state still.
    const bool nothing_newer = held && held->reusable && o.from_memory.step > 0 && !stepped;
    std::vector<holder_process> survivors;  // processes of this grid that hold what their keepers have
    if (o.hold_snapshots && held) {
      for (int r : gone)
        if (const pid_t pid = ranks.pid(r); pid > 0) ::kill(pid, SIGKILL);
      for (int r = 0; r < o.layout.world(); ++r)
        if (survived(r) && (!nothing_newer || adopted_as(r))) release(r, survivors);
    } else if (o.snapshot_every > 0) {
      // The survivors write their in-memory snapshots before they exit
      // (actors/train_snapshots.hpp): wait for that (each one's marker, or
      // its exit), not for the lost (a hung rank never exits by itself),
      // nor for the survivors' goodbyes: once flushed, they are done.
      for (int r : gone)
        if (const pid_t pid = ranks.pid(r); pid > 0) ::kill(pid, SIGKILL);
      // A local rank already reaped (it ended before the job's failure
      // reached this launcher) has flushed what it had, or had nothing.
      std::set<int> flushing;
      // Nor one that holds the grid before's snapshots (it holds on).
      for (int r = 0; r < o.layout.world(); ++r)
        if (std::find(gone.begin(), gone.end(), r) == gone.end() &&
            (ranks.pid(r) > 0 || (remote && remote->is_remote(r))) && !(nothing_newer && adopted_as(r)))
          flushing.insert(r);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!flushing.empty() && std::chrono::steady_clock::now() < deadline) {
        for (const auto& ended : ranks.reap_now()) flushing.erase(ended.first);
        for (auto it = flushing.begin(); it != flushing.end();)
          it = snapshots_flushed(o.checkpoint_dir, *it) ? flushing.erase(it) : std::next(it);
        if (!flushing.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      // Those that ran in holders of the grid before hold its keepers still.
      if (nothing_newer)
        for (int r = 0; r < o.layout.world(); ++r)
          if (survived(r) && adopted_as(r)) release(r, survivors);
      for (int r = 0; r < o.layout.world(); ++r)
        if (const pid_t pid = ranks.pid(r); pid > 0) ::kill(pid, SIGKILL);
    }
    if (nothing_newer) {
      // The step this grid read, from whoever still holds its copies.
      held->processes = std::move(survivors);
      held->processes.insert(held->processes.end(), held->reusable->begin(), held->reusable->end());
      held->reusable->clear();
      choose_held_step(*n, o, cfg, static_cast<int>(o.from_memory.holder_of.size()), held->processes,
                       o.from_memory.run, *held);
    } else if (o.hold_snapshots && held) {
      held->processes = std::move(survivors);
      choose_held_step(*n, o, cfg, o.layout.world(), held->processes, run_id, *held);
    }
    ranks.stop();
    throw;
  }
  over = true;
  watcher.join();
  // Drained into memory: every rank holds the drain step for the next
  // grid (ranks no complete choice covers are ended: the caller falls back).
  if (last < o.steps && o.drains_to_memory() && held) {
    for (int r = 0; r < o.layout.world(); ++r)
      if (ranks.pid(r) > 0) release(r, held->processes);
    choose_held_step(*n, o, cfg, o.layout.world(), held->processes, run_id, *held);
    ranks.stop();
    return last;
  }
  // The ranks end by themselves once told the job is over; stop() only
  // hurries the stragglers.
  ranks.wait_all(std::chrono::seconds(10));
  ranks.stop();
  return last;
}

}  // namespace corolla::app
