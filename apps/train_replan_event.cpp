// apps/train_replan_event.cpp — see apps/train_replan_event.hpp.
#include "apps/train_replan_event.hpp"

#include <algorithm>
#include <cstdio>

namespace corolla::app {

namespace {

using clock_type = std::chrono::steady_clock;

/// `x` as %.3g.
std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

}  // namespace

std::string labels(const train_layout& l, const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + l.label(r);
  return s;
}

nlohmann::json replan_event::json(double seconds, bool completed) const {
  nlohmann::json j = {{"event", "replan"},       {"reason", reason},         {"lost_ranks", lost},
                      {"from", from},            {"to", to},                 {"ranks", ranks_left},
                      {"resume_from", resume_step}, {"replayed_steps", std::max(0, last_done - resume_step)},
                      {"bytes", bytes},          {"completed", completed}, {"from_memory", from_memory}};
  if (completed) j["seconds"] = seconds;
  if (!changes.empty()) {
    j["reason"] = cause;
    j["changes"] = changes;
    if (predicted_from_s > 0) j["predicted_step_s"] = {predicted_from_s, predicted_to_s};
  }
  return j;
}

void replan_event::print(const train_args& a, bool completed) const {
  const double seconds = std::chrono::duration<double>(clock_type::now() - failed_at).count();
  if (a.json) {
    std::printf("%s\n", json(seconds, completed).dump().c_str());
  } else if (!changes.empty()) {
    std::string changed;
    for (const std::string& l : changes) changed += (changed.empty() ? "" : "; ") + l;
    const std::string predicted =
        predicted_from_s > 0 ? ", predicted " + fmt(predicted_from_s) + " s -> " + fmt(predicted_to_s) + " s per step"
                             : std::string();
    std::printf("replan: %s; %s -> %s%s; stopped after step %d, %d step(s) replayed, %.3g MB moved %s", changed.c_str(),
                from.c_str(), to.c_str(), predicted.c_str(), last_done, std::max(0, last_done - resume_step), bytes / 1e6,
                from_memory ? "from the drained ranks' memory" : "through the drain's checkpoint");
    if (completed)
      std::printf("; next step done %.2f s after the drain\n", seconds);
    else
      std::printf("; failed before its first step\n");
  } else {
    std::printf("replan: lost %s (%s); %s -> %s, %d %s left; continued from %s, %d step(s) replayed, %.3g MB read",
                lost_labels.c_str(), reason.c_str(), from.c_str(), to.c_str(), ranks_left, left_unit.c_str(),
                resume_step == 0 ? "the start"
                : from_memory   ? ("the survivors' in-memory snapshots of step " + std::to_string(resume_step)).c_str()
                                : ("the checkpoint of step " + std::to_string(resume_step)).c_str(),
                std::max(0, last_done - resume_step), bytes / 1e6);
    if (completed)
      std::printf("; next step done %.2f s after the failure\n", seconds);
    else
      std::printf("; failed again before its first step\n");
  }
  std::fflush(stdout);
}

}  // namespace corolla::app
