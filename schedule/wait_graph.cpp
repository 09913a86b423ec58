// schedule/wait_graph.cpp — see schedule/wait_graph.hpp.
#include "schedule/wait_graph.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace corolla::schedule {

namespace {

enum class state { silent, moving, frozen };

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

struct graph {
  const std::vector<party_wait>& coordinator;
  const std::function<std::string(int)>& label;
  std::map<int, state> states;
  std::map<int, const rank_activity*> now;

  std::string name(int party) const { return party == from_coordinator ? "the coordinator" : label(party); }

  /// The waits of `party` that point at a known party (its edges).
  std::vector<const party_wait*> edges(int party) const {
    std::vector<const party_wait*> out;
    const std::vector<party_wait>* waits = nullptr;
    if (party == from_coordinator) {
      waits = &coordinator;
    } else {
      auto it = now.find(party);
      if (it == now.end() || states.at(party) != state::frozen) return out;
      waits = &it->second->waits;
    }
    for (const party_wait& w : *waits)
      if (w.from == from_coordinator || states.count(w.from)) out.push_back(&w);
    return out;
  }

  std::string waits_text(int party, const party_wait& w) const {
    return name(party) + " waits for " + w.what + " (" + seconds_text(w.seconds) + ")";
  }

  /// "rank 1 (...) waits for ... (4.1 s); the coordinator waits for ..."
  std::string waiters_of(int target) const {
    std::string out;
    int shown = 0;
    auto add = [&](int party) {
      for (const party_wait* w : edges(party))
        if (w->from == target && shown < 3) {
          out += (shown++ ? "; " : "") + waits_text(party, *w);
        }
    };
    add(from_coordinator);
    for (const auto& [r, s] : states) add(r);
    return out;
  }
};

}  // namespace

stall_verdict diagnose_stall(const std::vector<rank_activity>& before, const std::vector<rank_activity>& after,
                             const std::vector<party_wait>& coordinator, const std::function<std::string(int)>& label) {
  graph g{coordinator, label, {}, {}};
  std::map<int, const rank_activity*> then;
  for (const rank_activity& a : before) then[a.rank] = &a;
  for (const rank_activity& a : after) {
    g.now[a.rank] = &a;
    auto b = then.find(a.rank);
    if (!a.answered || b == then.end() || !b->second->answered)
      g.states[a.rank] = state::silent;
    else if (!a.computing.empty() || a.progress != b->second->progress)
      g.states[a.rank] = state::moving;
    else
      g.states[a.rank] = state::frozen;
  }

  // Every party the coordinator waits on, directly or through others.
  std::vector<int> order;  // depth-first, from the coordinator
  std::set<int> seen{from_coordinator};
  std::vector<int> todo{from_coordinator};
  while (!todo.empty()) {
    const int p = todo.back();
    todo.pop_back();
    order.push_back(p);
    for (const party_wait* w : g.edges(p))
      if (seen.insert(w->from).second) todo.push_back(w->from);
  }
  std::vector<int> silent, moving, frozen_ends;
  for (int p : order) {
    if (p == from_coordinator) continue;
    const state s = g.states.at(p);
    if (s == state::silent) silent.push_back(p);
    if (s == state::moving) moving.push_back(p);
    if (s == state::frozen && g.edges(p).empty()) frozen_ends.push_back(p);
  }

  stall_verdict v;
  // Work still moves somewhere on the paths: slow, not stuck (yet).
  if (!moving.empty() || coordinator.empty()) {
    v.what = stall_verdict::kind::progressing;
    v.ranks = moving;
    return v;
  }
  if (!silent.empty()) {
    v.what = stall_verdict::kind::silent;
    v.ranks = silent;
    std::sort(v.ranks.begin(), v.ranks.end());
    for (int r : v.ranks) {
      if (!v.reason.empty()) v.reason += "; ";
      v.reason += label(r) + " does not answer while its node is up";
      if (const std::string w = g.waiters_of(r); !w.empty()) v.reason += " (" + w + ")";
    }
    return v;
  }
  if (!frozen_ends.empty()) {
    v.what = stall_verdict::kind::frozen;
    v.ranks = frozen_ends;
    std::sort(v.ranks.begin(), v.ranks.end());
    for (int r : v.ranks) {
      if (!v.reason.empty()) v.reason += "; ";
      const rank_activity& a = *g.now.at(r);
      v.reason += label(r) + " makes no progress: ";
      if (a.waits.empty()) {
        v.reason += "it neither computes nor waits for a message";
      } else {
        v.reason += "it waits only for ";
        for (std::size_t i = 0; i < a.waits.size(); ++i)
          v.reason += (i ? ", " : "") + a.waits[i].what + " (" + seconds_text(a.waits[i].seconds) + ")";
      }
      if (const std::string w = g.waiters_of(r); !w.empty()) v.reason += " (" + w + ")";
    }
    return v;
  }

  // Every party reached waits on another: there is a cycle. Walk from the
  // coordinator along first edges until a party repeats.
  std::vector<int> path;
  std::vector<const party_wait*> via;
  std::map<int, std::size_t> at;
  int p = from_coordinator;
  while (!at.count(p)) {
    at[p] = path.size();
    path.push_back(p);
    const auto e = g.edges(p);
    if (e.empty()) break;  // cannot happen: every reached party has an edge
    // Prefer an edge back into the path: the shortest cycle from here.
    const party_wait* next = e.front();
    for (const party_wait* w : e)
      if (at.count(w->from)) {
        next = w;
        break;
      }
    via.push_back(next);
    p = next->from;
  }
  v.what = stall_verdict::kind::deadlock;
  const std::size_t start = at.count(p) ? at.at(p) : 0;
  v.reason = "the job is deadlocked: ";
  for (std::size_t i = start; i < path.size() && i < via.size(); ++i) {
    v.ranks.push_back(path[i]);
    v.reason += (i > start ? "; " : "") + g.waits_text(path[i], *via[i]);
  }
  v.reason += ": a message on that cycle was lost or never sent";
  return v;
}

}  // namespace corolla::schedule
