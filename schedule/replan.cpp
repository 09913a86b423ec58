// The elastic scheduler's decision on measured links (schedule/replan.hpp).
#include "schedule/replan.hpp"

#include <cmath>
#include <cstdio>
#include <utility>

#include "schedule/migration.hpp"

namespace corolla::schedule {

namespace {

std::string mbit(double bytes_per_s) {
  char buf[48];
  if (!std::isfinite(bytes_per_s))
    std::snprintf(buf, sizeof buf, "unbounded");
  else
    std::snprintf(buf, sizeof buf, "%.3g Mbit/s", bytes_per_s * 8 / 1e6);
  return buf;
}

bool same_layout(const plan& a, const plan& b) {
  if (a.pp != b.pp || a.dp != b.dp || a.micro_batch != b.micro_batch || a.stages.size() != b.stages.size())
    return false;
  for (std::size_t i = 0; i < a.stages.size(); ++i)
    if (a.stages[i].first_layer != b.stages[i].first_layer || a.stages[i].last_layer != b.stages[i].last_layer ||
        a.stages[i].workers != b.stages[i].workers)
      return false;
  return true;
}

enum class verdict { same, slower, back };

/// What measurement `x` says about its link in `c` (`rule`: `c` without
/// measured links).
verdict judge(const cluster_description& c, const cluster_description& rule, const link_measurement& x,
              const replan_policy& policy) {
  const std::string& a = c.workers[static_cast<std::size_t>(x.from)].name;
  const std::string& b = c.workers[static_cast<std::size_t>(x.to)].name;
  const link_spec planned = rule.link_between(x.from, x.to);
  const auto it = c.measured.find({a, b});
  if (x.bandwidth > 0 && x.bandwidth < policy.slower * planned.bandwidth) {
    // A small wobble of a link already measured slow is not a change.
    const bool changed = it == c.measured.end() ||
                         std::abs(it->second.bandwidth - x.bandwidth) > (1 - policy.slower) * it->second.bandwidth;
    return changed ? verdict::slower : verdict::same;
  }
  return it != c.measured.end() ? verdict::back : verdict::same;
}

bool valid(const cluster_description& c, const link_measurement& x) {
  return x.from != x.to && x.from >= 0 && x.to >= 0 && x.from < c.size() && x.to < c.size();
}

}  // namespace

std::vector<link_measurement> link_watch::sustained(const cluster_description& c, const std::vector<link_measurement>& m,
                                                    const replan_policy& policy) {
  cluster_description rule = c;
  rule.measured.clear();
  std::vector<link_measurement> out;
  for (const link_measurement& x : m) {
    if (!valid(c, x)) continue;
    std::string a = c.workers[static_cast<std::size_t>(x.from)].name;
    std::string b = c.workers[static_cast<std::size_t>(x.to)].name;
    if (b < a) std::swap(a, b);
    if (judge(c, rule, x, policy) == verdict::same) {
      streak_.erase({a, b});
      continue;
    }
    if (++streak_[{a, b}] < policy.confirmations) continue;
    streak_.erase({a, b});
    out.push_back(x);
  }
  return out;
}

cluster_description with_measurements(const cluster_description& c, const std::vector<link_measurement>& m,
                                       const replan_policy& policy, std::vector<std::string>* changes) {
  cluster_description out = c;
  cluster_description rule = c;
  rule.measured.clear();
  for (const link_measurement& x : m) {
    if (!valid(c, x)) continue;
    const std::string& a = c.workers[static_cast<std::size_t>(x.from)].name;
    const std::string& b = c.workers[static_cast<std::size_t>(x.to)].name;
    const link_spec planned = rule.link_between(x.from, x.to);
    const verdict v = judge(out, rule, x, policy);
    if (v == verdict::slower) {
      const link_spec seen{x.bandwidth, planned.latency};
      out.measured[{a, b}] = seen;
      out.measured[{b, a}] = seen;
      if (changes)
        changes->push_back(a + " <-> " + b + ": " + mbit(x.bandwidth) + " measured, " + mbit(planned.bandwidth) +
                           " planned");
    } else if (v == verdict::back) {
      out.measured.erase({a, b});
      out.measured.erase({b, a});
      if (changes)
        changes->push_back(a + " <-> " + b + ": " +
                           (x.bandwidth > 0 ? mbit(x.bandwidth) + " measured" : std::string("too fast to measure")) +
                           ", back to the planned " + mbit(planned.bandwidth));
    }
  }
  return out;
}

replan_advice advise_replan(const cluster_description& measured, const plan& current, const model_config& cfg,
                            const training_setup& setup, long steps_left, double switch_s, const replan_policy& policy) {
  replan_advice a;
  training_setup running = setup;
  running.micro_batch = current.micro_batch > 0 ? current.micro_batch : setup.micro_batch;
  running.pp = current.pp;
  running.dp = current.dp;
  const plan priced =
      price_layout(measured, compute_costs(cfg, running), running, current.layout(), current.strategy);
  a.current_s = priced.step_s();
  training_setup free = setup;
  free.pp = 0;
  free.dp = 0;
  a.next = make_plan(measured, cfg, free).best;
  a.next_s = a.next.step_s();
  char buf[256];
  if (!a.next.feasible) {
    a.why = "no feasible plan on the measured links: " + a.next.reason;
    return a;
  }
  if (same_layout(a.next, current)) {
    std::snprintf(buf, sizeof buf, "the running layout is still the best (%.3g s per step)", a.current_s);
    a.why = buf;
    return a;
  }
  a.move = migration_pays_off(a.current_s, a.next_s, switch_s, steps_left, policy.margin);
  std::snprintf(buf, sizeof buf, "predicted %.3g s per step as running, %.3g s re-planned; %ld step(s) left, "
                "a switch costs about %.3g s: %s",
                a.current_s, a.next_s, steps_left, switch_s, a.move ? "moving pays off" : "staying");
  a.why = buf;
  return a;
}

}  // namespace corolla::schedule
