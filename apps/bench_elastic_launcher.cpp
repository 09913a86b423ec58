// corolla bench elastic --launcher — what a job that outlives its launcher
// saves. The 2x2 bench job (links of 4 ms) loses its launcher (the
// coordinator and the scheduler) to SIGKILL after --kill-step, twice in
// the same invocation: a rank process takes over and the job carries on in
// the same processes from their in-memory snapshots (--elastic's default,
// apps/launcher_takeover.hpp); and the way a job without that goes on:
// every rank dies with its launcher (torchrun's agent, a Megatron-LM or
// DeepSpeed launcher), and the job is started again at once, as a
// supervisor would, from its last checkpoint (every --checkpoint-every
// steps; from the start when there is none yet). The figure is the time
// lost: from the kill to the first step after the last one printed before
// it, less one median step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/train_store.hpp"
#include "apps/bench_elastic.hpp"
#include "apps/scratch_dir.hpp"
#include "model/error.hpp"

namespace corolla::app {

namespace {

namespace fs = std::filesystem;
namespace fl = faultlab;
using namespace elastic_bench;

/// The largest relative difference of two runs' losses over the steps
/// both printed.
double common_loss_diff(const faultlab_run& a, const faultlab_run& b) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i)
    if (a.losses[i] != 0 && b.losses[i] != 0)
      worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::max(1e-12, std::abs(a.losses[i])));
  return worst;
}

}  // namespace

int run_bench_elastic_launcher(const elastic_bench_options& o) {
  if (o.kill_step < 1 || o.steps < o.kill_step + 5)
    throw std::invalid_argument("--steps must leave at least 5 steps after --kill-step");
  const scratch_dir scratch_holder("corolla-bench-elastic");
  const fs::path& scratch = scratch_holder.path();
  write_bench_job(scratch);
  auto launcher_killed = [&](const std::string& name, const std::string& flags, int checkpoint_every) {
    fl::scenario s = rank3_fault(scratch, o, name, flags, checkpoint_every, fl::action::kill);
    s.faults[0].whom = {fl::target::kind::launcher, 0};
    return s;
  };
  // The restart's checkpoints stay where the job started again finds them.
  const fs::path checkpoints = scratch / "restart-checkpoints";
  const std::string restart_flags = " --snapshot-every 0 --checkpoint-dir " + checkpoints.string() +
                                    " --checkpoint-every " + std::to_string(o.checkpoint_every);
  std::mt19937_64 rng(1);
  std::fprintf(stderr,
               "bench elastic --launcher: %d steps of 2x2 (lat=4ms), the launcher killed after step %d, checkpoints "
               "every %d steps; a rank process takes over, then the job restarted from its last checkpoint\n",
               o.steps, o.kill_step, o.checkpoint_every);
  const faultlab_run took = run_train_scenario(launcher_killed("takeover", "", o.checkpoint_every), true, rng,
                                               scratch / "takeover");
  require_recovered(took, "launcher's death");
  const faultlab_run died = run_train_scenario(launcher_killed("restart", restart_flags, 0), true, rng,
                                               scratch / "restart");
  if (died.completed) throw model_error("bench elastic: the job without snapshots finished without its launcher");
  if (died.faults.empty() || died.faults[0].injected_at_s < 0)
    throw model_error("bench elastic: the restart run ended before its launcher was killed: " + died.error);
  const int printed = static_cast<int>(died.losses.size());
  const int resume = latest_checkpoint_step(checkpoints);
  fl::scenario again = rank3_fault(scratch, o, "restarted", restart_flags + (resume > 0 ? " --resume" : ""), 0,
                                   fl::action::kill);
  again.faults.clear();
  const faultlab_run restarted = run_train_scenario(again, true, rng, scratch / "restarted");
  if (!restarted.completed) throw model_error("bench elastic: the restarted job failed: " + restarted.error);
  // It prints steps resume+1 on: the first new one is printed+1.
  const std::size_t first_new = static_cast<std::size_t>(printed - resume);
  if (first_new >= restarted.progress_s.size())
    throw model_error("bench elastic: the restarted job printed no step after step " + std::to_string(printed));
  const double step_s =
      median(std::vector<double>(died.step_seconds.begin(),
                                 died.step_seconds.begin() + std::min<std::ptrdiff_t>(o.kill_step, died.step_seconds.size())));
  const double restart_lost =
      std::max(0.0, (died.seconds - died.faults[0].injected_at_s) + restarted.progress_s[first_new] - step_s);
  const double took_lost = time_lost(took, o.kill_step);
  const double ratio = took_lost > 0 ? restart_lost / took_lost : 0;
  const double worst = std::max(common_loss_diff(took, restarted), common_loss_diff(took, died));
  nlohmann::json j = {{"bench", "elastic-launcher"},   {"steps", o.steps},
                      {"kill_step", o.kill_step},       {"checkpoint_every", o.checkpoint_every},
                      {"median_step_s", step_s},        {"takeover_lost_s", took_lost},
                      {"restart_lost_s", restart_lost}, {"restart_from_step", resume},
                      {"ratio", ratio},                 {"max_loss_rel_diff", worst}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("a rank process takes over: %.2f s lost (kill to the next new step, less a %.3f s step)\n", took_lost,
                step_s);
    std::printf("restarted from %s: %.2f s lost (%d step(s) computed again)\n",
                resume > 0 ? ("the checkpoint of step " + std::to_string(resume)).c_str() : "the start", restart_lost,
                printed - resume);
    std::printf("%.1fx less time lost; losses equal within %.1e relative\n", ratio, worst);
  }
  return 0;
}

}  // namespace corolla::app
