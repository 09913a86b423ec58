// The elastic scheduler's decision on measured links and speeds (schedule/replan.hpp).
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

double nominal(const cluster_description& c, int worker) {
  const worker_spec& w = c.workers[static_cast<std::size_t>(worker)];
  const auto it = c.nominal_flops.find(w.name);
  return it != c.nominal_flops.end() ? it->second : w.flops;
}

/// measured / modeled of each usable measurement, and the fastest of them.
double fastest_ratio(const cluster_description& c, const std::vector<compute_measurement>& m) {
  double best = 0;
  for (const compute_measurement& x : m)
    if (x.worker >= 0 && x.worker < c.size() && x.seconds > 0 && x.modeled > 0) {
      const double r = x.seconds / x.modeled;
      if (best == 0 || r < best) best = r;
    }
  return best;
}

/// What compute measurement `x` says about its worker (`fastest`: the
/// fastest ratio of the same round).
verdict judge_compute(const cluster_description& c, const compute_measurement& x, double fastest,
                      const replan_policy& policy) {
  if (fastest <= 0 || x.worker < 0 || x.worker >= c.size() || x.seconds <= 0 || x.modeled <= 0) return verdict::same;
  const worker_spec& w = c.workers[static_cast<std::size_t>(x.worker)];
  const double ratio = x.seconds / x.modeled;
  const bool known = c.nominal_flops.count(w.name) > 0;
  if (ratio > policy.straggler * fastest) {
    const double flops = nominal(c, x.worker) * fastest / ratio;
    // A wobble of a straggler already measured is not a change.
    const bool changed = !known || std::abs(flops - w.flops) > (1 - policy.slower) * w.flops;
    return changed ? verdict::slower : verdict::same;
  }
  return known ? verdict::back : verdict::same;
}

}  // namespace

std::vector<compute_measurement> change_watch::sustained_compute(const cluster_description& c,
                                                       const std::vector<compute_measurement>& m,
                                                       const replan_policy& policy) {
  const double fastest = fastest_ratio(c, m);
  std::vector<compute_measurement> out;
  for (const compute_measurement& x : m) {
    if (x.worker < 0 || x.worker >= c.size()) continue;
    const std::pair<std::string, std::string> key{c.workers[static_cast<std::size_t>(x.worker)].name, ""};
    if (judge_compute(c, x, fastest, policy) == verdict::same) {
      streak_.erase(key);
      continue;
    }
    if (++streak_[key] < policy.confirmations) continue;
    streak_.erase(key);
    out.push_back(x);
  }
  // The fastest worker is the reference of the round: keep it in.
  if (!out.empty())
    for (const compute_measurement& x : m)
      if (x.seconds > 0 && x.modeled > 0 && x.seconds / x.modeled == fastest) {
        bool in = false;
        for (const auto& o : out) in = in || o.worker == x.worker;
        if (!in) out.push_back(x);
      }
  return out;
}

std::vector<compute_measurement> modeled_compute(const cluster_description& c, const plan& p) {
  std::vector<compute_measurement> out;
  for (const stage_plan& st : p.stages) {
    const double work = (st.cost.forward_s + st.cost.backward_s) * st.cost.flops_per_s * p.micro_batches;
    for (int w : st.workers)
      if (w >= 0 && w < c.size() && nominal(c, w) > 0) out.push_back({w, 0.0, work / nominal(c, w)});
  }
  return out;
}

cluster_description with_compute(const cluster_description& c, const std::vector<compute_measurement>& m,
                                 const replan_policy& policy, std::vector<std::string>* changes) {
  cluster_description out = c;
  const double fastest = fastest_ratio(c, m);
  std::string fastest_name;
  for (const compute_measurement& x : m)
    if (x.seconds > 0 && x.modeled > 0 && x.seconds / x.modeled == fastest)
      fastest_name = c.workers[static_cast<std::size_t>(x.worker)].name;
  for (const compute_measurement& x : m) {
    const verdict v = judge_compute(out, x, fastest, policy);
    if (v == verdict::same) continue;
    worker_spec& w = out.workers[static_cast<std::size_t>(x.worker)];
    const double file = nominal(out, x.worker);
    char buf[200];
    if (v == verdict::slower) {
      const double ratio = x.seconds / x.modeled / fastest;
      out.nominal_flops[w.name] = file;
      w.flops = file / ratio;
      std::snprintf(buf, sizeof buf, "%s computes %.3gx slower than %s (per the cost model): %.3g FLOP/s instead of %.3g",
                    w.name.c_str(), ratio, fastest_name.c_str(), w.flops, file);
    } else {
      out.nominal_flops.erase(w.name);
      w.flops = file;
      std::snprintf(buf, sizeof buf, "%s computes at its nominal %.3g FLOP/s again", w.name.c_str(), file);
    }
    if (changes) changes->push_back(buf);
  }
  return out;
}

std::vector<link_measurement> change_watch::sustained(const cluster_description& c, const std::vector<link_measurement>& m,
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
