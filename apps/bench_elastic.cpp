// corolla bench elastic — what re-planning on measured links saves. A job on
// three single-worker nodes (50 Mbit/s Ethernet; the planner runs 1x2 on
// two of them) whose rank 1 has everything it sends throttled mid-run, run
// twice in the same invocation through faultlab's training runner: with
// --probe-every (the job measures the link, drains at a step boundary and
// continues on a plan around it) and without (a static plan, as Holmes,
// Megatron-LM or TorchElastic keep while no rank dies). Both runs must
// compute the same losses; the figures are the wall time after the
// throttle and the median step time once the re-planned job runs.
//
// With --kill: a 2x2 job (links of 4 ms) loses rank 3 to SIGKILL at
// --kill-step, twice: recovering from the survivors' in-memory snapshots
// (--elastic's default), and the TorchElastic way (every rank restarts from
// the last checkpoint; both runs checkpoint every --checkpoint-every
// steps). The figure is the time lost: from the kill to the next new step,
// less one median step.
//
// With --hang: rank 3 of the same 2x2 job hangs after --kill-step inside
// a compute call with its node up (faultlab's hang), twice: found by the
// rank's watchdog (--hang-s), and as a job without one finds it (--hang-s
// 0: the coordinator's --timeout-s wait for a step's report runs out, and
// it names a rank that waits rather than the hung one). The figure is the
// time lost, as with --kill.
//
// With --lose: rank 3 of that job loses an activation on the way after
// --kill-step (faultlab's lose): every process is up and none computes;
// ranks 1 and 3 wait on each other. Found by the coordinator's stall check
// (--hang-s: it names the cycle, and the same grid starts again from the
// snapshots), and without it (--hang-s 0: --timeout-s runs out, and the
// rank it names, a victim, is dropped). The figure is the time lost.
//
// With --stop: rank 3's process is stopped (SIGSTOP) after --kill-step:
// found by the launcher, which sees it stopped for min(--hang-s, 2 s), and
// without that check (--hang-s 0: the peers' 10 s link timeout). The
// figure is the time lost.
//
// With --join: the same three nodes with n1/0 and n2/0 on standby, so the
// job starts on n0/0 alone; a machine joins as n1/0 at --join-step, and the
// job moves onto the planner's plan with it when the cost model says that
// pays. Against the job that cannot grow (no lobby), in the same run: the
// wall time after the join and the median step at the end.
//
// With --drain: that join twice, both growing: the drain through the
// ranks' memory (in-memory snapshots on: the drained ranks hold the drain
// step and the grown grid reads it from them) and through the drain
// step's checkpoint (--snapshot-every 0). The figure is the switch: the
// longest wait between two steps after the join.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_elastic.hpp"
#include "apps/commands.hpp"
#include "apps/faultlab.hpp"
#include "apps/flag_checks.hpp"
#include "apps/scratch_dir.hpp"
#include "model/config.hpp"
#include "model/error.hpp"
#include "net/shaping.hpp"

