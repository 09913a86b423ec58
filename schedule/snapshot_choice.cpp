// schedule/snapshot_choice.cpp — see snapshot_choice.hpp.
#include "schedule/snapshot_choice.hpp"

#include <algorithm>

namespace corolla::schedule {

namespace {

/// Why the copies `chosen` do not make a whole step, or "".
std::string incomplete(const std::vector<const held_snapshot*>& chosen, const std::vector<std::string>& buckets) {
  for (const std::string& b : buckets) {
    if (std::none_of(chosen.begin(), chosen.end(), [&](const held_snapshot* s) { return s->params.count(b) > 0; }))
      return "no snapshot holds the parameters of " + b;
    std::vector<value_range> pieces;
    for (const held_snapshot* s : chosen)
      if (const auto it = s->moments.find(b); it != s->moments.end()) pieces.push_back(it->second);
    std::sort(pieces.begin(), pieces.end(), starts_before);
    const tiling t = check_tiling(pieces);
    if (t.bad < pieces.size())
      return "the snapshots' moment shards of " + b + " do not tile its values ([" + std::to_string(pieces[t.bad].lo) +
             ", " + std::to_string(pieces[t.bad].hi) + ") where [" + std::to_string(t.next) + ", ...) was due)";
    if (!t.tiles()) return "the snapshots hold values [0, " + std::to_string(t.next) + ") of the optimizer state of " + b;
  }
  return "";
}

}  // namespace

tiling check_tiling(const std::vector<value_range>& sorted) {
  tiling t;
  t.pieces = sorted.size();
  t.n = sorted.empty() ? 0 : sorted.front().n;
  for (t.bad = 0; t.bad < sorted.size(); ++t.bad) {
    const value_range& p = sorted[t.bad];
    if (p.n != t.n || p.lo != t.next) break;
    t.next = p.hi;
  }
  return t;
}

snapshot_choice choose_snapshot_step(const std::vector<held_snapshot>& held, int world,
                                     const std::vector<std::string>& buckets, std::int64_t newest,
                                     std::int64_t latest_checkpoint) {
  snapshot_choice out;
  // step -> owner -> its copies, the owner's own first.
  std::map<std::int64_t, std::map<int, std::vector<const held_snapshot*>>> by_step;
  for (const held_snapshot& s : held) {
    if (s.owner < 0 || s.owner >= world || s.step < 1) continue;
    auto& copies = by_step[s.step][s.owner];
    if (s.holder == s.owner)
      copies.insert(copies.begin(), &s);
    else
      copies.push_back(&s);
  }
  if (by_step.empty()) {
    out.why_not = "no rank holds a snapshot";
    return out;
  }
  std::string why;
  auto note = [&](const std::string& w) { why += (why.empty() ? "" : "; ") + w; };
  for (auto it = by_step.rbegin(); it != by_step.rend(); ++it) {
    const std::int64_t step = it->first;
    if (newest >= 0 && step > newest) {
      note("step " + std::to_string(step) + ": after the last step printed, " + std::to_string(newest));
      continue;
    }
    if (step <= latest_checkpoint) {
      note("the checkpoint of step " + std::to_string(latest_checkpoint) + " is as new as any snapshot left");
      break;
    }
    std::string missing;
    for (int r = 0; r < world; ++r)
      if (!it->second.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (!missing.empty()) {
      note("step " + std::to_string(step) + ": no snapshot of rank(s) " + missing);
      continue;
    }
    std::vector<const held_snapshot*> chosen;
    for (const auto& [owner, copies] : it->second) chosen.push_back(copies.front());
    if (const std::string bad = incomplete(chosen, buckets); !bad.empty()) {
      note("step " + std::to_string(step) + ": " + bad);
      continue;
    }
    out.step = step;
    for (const held_snapshot* s : chosen) out.source[s->owner] = s->holder;
    return out;
  }
  out.why_not = why;
  return out;
}

}  // namespace corolla::schedule
