// `corolla faultlab` on a training job: `corolla train ... --json` (with
// --elastic) as a child process of this binary, its step lines read as they
// come, and the faults fired on the launcher's rank processes (found by
// their `--rank K` argument) when the job reaches their step or second:
// signals for kill, stop and resume; throttle, partition and heal through
// the rank node's control actor (its endpoint from the job's "ranks" event, the
// run's control token from the environment the ranks inherit).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/corolla.hpp"
#include "actors/node_control.hpp"
#include "apps/control_token_env.hpp"
#include "apps/faultlab.hpp"
#include "apps/faultlab_harness.hpp"
#include "apps/self_process.hpp"

namespace corolla::app {

namespace {

using clock_type = std::chrono::steady_clock;
namespace fl = faultlab;
namespace fs = std::filesystem;

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

/// What throttle, partition, heal and hang need: the current grid's rank
/// endpoints (from the job's "ranks" event), which of them are throttled,
/// partitioned or hung, and faultlab's node that reaches their control actors.
struct rank_control {
  std::unique_ptr<faultlab_harness> harness;
  std::map<int, std::string> endpoints;  ///< rank -> where its node listens
  std::map<int, pid_t> pids;             ///< rank -> its process (the launcher's children only)
  int pp = 0, dp = 0;                    ///< the current grid (its "ranks" event's layout), 0 when unknown
  std::set<int> throttled, partitioned, hung;
  std::string lobby;              ///< where workers join (the job's "lobby" event)
  std::vector<pid_t> workers;     ///< joined workers (`corolla train --join`), reaped at the end
  pid_t launcher = -1;            ///< the job's launcher now (a new one after a takeover: its "takeover" event)
  bool launcher_killed = false;   ///< a fault killed the launcher faultlab started
  bool summary = false;           ///< the job's last line, its summary, came
  std::filesystem::path logs;     ///< where their stderr goes
};

/// The rank fault `f` hits among `candidates` (rank -> anything), or -1.
template <class Map>
int pick(const fl::fault& f, const Map& candidates, std::mt19937_64& rng) {
  if (candidates.empty()) return -1;
  if (f.whom.k == fl::target::kind::rank) return candidates.count(f.whom.index) ? f.whom.index : -1;
  std::uniform_int_distribution<std::size_t> d(0, candidates.size() - 1);
  return std::next(candidates.begin(), static_cast<std::ptrdiff_t>(d(rng)))->first;
}

fault_outcome fire(const fl::fault& f, pid_t launcher, std::set<pid_t>& stopped, std::mt19937_64& rng,
                   rank_control& control) {
  const std::string what = std::string(fl::to_string(f.what)) + " " + fl::to_string(f.whom);
  if (f.whom.k == fl::target::kind::launcher) {
    // Its coordinator and scheduler with it; an elastic job's ranks carry on.
    if (!process_alive(control.launcher)) return missed(what + ": no launcher now (skipped)");
    const pid_t pid = control.launcher;
    ::kill(pid, SIGKILL);
    control.launcher_killed = true;
    return landed(what + " (pid " + std::to_string(pid) + ")");
  }
  if (f.what == fl::action::join) {
    if (control.lobby.empty()) return missed("join: the job takes no workers (no lobby; skipped)");
    const std::string name = f.as.empty() ? "j" + std::to_string(control.workers.size() + 1) : f.as;
    std::string file = name;  // "n1/0" -> worker-n1_0.log
    std::replace(file.begin(), file.end(), '/', '_');
    try {
      control.workers.push_back(spawn_self({"train", "--join", control.lobby, "--join-name", name}, -1,
                                           (control.logs / ("worker-" + file + ".log")).string()));
    } catch (const std::exception& e) {
      return missed("join: cannot start a worker (" + std::string(e.what()) + ")");
    }
    return landed("join (worker " + name + ", pid " + std::to_string(control.workers.back()) + ")");
  }
  if (f.what == fl::action::hang) {
    std::map<int, bool> candidates;
    for (const auto& [r, endpoint] : control.endpoints)
      if (!control.hung.count(r)) candidates[r] = true;
    const int r = pick(f, candidates, rng);
    if (r < 0) return missed(what + ": no such rank now (skipped)");
    if (const std::string err = control.harness->stall(control.endpoints.at(r)); !err.empty())
      return missed(what + ": rank " + std::to_string(r) + " refused (" + err + ")");
    control.hung.insert(r);
    return landed(what + " (rank " + std::to_string(r) + ", its stage stalls inside its next compute call)");
  }
  if (f.what == fl::action::lose) {
    std::map<int, bool> candidates;
    for (const auto& [r, endpoint] : control.endpoints)
      if (!control.hung.count(r)) candidates[r] = true;
    const int r = pick(f, candidates, rng);
    if (r < 0) return missed(what + ": no such rank now (skipped)");
    std::string type = f.message;
    if (type == "any") {
      // What rank r receives in this grid: activations unless it is a
      // first stage, gradients unless a last, reduce-scatter pieces with replicas.
      std::vector<std::string> receives;
      if (control.pp > 0 && control.dp > 0) {
        const int stage = r / control.dp;
        if (stage > 0) receives.push_back("train.act");
        if (stage < control.pp - 1) receives.push_back("train.grad");
        if (control.dp > 1) receives.push_back("train.rs");
      }
      if (receives.empty()) return missed(what + ": rank " + std::to_string(r) + " receives no message of a rank now (skipped)");
      type = receives[std::uniform_int_distribution<std::size_t>(0, receives.size() - 1)(rng)];
    }
    if (const std::string err = control.harness->lose(control.endpoints.at(r), type); !err.empty())
      return missed(what + ": rank " + std::to_string(r) + " refused (" + err + ")");
    return landed(what + " (rank " + std::to_string(r) + " loses its next " + type + " message)");
  }
  if (f.what == fl::action::throttle || f.what == fl::action::partition || f.what == fl::action::heal) {
    const bool heal = f.what == fl::action::heal;
    std::map<int, bool> candidates;
    for (const auto& [r, endpoint] : control.endpoints) {
      const bool throttled = control.throttled.count(r) > 0, partitioned = control.partitioned.count(r) > 0;
      if (heal ? throttled || partitioned : f.what == fl::action::partition ? !partitioned : !throttled)
        candidates[r] = true;
    }
    const int r = pick(f, candidates, rng);
    if (r < 0) return missed(what + ": no such rank " + (heal ? "throttled or partitioned " : "") + "now (skipped)");
    const std::string& endpoint = control.endpoints.at(r);
    const std::string err = heal ? control.harness->heal(endpoint)
                            : f.what == fl::action::partition ? control.harness->partition(endpoint, true)
                                                              : control.harness->reshape(endpoint, f.profile);
    if (!err.empty()) return missed(what + ": rank " + std::to_string(r) + " refused (" + err + ")");
    const std::string rank = "rank " + std::to_string(r);
    if (heal) {
      control.throttled.erase(r);
      control.partitioned.erase(r);
      return landed(what + " (" + rank + ", back to its own shaping, no partition)");
    }
    if (f.what == fl::action::partition) {
      control.partitioned.insert(r);
      return landed(what + " (" + rank + ", traffic with every peer dropped)");
    }
    control.throttled.insert(r);
    return landed(what + " (" + rank + ", sends shaped " + f.profile + ")");
  }
  // The current grid's rank processes (its "ranks" event), not the
  // survivors of an earlier grid that still hold their snapshots with the
  // same --rank argument.
  // (After a takeover they are no launcher's children: the event's pids.)
  std::map<int, pid_t> ranks;
  if (control.pids.empty()) {
    const std::vector<std::pair<int, pid_t>> running = rank_processes_of(launcher);
    ranks.insert(running.begin(), running.end());
  }
  for (const auto& [r, pid] : control.pids)
    if (process_alive(pid)) ranks[r] = pid;
  std::map<int, pid_t> candidates;
  for (const auto& [r, pid] : ranks) {
    const bool is_stopped = stopped.count(pid) > 0;
    if (f.what == fl::action::resume ? is_stopped : !is_stopped) candidates[r] = pid;
  }
  const int r = pick(f, candidates, rng);
  if (r < 0) return missed(what + ": no such rank process now (skipped)");
  const pid_t pid = candidates.at(r);
  const int sig = f.what == fl::action::kill ? SIGKILL : f.what == fl::action::stop ? SIGSTOP : SIGCONT;
  ::kill(pid, sig);
  if (f.what == fl::action::stop) stopped.insert(pid);
  if (f.what == fl::action::resume) stopped.erase(pid);
  return landed(what + " (rank " + std::to_string(r) + ", pid " + std::to_string(pid) + ")");
}

}  // namespace

faultlab_run run_train_scenario(const fl::scenario& s, bool inject, std::mt19937_64& rng, const fs::path& logs) {
  const fl::train_job& job = *s.train;
  faultlab_run run;
  const auto t0 = clock_type::now();
  std::vector<std::string> args = {"train", "--model", job.model, "--data", job.data, "--json"};
  for (const auto& w : words(job.args)) args.push_back(w);
  for (const auto& w : words(job.layout)) args.push_back(w);
  if (job.elastic) args.push_back("--elastic");
  if (job.checkpoint_every > 0) {
    // Each run checkpoints into a directory of its own, fresh.
    const fs::path ck = logs / "checkpoints";
    std::error_code ec;
    fs::remove_all(ck, ec);
    args.insert(args.end(), {"--checkpoint-dir", ck.string(), "--checkpoint-every", std::to_string(job.checkpoint_every)});
  }
  int out[2];
  if (::pipe(out) != 0) {
    run.error = std::string("cannot create a pipe: ") + std::strerror(errno);
    return run;
  }
  const std::string err_log = (logs / (inject ? "train-faults.log" : "train-reference.log")).string();
  // The rank processes inherit the token: throttle and heal use it.
  const control_token_env token;
  rank_control control;
  control.harness = std::make_unique<faultlab_harness>(token.token());
  control.logs = logs;
  pid_t pid = -1;
  try {
    pid = spawn_self(args, out[1], err_log);
    control.launcher = pid;
  } catch (const std::exception& e) {
    ::close(out[0]);
    ::close(out[1]);
    run.error = e.what();
    return run;
  }
  ::close(out[1]);
  std::vector<bool> fired(s.faults.size(), false);
  for (const fl::fault& f : s.faults) run.faults.push_back({fl::to_string(f.at), fl::to_string(f.what), fl::to_string(f.whom)});
  std::set<pid_t> stopped;
  auto last = clock_type::now();
  int step = 0;
  const auto hang_limit = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(s.expect.max_stall_s > 0 ? 3 * s.expect.max_stall_s + 60 : 600));
  bool hung = false;
  std::string pending;
  bool open = true;
  while (open) {
    pollfd p{out[0], POLLIN, 0};
    ::poll(&p, 1, 100);
    const auto now = clock_type::now();
    if (p.revents & (POLLIN | POLLHUP)) {
      char buf[4096];
      const ssize_t got = ::read(out[0], buf, sizeof buf);
      if (got <= 0) {
        open = false;
      } else {
        pending.append(buf, static_cast<std::size_t>(got));
        for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
          const std::string line = pending.substr(0, nl);
          pending.erase(0, nl + 1);
          const auto j = nlohmann::json::parse(line, nullptr, false);
          if (!j.is_object()) continue;
          const double at = std::chrono::duration<double>(now - t0).count();
          if (j.value("event", "") == "replan") {
            ++run.recoveries;
            // A re-plan answers whatever fault the job has not answered yet.
            run.noticed("launcher", "re-plan: " + j.dump(), at, true);
          }
          if (j.value("event", "") == "takeover" && j.contains("pid") && j["pid"].is_number_integer()) {
            control.launcher = static_cast<pid_t>(j["pid"].get<std::int64_t>());  // the launcher from now on
            run.noticed("launcher", "takeover: " + j.dump(), std::chrono::duration<double>(now - t0).count(), true);
            continue;
          }
          if (j.contains("tokens_per_s") && j.contains("layout")) control.summary = true;
          if (j.value("event", "") == "lobby" && j.contains("endpoint") && j["endpoint"].is_string()) {
            control.lobby = j["endpoint"].get<std::string>();
            continue;
          }
          if (j.value("event", "") == "ranks" && j.contains("ranks") && j["ranks"].is_array()) {
            // A new grid: fresh processes, unshaped.
            control.endpoints.clear();
            control.pids.clear();
            control.pp = control.dp = 0;
            if (j.contains("layout") && j["layout"].is_string() &&
                std::sscanf(j["layout"].get<std::string>().c_str(), "%dx%d", &control.pp, &control.dp) != 2)
              control.pp = control.dp = 0;
            control.throttled.clear();
            control.partitioned.clear();
            control.hung.clear();
            for (const auto& r : j["ranks"])
              if (r.is_object() && r.value("rank", -1) >= 0 && r.contains("endpoint") && r["endpoint"].is_string()) {
                control.endpoints[r["rank"].get<int>()] = r["endpoint"].get<std::string>();
                if (r.contains("pid") && r["pid"].is_number_integer() && r["pid"].get<std::int64_t>() > 0)
                  control.pids[r["rank"].get<int>()] = static_cast<pid_t>(r["pid"].get<std::int64_t>());
              }
            continue;
          }
          if (!j.contains("step") || !j.contains("loss") || j.contains("tokens")) continue;
          if (!j["step"].is_number_integer() || !j["loss"].is_number() || j["step"].get<std::int64_t>() < 1 ||
              j["step"].get<std::int64_t>() > 10000000)
            continue;
          step = j["step"].get<int>();
          if (static_cast<int>(run.losses.size()) < step) run.losses.resize(static_cast<std::size_t>(step));
          run.losses[static_cast<std::size_t>(step - 1)] = j["loss"].get<double>();
          if (static_cast<int>(run.step_seconds.size()) < step) run.step_seconds.resize(static_cast<std::size_t>(step));
          if (j.contains("seconds") && j["seconds"].is_number())
            run.step_seconds[static_cast<std::size_t>(step - 1)] = j["seconds"].get<double>();
          run.max_stall_s = std::max(run.max_stall_s, std::chrono::duration<double>(now - last).count());
          last = now;
          run.progressed(at);
        }
      }
    }
    // A job that makes no step for far longer than the scenario allows
    // (a rank stopped and never resumed, a hang the job does not notice)
    // would keep faultlab waiting for ever: it is killed and the run fails.
    if (open && !hung && now - last > hang_limit) {
      // SIGTERM: the launcher ends its ranks (which may otherwise outlive
      // it, apps/launcher_takeover.hpp); SIGKILL if it does not end.
      const pid_t now_pid = control.launcher;
      ::kill(now_pid, SIGTERM);
      for (int i = 0; i < 200 && process_alive(now_pid); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ::kill(now_pid, SIGKILL);
      hung = true;
    }
    if (!inject) continue;
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    for (std::size_t i = 0; i < s.faults.size(); ++i) {
      const fl::fault& f = s.faults[i];
      const bool due = f.at.k == fl::moment::kind::step ? step >= f.at.value : elapsed >= f.at.value;
      if (fired[i] || !due) continue;
      fired[i] = true;
      fault_timeline& t = run.faults[i];
      t.injected_at_s = elapsed;
      fault_outcome o = fire(f, pid, stopped, rng, control);
      t.outcome = std::move(o.line);
      t.landed = o.landed;
      run.events.push_back("step " + std::to_string(step) + ": " + t.outcome);
    }
  }
  ::close(out[0]);
  // The stall since the last step line counts too (a job that hung and died).
  run.max_stall_s = std::max(run.max_stall_s, std::chrono::duration<double>(clock_type::now() - last).count());
  int status = 0;
  ::waitpid(pid, &status, 0);
  // Released workers exit by themselves; any left are stopped.
  if (!reap_all(control.workers, std::chrono::seconds(10))) terminate_all(control.workers, std::chrono::seconds(2));
  run.completed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  // The launcher faultlab killed: the one that took over finished the job
  // if its summary came (stdout closed only once it and every rank ended).
  if (control.launcher_killed) run.completed = control.summary;
  if (hung) {
    run.completed = false;
    run.error = "no step for " +
                std::to_string(static_cast<int>(std::chrono::duration<double>(hang_limit).count())) +
                " s after step " + std::to_string(step) + ": faultlab killed the job";
  } else if (!run.completed && control.launcher_killed) {
    run.error = "the launcher was killed and no launcher that took over finished the job (no summary line)";
  } else if (!run.completed) {
    std::ifstream err(err_log);
    // The last error line; else (CLI11's usage errors say no "error") the
    // last line with something in it, but not CLI11's pointer to --help.
    std::string line, lastline, lastany;
    while (std::getline(err, line)) {
      if (line.find("error") != std::string::npos) lastline = line;
      if (line.find_first_not_of(" \t") != std::string::npos && line != "Run with --help for more information.")
        lastany = line;
    }
    if (lastline.empty()) lastline = lastany;
    run.error = "corolla train ended with " +
                (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                   : "signal " + std::to_string(WTERMSIG(status))) +
                (lastline.empty() ? "" : ": " + lastline);
  }
  for (std::size_t i = 0; i < s.faults.size(); ++i)
    if (inject && !fired[i]) run.events.push_back(fl::to_string(s.faults[i].at) + ": never reached (the run ended first)");
  run.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  return run;
}

}  // namespace corolla::app