namespace corolla::app {

namespace elastic_bench {

namespace fs = std::filesystem;
namespace fl = faultlab;


/// Three single-worker nodes of one site on Ethernet of `gbps` and
/// `latency_us`, each worker priced at `tflops`.
std::string three_nodes_toml(const char* name, double gbps, double latency_us, double tflops) {
  char buf[512];
  std::snprintf(buf, sizeof buf, R"(name = "%s"
[nic.ethernet]
bandwidth_gbps = %g
latency_us = %g
[[cluster]]
name = "site"
  [[cluster.node]]
  name = "n"
  count = 3
  nic = "ethernet"
    [[cluster.node.worker]]
    kind = "cpu"
    tflops = %g
    memory_gib = 4
)",
                name, gbps, latency_us, tflops);
  return buf;
}

/// The throttle's: 50 Mbit/s, where the links set the pace.
std::string bench_cluster_toml() { return three_nodes_toml("three-nodes", 0.05, 200, 0.00002); }

/// --join's: 1 Gbit/s, each worker about what one core of this machine
/// computes, so that the planner's prices match what the ranks measure
/// (compute is not emulated: a worker is a rank process on one thread).
std::string join_cluster_toml() { return three_nodes_toml("three-cores", 1, 50, 0.01); }

/// GPT-2 shaped, 4 blocks of width `hidden` (4 heads, MLP of `ff`).
model_config gpt2_model(int hidden, int ff, int positions) {
  model_config c;
  c.arch = architecture::gpt2;
  c.hf_architecture = "GPT2LMHeadModel";
  c.vocab_size = 64;
  c.hidden_size = hidden;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.head_dim = hidden / 4;
  c.intermediate_size = ff;
  c.max_positions = positions;
  c.tie_embeddings = true;
  return c;
}

/// Width 32: small enough that two cores keep up with three ranks and the
/// links set the pace.
model_config bench_model() { return gpt2_model(32, 48, 64); }

/// --join's: width 128, so that a step's compute outweighs the gradients'
/// all-reduce over the 1 Gbit/s links.
model_config join_model() { return gpt2_model(128, 512, 128); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double sum_from(const std::vector<double>& v, int first_step) {
  double s = 0;
  for (std::size_t i = static_cast<std::size_t>(std::max(0, first_step - 1)); i < v.size(); ++i) s += v[i];
  return s;
}

/// The model (bench_model() unless given) and token file of a run under `scratch`.
void write_bench_job(const fs::path& scratch, const model_config& model) {
  fs::create_directories(scratch / "model");
  std::ofstream(scratch / "model" / "config.json") << to_hf_json(model).dump(2) << '\n';
  std::vector<std::uint16_t> ids(4000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint16_t>((i * 7 + i / 5) % 64);
  std::ofstream f(scratch / "tokens.bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 2));
}

/// The largest relative difference of two runs' losses.
double loss_diff(const faultlab_run& a, const faultlab_run& b) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i)
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::max(1e-12, std::abs(a.losses[i])));
  return worst;
}

/// Time lost to the fault of a run: from its injection to the first new
/// step after it, less the median step before it.
double time_lost(const faultlab_run& r, int fault_step) {
  const double step = median(std::vector<double>(r.step_seconds.begin(), r.step_seconds.begin() + fault_step));
  return std::max(0.0, r.faults[0].recovered_at_s - r.faults[0].injected_at_s - step);
}

/// The 2x2 job of the bench model (links of 4 ms, `o.steps` steps, `flags`
/// added, checkpoints every `checkpoint_every`) with fault `what` on rank 3
/// after --kill-step (a lose drops an activation).
fl::scenario rank3_fault(const fs::path& scratch, const elastic_bench_options& o, const std::string& name,
                         const std::string& flags, int checkpoint_every, fl::action what) {
  fl::scenario s;
  s.name = name;
  fl::train_job j;
  j.model = (scratch / "model").string();
  j.data = (scratch / "tokens.bin").string();
  j.args = "--batch 4 --seq 8 --lr 0.003 --threads 1 --link-profile lat=4ms --steps " + std::to_string(o.steps) + flags;
  j.layout = "--pp 2 --dp 2";
  j.elastic = true;
  j.checkpoint_every = checkpoint_every;
  s.train = j;
  fl::fault f;
  f.at = {fl::moment::kind::step, static_cast<double>(o.kill_step)};
  f.what = what;
  f.whom = {fl::target::kind::rank, 3};
  if (what == fl::action::lose) f.message = "train.act";
  s.faults = {f};
  return s;
}

/// A run of a fault bench must complete and recover from its fault.
void require_recovered(const faultlab_run& r, const std::string& fault) {
  if (!r.completed) throw model_error("bench elastic: a run failed: " + r.error);
  if (r.faults.empty() || r.faults[0].recovered_at_s < 0)
    throw model_error("bench elastic: a run did not recover from the " + fault);
}

}  // namespace elastic_bench

