// schedule/pipeline_sim.cpp — runs per-stage instruction lists on modelled
// durations: finds deadlocks and inconsistencies, measures the bubble.
//
// Stages are advanced one instruction at a time in any order; a stage stops
// at a receive whose message has not been sent yet. Because a link
// direction has a single sender that sends in program order, every time
// computed is independent of the order in which stages are advanced, and
// "no stage can advance while some are unfinished" is exactly a deadlock.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "schedule/pipeline.hpp"

namespace corolla::schedule {
namespace {

/// A message in flight: kind (activation or gradient), endpoints,
/// micro-batch and the receiver's chunk.
struct message_key {
  bool gradient;
  int from, to, micro_batch, chunk;
  auto operator<=>(const message_key&) const = default;
};

struct stage_state {
  std::size_t pc = 0;
  double t = 0;
  double dp_free = 0;
  double last_backward_start = 0;
  double last_backward_s = 0;
  int buckets = 0;
  std::set<std::pair<int, int>> forwarded, backwarded, in_flight;
};

double value_or_zero(const std::vector<double>& v, int i) {
  return i >= 0 && i < static_cast<int>(v.size()) ? v[i] : 0.0;
}

}  // namespace

simulation simulate(const pipeline_schedule& schedule, const pipeline_costs& costs) {
  const int p = schedule.stages;
  simulation out;
  out.peak_in_flight.assign(p, 0);
  out.busy_s.assign(p, 0.0);
  if (p < 1 || static_cast<int>(schedule.programs.size()) != p) {
    out.problem = "the schedule has " + std::to_string(schedule.programs.size()) + " programs for " +
                  std::to_string(p) + " stages";
    return out;
  }
  std::vector<stage_state> st(p);
  for (int i = 0; i < p; ++i)
    for (const auto& ins : schedule.programs[i])
      if (ins.op == pipeline_op::reduce_grads) ++st[i].buckets;

  std::map<message_key, double> arrivals;  // sent, not yet received
  std::set<message_key> received;
  std::map<std::pair<int, int>, double> link_free;
  auto link_time = [&](int from, int to) {
    int lo = std::min(from, to), hi = std::max(from, to);
    if (hi - lo == 1) return value_or_zero(costs.link_s, lo);
    return costs.wrap_link_s;  // last stage <-> stage 0 between chunks (or p = 1)
  };
  auto fail = [&](int stage, const instruction& ins, const std::string& what) {
    out.problem = "stage " + std::to_string(stage) + " at '" + describe(ins) + "': " + what;
    return out;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int i = 0; i < p; ++i) {
      stage_state& s = st[i];
      const auto& prog = schedule.programs[i];
      while (s.pc < prog.size()) {
        const instruction& ins = prog[s.pc];
        std::pair<int, int> unit{ins.micro_batch, ins.chunk};
        switch (ins.op) {
          case pipeline_op::load_micro_batch:
            s.t += costs.load_s;
            break;
          case pipeline_op::forward: {
            if (!s.forwarded.insert(unit).second) return fail(i, ins, "forward runs twice");
            double d = value_or_zero(costs.forward_s, i);
            s.t += d;
            out.busy_s[i] += d;
            s.in_flight.insert(unit);
            out.peak_in_flight[i] = std::max(out.peak_in_flight[i], static_cast<int>(s.in_flight.size()));
            break;
          }
          case pipeline_op::backward: {
            if (!s.forwarded.count(unit)) return fail(i, ins, "backward before its forward");
            if (!s.backwarded.insert(unit).second) return fail(i, ins, "backward runs twice");
            double d = value_or_zero(costs.backward_s, i);
            s.last_backward_start = s.t;
            s.last_backward_s = d;
            s.t += d;
            out.busy_s[i] += d;
            out.pipeline_s = std::max(out.pipeline_s, s.t);
            s.in_flight.erase(unit);
            break;
          }
          case pipeline_op::send_act:
          case pipeline_op::send_grad: {
            bool grad = ins.op == pipeline_op::send_grad;
            if (ins.peer < 0 || ins.peer >= p) return fail(i, ins, "no such peer stage");
            // The receiver's chunk: crossing from the last stage to stage 0
            // moves an activation to the next chunk; the other way a gradient
            // to the previous one.
            int chunk = ins.chunk;
            if (!grad && i == p - 1 && schedule.chunks > 1) ++chunk;
            if (grad && i == 0 && schedule.chunks > 1) --chunk;
            message_key key{grad, i, ins.peer, ins.micro_batch, chunk};
            if (arrivals.count(key) || received.count(key)) return fail(i, ins, "the same message is sent twice");
            double& free = link_free[{i, ins.peer}];
            double start = std::max(s.t, free);
            free = start + link_time(i, ins.peer);
            arrivals[key] = free;
            break;
          }
          case pipeline_op::recv_act:
          case pipeline_op::recv_grad: {
            message_key key{ins.op == pipeline_op::recv_grad, ins.peer, i, ins.micro_batch, ins.chunk};
            auto it = arrivals.find(key);
            if (it == arrivals.end()) goto blocked;
            s.t = std::max(s.t, it->second);
            received.insert(key);
            arrivals.erase(it);
            break;
          }
          case pipeline_op::reduce_grads: {
            // Bucket b is complete once (b+1)/n of the last backward is done.
            double ready = s.last_backward_start + (ins.bucket + 1.0) / std::max(1, s.buckets) * s.last_backward_s;
            double start = std::max(ready, s.dp_free);
            s.dp_free = start + value_or_zero(costs.reduce_s, i) / std::max(1, s.buckets);
            break;
          }
          case pipeline_op::optimizer_step:
            s.t = std::max(s.t, s.dp_free) + value_or_zero(costs.optimizer_s, i);
            break;
        }
        ++s.pc;
        progress = true;
        out.makespan_s = std::max(out.makespan_s, std::max(s.t, s.dp_free));
      }
    blocked:;
    }
  }

  std::string waiting;
  for (int i = 0; i < p; ++i)
    if (st[i].pc < schedule.programs[i].size())
      waiting += (waiting.empty() ? "" : "; ") + std::string("stage ") + std::to_string(i) + " waits at #" +
                 std::to_string(st[i].pc) + " '" + describe(schedule.programs[i][st[i].pc]) + "'";
  if (!waiting.empty()) {
    out.problem = "deadlock: " + waiting;
    return out;
  }
  if (!arrivals.empty()) {
    const message_key& k = arrivals.begin()->first;
    out.problem = "stage " + std::to_string(k.from) + " sends " + (k.gradient ? "a gradient" : "an activation") +
                  " of micro-batch " + std::to_string(k.micro_batch) + " that stage " + std::to_string(k.to) +
                  " never receives";
    return out;
  }
  for (int i = 0; i < p; ++i) {
    std::size_t expected = static_cast<std::size_t>(schedule.micro_batches) * schedule.chunks;
    if (st[i].forwarded.size() != expected || st[i].backwarded.size() != expected) {
      out.problem = "stage " + std::to_string(i) + " runs " + std::to_string(st[i].forwarded.size()) + " forwards and " +
                    std::to_string(st[i].backwarded.size()) + " backwards; expected " + std::to_string(expected) +
                    " of each";
      return out;
    }
  }
  out.completed = true;
  double busy = 0;
  for (double b : out.busy_s) busy += b;
  out.bubble_fraction = out.pipeline_s > 0 ? 1.0 - busy / (p * out.pipeline_s) : 0.0;
  return out;
}

}  // namespace corolla::schedule
