// apps/train_step_lines.cpp — a distributed job's step lines and progress bar
// (apps/train_step_lines.hpp).
#include "apps/train_step_lines.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/train_args.hpp"
#include "model/trainer.hpp"

namespace corolla::app {

namespace {

/// Tokens a second of a step of `batch` x `seq` tokens that took `seconds`
/// (0 when it took no measurable time).
double step_tokens_per_s(int batch, int seq, double seconds) {
  return seconds > 0 ? static_cast<double>(batch) * seq / seconds : 0.0;
}

}  // namespace

step_lines::step_lines(const train_args& a) : a_(a), bar_(!a.json) {}

void step_lines::step(const dist_train_options& o, const dist_step_report& r) {
  std::lock_guard lock(mu_);
  const double tokens_per_s = step_tokens_per_s(a_.batch, a_.seq, r.seconds);
  if (trainer::is_logged(r.step, a_.steps, a_.log_every)) {
    bar_.clear();
    if (a_.json) {
      // `seconds`: wall time since the previous step's report (the first
      // step's includes the ranks' start).
      nlohmann::json line = {{"step", r.step}, {"loss", r.loss}, {"seconds", r.seconds}, {"tokens_per_s", tokens_per_s}};
      const bool scaled = o.optimizer.loss_scale.dynamic;
      if (a_.grad_clip > 0.0f || scaled) line["grad_norm"] = r.grad_norm;
      if (scaled) add_loss_scale(line, r.loss_scale, r.skipped);
      // Data-parallel groups' reductions that ran side by side (--rings-at-once).
      if (r.rings_side_by_side > 0) line["rings_side_by_side"] = r.rings_side_by_side;
      if (r.updates_side_by_side > 0) line["updates_side_by_side"] = r.updates_side_by_side;
      if (!r.links.empty()) {  // --probe-every: what the ranks measured
        nlohmann::json links = nlohmann::json::array();
        for (const auto& l : r.links) links.push_back({{"from", l.from}, {"to", l.to}, {"bytes_per_s", l.bandwidth}});
        line["links"] = links;
        line["compute_s"] = r.compute_s;  // each rank's seconds in forward and backward
      }
      std::printf("%s\n", line.dump().c_str());
    } else {
      std::printf("step %d loss %.6f%s\n", r.step, r.loss, skipped_note(r.skipped, r.loss_scale).c_str());
    }
    std::fflush(stdout);
  }
  bar_.draw_step(r.step, a_.steps, r.loss, tokens_per_s);
}

void step_lines::clear() {
  std::lock_guard lock(mu_);
  bar_.clear();
}

void step_lines::finish() {
  std::lock_guard lock(mu_);
  bar_.finish();
}

}  // namespace corolla::app