namespace {

using namespace elastic_bench;
namespace fs = std::filesystem;
namespace fl = faultlab;

int run_bench_elastic_kill(const elastic_bench_options& o) {
  if (o.kill_step < 1 || o.steps < o.kill_step + 5)
    throw std::invalid_argument("--steps must leave at least 5 steps after --kill-step");
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch);
  auto scenario = [&](bool memory) {
    return rank3_fault(scratch, o, memory ? "in-memory" : "checkpoint-restart", memory ? "" : " --snapshot-every 0",
                       o.checkpoint_every, fl::action::kill);
  };
  std::mt19937_64 rng(1);
  std::fprintf(stderr, "bench elastic --kill: %d steps of 2x2 (lat=4ms), rank 3 killed after step %d, checkpoints "
                       "every %d steps; in-memory snapshots, then checkpoint-restart\n",
               o.steps, o.kill_step, o.checkpoint_every);
  const faultlab_run memory = run_train_scenario(scenario(true), true, rng, scratch / "memory");
  const faultlab_run restart = run_train_scenario(scenario(false), true, rng, scratch / "restart");
  for (const faultlab_run* r : {&memory, &restart}) require_recovered(*r, "kill");
  const double mem_lost = time_lost(memory, o.kill_step), restart_lost = time_lost(restart, o.kill_step);
  // The snapshots' price: the steps before the kill, with and without them.
  auto before_kill = [&](const faultlab_run& r) {
    return median(std::vector<double>(r.step_seconds.begin(), r.step_seconds.begin() + o.kill_step));
  };
  const double step_s = before_kill(memory), plain_step_s = before_kill(restart);
  const double ratio = mem_lost > 0 ? restart_lost / mem_lost : 0;
  const double worst = loss_diff(memory, restart);
  nlohmann::json j = {{"bench", "elastic-kill"},        {"steps", o.steps},
                      {"kill_step", o.kill_step},        {"checkpoint_every", o.checkpoint_every},
                      {"median_step_s", step_s},         {"median_step_without_snapshots_s", plain_step_s},
                      {"in_memory_lost_s", mem_lost},
                      {"checkpoint_restart_lost_s", restart_lost}, {"ratio", ratio},
                      {"max_loss_rel_diff", worst}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("in-memory snapshots: %.2f s lost (kill to the next new step, less a %.3f s step)\n", mem_lost, step_s);
    std::printf("checkpoint-restart:  %.2f s lost (the last checkpoint is %d step(s) old)\n", restart_lost,
                o.kill_step % o.checkpoint_every);
    std::printf("%.1fx less time lost; losses equal within %.1e relative; median step before the kill %.3f s with "
                "snapshots, %.3f s without\n",
                ratio, worst, step_s, plain_step_s);
  }
  return 0;
}

/// --hang, --lose and --stop: a job stuck, found by --hang-s (the rank's
/// watchdog, the coordinator's stall check, the launcher's look at the
/// rank processes) vs --timeout-s (or, for --stop, the peers' timeout).
int run_bench_elastic_stuck(const elastic_bench_options& o) {
  const char* name = o.hang ? "hang" : o.lose ? "lose" : "stop";
  const fl::action what = o.hang ? fl::action::hang : o.lose ? fl::action::lose : fl::action::stop;
  const char* checked = o.hang ? "watchdog" : o.lose ? "stall check" : "stopped check";
  if (o.kill_step < 1 || o.steps < o.kill_step + 5)
    throw std::invalid_argument("--steps must leave at least 5 steps after --kill-step");
  if (!(o.hang_s > 0) || !(o.baseline_timeout_s > 0))
    throw std::invalid_argument("--hang-s and --baseline-timeout-s must be positive");
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch);
  auto scenario = [&](bool watchdog) {
    char flags[96];
    if (watchdog)
      std::snprintf(flags, sizeof flags, " --hang-s %g", o.hang_s);
    else
      std::snprintf(flags, sizeof flags, " --hang-s 0 --timeout-s %g", o.baseline_timeout_s);
    return rank3_fault(scratch, o, watchdog ? "watchdog" : "timeout", flags, 0, what);
  };
  std::mt19937_64 rng(1);
  if (o.hang)
    std::fprintf(stderr, "bench elastic --hang: %d steps of 2x2 (lat=4ms), rank 3's stage hangs after step %d; found by "
                         "its watchdog (--hang-s %g), then by the coordinator's --timeout-s %g\n",
                 o.steps, o.kill_step, o.hang_s, o.baseline_timeout_s);
  else if (o.stop)
    std::fprintf(stderr, "bench elastic --stop: %d steps of 2x2 (lat=4ms), rank 3's process stopped (SIGSTOP) after "
                         "step %d; found by the launcher (--hang-s %g), then by the peers' link timeout (--hang-s 0 "
                         "--timeout-s %g)\n",
                 o.steps, o.kill_step, o.hang_s, o.baseline_timeout_s);
  else
    std::fprintf(stderr, "bench elastic --lose: %d steps of 2x2 (lat=4ms), rank 3 loses an activation after step %d; "
                         "found by the coordinator's stall check (--hang-s %g), then by its --timeout-s %g\n",
                 o.steps, o.kill_step, o.hang_s, o.baseline_timeout_s);
  const faultlab_run watched = run_train_scenario(scenario(true), true, rng, scratch / "watchdog");
  const faultlab_run timed = run_train_scenario(scenario(false), true, rng, scratch / "timeout");
  for (const faultlab_run* r : {&watched, &timed}) require_recovered(*r, name);
  const double watched_lost = time_lost(watched, o.kill_step), timed_lost = time_lost(timed, o.kill_step);
  const double ratio = watched_lost > 0 ? timed_lost / watched_lost : 0;
  const double worst = loss_diff(watched, timed);
  // Whom each run took for lost (the re-plan event's reason names it).
  auto blamed = [](const faultlab_run& r) { return r.faults[0].detected_by; };
  nlohmann::json j = {{"bench", std::string("elastic-") + name}, {"steps", o.steps},
                      {"fault_step", o.kill_step},    {"hang_s", o.hang_s},
                      {"baseline_timeout_s", o.baseline_timeout_s},
                      {"checked_lost_s", watched_lost}, {"timeout_lost_s", timed_lost},
                      {"ratio", ratio},              {"max_loss_rel_diff", worst},
                      {"checked_detected_by", blamed(watched)}, {"timeout_detected_by", blamed(timed)}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s (--hang-s %g):   %.2f s lost (%s)\n", checked, o.hang_s, watched_lost,
                blamed(watched).c_str());
    std::printf("no %s (--timeout-s %g): %.2f s lost (%s)\n", checked,
                o.baseline_timeout_s, timed_lost, blamed(timed).c_str());
    std::printf("%.1fx less time lost; losses equal within %.1e relative\n", ratio, worst);
  }
  return 0;
}

/// The median of the steps of `v` from `from` (1-based) on.
double median_from(const std::vector<double>& v, int from) {
  const std::size_t first = std::min(v.size(), static_cast<std::size_t>(std::max(0, from - 1)));
  return median(std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(first), v.end()));
}

/// --join's job in `scratch` (write_bench_job(join_model()), three.toml):
/// started on n0/0 alone; with `grow` a machine joins as n1/0 after
/// --join-step; `snapshots` keeps --elastic's in-memory snapshots (a drain
/// then goes through the ranks' memory), else --snapshot-every 0.
fl::scenario join_scenario(const elastic_bench_options& o, const fs::path& scratch, bool grow, bool snapshots) {
  fl::scenario s;
  s.name = grow ? "joined" : "fixed";
  fl::train_job j;
  j.model = (scratch / "model").string();
  j.data = (scratch / "tokens.bin").string();
  j.args = "--batch 16 --seq 64 --lr 0.003 --threads 1" + std::string(snapshots ? "" : " --snapshot-every 0") +
           " --steps " + std::to_string(o.steps) + " --join-check-every " + std::to_string(grow ? o.join_check_every : 0);
  j.layout = "--cluster " + (scratch / "three.toml").string() + " --standby n1/0,n2/0";
  j.elastic = true;
  j.checkpoint_every = 0;
  s.train = j;
  if (grow) {
    fl::fault f;
    f.at = {fl::moment::kind::step, static_cast<double>(o.join_step)};
    f.what = fl::action::join;
    f.as = "n1/0";
    s.faults = {f};
  }
  return s;
}

/// The longest wait between two steps' arrivals after step `after`.
double longest_wait_after(const faultlab_run& r, int after) {
  double w = 0;
  for (std::size_t i = static_cast<std::size_t>(std::max(1, after)); i < r.progress_s.size(); ++i)
    w = std::max(w, r.progress_s[i] - r.progress_s[i - 1]);
  return w;
}

int run_bench_elastic_drain(const elastic_bench_options& o) {
  if (o.steps < o.join_step + 10) throw std::invalid_argument("--steps must leave at least 10 steps after --join-step");
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch, join_model());
  std::ofstream(scratch / "three.toml") << join_cluster_toml();
  std::mt19937_64 rng(1);
  std::fprintf(stderr, "bench elastic --drain: %d steps on three-cores, n1/0 joins after step %d (checks every %d "
                       "steps); the drain through the ranks' memory, then through its checkpoint\n",
               o.steps, o.join_step, o.join_check_every);
  const faultlab_run memory = run_train_scenario(join_scenario(o, scratch, true, true), true, rng, scratch / "memory");
  const faultlab_run disk = run_train_scenario(join_scenario(o, scratch, true, false), true, rng, scratch / "disk");
  for (const faultlab_run* r : {&memory, &disk}) {
    if (!r->completed) throw model_error("bench elastic: a run failed: " + r->error);
    if (r->recoveries != 1) throw model_error("bench elastic --drain: a run re-planned " + std::to_string(r->recoveries) +
                                              " time(s), not once (the join did not pay?)");
  }
  const double worst = loss_diff(memory, disk);
  const double memory_s = longest_wait_after(memory, o.join_step), disk_s = longest_wait_after(disk, o.join_step);
  const double ratio = memory_s > 0 ? disk_s / memory_s : 0;
  nlohmann::json j = {{"bench", "elastic_drain"},  {"steps", o.steps},         {"join_step", o.join_step},
                      {"memory_switch_s", memory_s}, {"checkpoint_switch_s", disk_s}, {"ratio", ratio},
                      {"max_loss_rel_diff", worst}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("drain through the ranks' memory: the switch took %.3f s (longest wait between steps)\n", memory_s);
    std::printf("drain through its checkpoint:    the switch took %.3f s\n", disk_s);
    std::printf("%.2fx; losses equal within %.1e relative\n", ratio, worst);
  }
  return 0;
}

int run_bench_elastic_join(const elastic_bench_options& o) {
  if (o.steps < o.join_step + 10) throw std::invalid_argument("--steps must leave at least 10 steps after --join-step");
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch, join_model());
  std::ofstream(scratch / "three.toml") << join_cluster_toml();
  auto scenario = [&](bool grow) { return join_scenario(o, scratch, grow, false); };
  std::mt19937_64 rng(1);
  std::fprintf(stderr, "bench elastic --join: %d steps on three-cores with n1/0 and n2/0 on standby (n0/0 alone); "
                       "n1/0 joins after step %d (checks every %d steps), against the job that cannot grow\n",
               o.steps, o.join_step, o.join_check_every);
  const faultlab_run fixed = run_train_scenario(scenario(false), true, rng, scratch / "fixed");
  const faultlab_run grown = run_train_scenario(scenario(true), true, rng, scratch / "joined");
  for (const faultlab_run* r : {&fixed, &grown})
    if (!r->completed) throw model_error("bench elastic: a run failed: " + r->error);
  const double worst = loss_diff(fixed, grown);
  const int after = o.join_step + 1;
  const double fixed_after = sum_from(fixed.step_seconds, after), grown_after = sum_from(grown.step_seconds, after);
  const int tail_from = std::max(after, o.steps - 9);  // the last ten steps
  const double speedup = grown_after > 0 ? fixed_after / grown_after : 0;
  nlohmann::json j = {{"bench", "elastic_join"},
                      {"steps", o.steps},
                      {"join_step", o.join_step},
                      {"join_check_every", o.join_check_every},
                      {"fixed_s_after_join", fixed_after},
                      {"joined_s_after_join", grown_after},
                      {"speedup", speedup},
                      {"fixed_median_step_s", median_from(fixed.step_seconds, tail_from)},
                      {"joined_median_step_s", median_from(grown.step_seconds, tail_from)},
                      {"replans", grown.recoveries},
                      {"max_loss_rel_diff", worst}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("cannot grow (n0/0):  %.2f s for steps %d..%d, median of the last ten steps %.3f s\n", fixed_after,
                after, o.steps, median_from(fixed.step_seconds, tail_from));
    std::printf("n1/0 joins:          %.2f s for steps %d..%d, median of the last ten steps %.3f s (%d re-plan%s)\n",
                grown_after, after, o.steps, median_from(grown.step_seconds, tail_from), grown.recoveries,
                grown.recoveries == 1 ? "" : "s");
    std::printf("speedup after the join: %.2fx; losses equal within %.1e relative\n", speedup, worst);
  }
  return 0;
}

int run_bench_elastic(const elastic_bench_options& o) {
  if (int(o.kill) + int(o.join) + int(o.hang) + int(o.lose) + int(o.stop) + int(o.drain) + int(o.launcher) > 1)
    throw std::invalid_argument("bench elastic: one of --kill, --hang, --lose, --stop, --launcher, --join and --drain");
  if (o.drain) return run_bench_elastic_drain(o);
  if (o.launcher) return run_bench_elastic_launcher(o);
  if (o.kill) return run_bench_elastic_kill(o);
  if (o.hang || o.lose || o.stop) return run_bench_elastic_stuck(o);
  if (o.join) return run_bench_elastic_join(o);
  if (o.steps < o.throttle_step + 10)
    throw std::invalid_argument("--steps must leave at least 10 steps after --throttle-step");
  try {  // a bad profile would throttle nothing and report a meaningless speed-up
    net::parse_link_profile(o.profile);
  } catch (const std::exception& e) {
    throw std::invalid_argument("--profile '" + o.profile + "': " + e.what());
  }
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch);
  std::ofstream(scratch / "three.toml") << bench_cluster_toml();

  auto scenario = [&](bool probe) {
    fl::scenario s;
    s.name = probe ? "re-planned" : "static";
    fl::train_job j;
    j.model = (scratch / "model").string();
    j.data = (scratch / "tokens.bin").string();
    // No in-memory snapshots: their copies would share the throttled link
    // with the job, and this measures re-planning around it.
    j.args = "--batch 4 --seq 8 --lr 0.003 --threads 1 --snapshot-every 0 --steps " + std::to_string(o.steps) +
             (probe ? " --probe-every " + std::to_string(o.probe_every) : std::string());
    j.layout = "--cluster " + (scratch / "three.toml").string();
    j.elastic = true;
    j.checkpoint_every = 0;
    s.train = j;
    fl::fault f;
    f.at = {fl::moment::kind::step, static_cast<double>(o.throttle_step)};
    f.what = fl::action::throttle;
    f.whom = {fl::target::kind::rank, 1};
    f.profile = o.profile;
    s.faults = {f};
    return s;
  };
  std::mt19937_64 rng(1);
  std::fprintf(stderr, "bench elastic: %d steps on three-nodes (1x2 planned), rank 1 throttled to %s at step %d; "
                       "static plan, then --probe-every %d\n",
               o.steps, o.profile.c_str(), o.throttle_step, o.probe_every);
  const faultlab_run fixed = run_train_scenario(scenario(false), true, rng, scratch / "static");
  const faultlab_run moved = run_train_scenario(scenario(true), true, rng, scratch / "replanned");
  for (const faultlab_run* r : {&fixed, &moved})
    if (!r->completed) throw model_error("bench elastic: a run failed: " + r->error);
  const double worst = loss_diff(fixed, moved);
  const int after = o.throttle_step + 1;
  const double fixed_after = sum_from(fixed.step_seconds, after), moved_after = sum_from(moved.step_seconds, after);
  const int tail_from = std::max(after, o.steps - 10);  // the last ten steps: long after any re-plan
  auto tail = [tail_from](const std::vector<double>& v) {
    const std::size_t from = std::min(v.size(), static_cast<std::size_t>(tail_from - 1));
    return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end());
  };
  const std::vector<double> fixed_tail = tail(fixed.step_seconds), moved_tail = tail(moved.step_seconds);
  const double speedup = moved_after > 0 ? fixed_after / moved_after : 0;
  nlohmann::json j = {{"bench", "elastic"},
                      {"steps", o.steps},
                      {"throttle", o.profile},
                      {"throttle_step", o.throttle_step},
                      {"probe_every", o.probe_every},
                      {"static_s_after_throttle", fixed_after},
                      {"replanned_s_after_throttle", moved_after},
                      {"speedup", speedup},
                      {"static_median_step_s", median(fixed_tail)},
                      {"replanned_median_step_s", median(moved_tail)},
                      {"replans", moved.recoveries},
                      {"max_loss_rel_diff", worst}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("static plan:   %.2f s for steps %d..%d, median of the last ten steps %.3f s\n", fixed_after, after,
                o.steps, median(fixed_tail));
    std::printf("re-planned:    %.2f s for steps %d..%d, median of the last ten steps %.3f s (%d re-plan%s)\n",
                moved_after, after, o.steps, median(moved_tail), moved.recoveries, moved.recoveries == 1 ? "" : "s");
    std::printf("speedup after the throttle: %.2fx; losses equal within %.1e relative\n", speedup, worst);
  }
  return 0;
}

}  // namespace

void register_bench_elastic(CLI::App* bench, action_fn& action) {
  static elastic_bench_options o;
  auto* cmd = bench->add_subcommand(
      "elastic", "A rank's uplink throttled mid-run: the job re-planned on measured links vs the static plan");
  cmd->add_option("--steps", o.steps, "Steps of each run")->check(CLI::Range(14, 100000))->capture_default_str();
  cmd->add_option("--throttle-step", o.throttle_step, "Step after which rank 1 is throttled")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--probe-every", o.probe_every, "Probe period of the re-planned run")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--profile", o.profile, "What rank 1's sends are shaped to (net/shaping.hpp syntax)")
      ->capture_default_str();
  cmd->add_flag("--kill", o.kill,
                "The failure half instead: rank 3 of a 2x2 job killed, recovered from in-memory snapshots vs "
                "restarted from the last checkpoint");
  cmd->add_flag("--hang", o.hang,
                "Rank 3's stage hung inside a compute call with its node up: found by its watchdog vs by the "
                "coordinator's --timeout-s");
  cmd->add_flag("--lose", o.lose,
                "Rank 3 loses an activation on the way, every rank up: found by the coordinator's stall check vs "
                "by its --timeout-s");
  cmd->add_flag("--stop", o.stop,
                "Rank 3's process stopped (SIGSTOP): found by the launcher vs by the peers' link timeout");
  cmd->add_flag("--launcher", o.launcher,
                "The launcher (coordinator and scheduler) of a 2x2 job killed: a rank process takes over vs every "
                "rank dying with it and the job restarted from its last checkpoint");
  cmd->add_option("--hang-s", o.hang_s, "With --hang, --lose or --stop: the first run's --hang-s")
      ->check(finite_between(0, 604800))
      ->capture_default_str();
  cmd->add_option("--baseline-timeout-s", o.baseline_timeout_s,
                  "With --hang, --lose or --stop: the --timeout-s of the run with --hang-s 0")
      ->check(finite_between(0.001, 604800))
      ->capture_default_str();
  cmd->add_option("--kill-step", o.kill_step,
                  "With --kill, --hang, --lose, --stop or --launcher: the step after which rank 3 is killed, hangs, "
                  "loses a message or is stopped, or the launcher is killed")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "With --kill or --launcher: both runs' checkpoint period")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--join", o.join,
                "The growing half instead: a --cluster job started on one of three nodes (two on standby), a "
                "machine joining as n1/0, against the job that cannot grow");
  cmd->add_flag("--drain", o.drain,
                "The join's drain through the ranks' memory (in-memory snapshots) against through the drain "
                "step's checkpoint (--snapshot-every 0): the switch's time");
  cmd->add_option("--join-step", o.join_step, "With --join or --drain: the step after which the machine joins")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--join-check-every", o.join_check_every,
                  "With --join or --drain: the growing run's --join-check-every")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_bench_elastic(o); }; });
}

}  // namespace corolla::app
