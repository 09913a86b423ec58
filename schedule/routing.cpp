// schedule/routing.cpp — min-latency (Dijkstra) and max-throughput routes.
#include "schedule/routing.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>

namespace corolla::swarm {

std::string to_string(const route& r) {
  std::string out;
  for (const auto& h : r.hops) {
    if (!out.empty()) out += " -> ";
    out += to_string(h.span()) + " via " + h.server;
    if (!h.cache_ok) out += " (short of cache)";
  }
  return out.empty() ? std::string("(empty route)") : out;
}

namespace {

schedule_error bad_argument(std::string message) {
  return schedule_error{schedule_errc::invalid_argument, -1, std::move(message)};
}

// The range a request names, checked against the model.
result<block_range> checked_range(const swarm_state& swarm, int start, int end) {
  if (auto e = validate(swarm)) return *e;
  const block_range r{start, end < 0 ? swarm.n_blocks : end};
  if (r.start < 0 || r.end > swarm.n_blocks || r.start > r.end)
    return bad_argument("route range " + to_string(r) + " is not inside [0, " + std::to_string(swarm.n_blocks) + ")");
  return r;
}

// The error for block b that no usable server holds, saying why.
schedule_error no_server(const swarm_state& swarm, int b, block_range range, const std::set<server_id>& excluded,
                         const std::function<bool(const server_record&)>& lacks_cache) {
  int online = 0, by_caller = 0, by_cache = 0;
  for (const auto& r : swarm.servers) {
    if (r.state != server_state::online || !r.span.contains(b)) continue;
    ++online;
    if (excluded.count(r.id)) ++by_caller;
    else if (lacks_cache(r)) ++by_cache;
  }
  std::string msg = "no usable server holds block " + std::to_string(b) + " of route " + to_string(range);
  if (online == 0) {
    msg += ": no ONLINE server holds it";
  } else {
    msg += ": of the " + std::to_string(online) + " ONLINE server(s) holding it, " + std::to_string(by_caller) +
           " excluded by the caller and " + std::to_string(by_cache) + " lacking cache for the session";
  }
  return schedule_error{schedule_errc::no_server_for_block, b, msg};
}

// Prices the edges of the routing graph. Every record of the swarm, usable
// or not, contributes its pings (an excluded upstream still measured them).
class edge_costs {
 public:
  edge_costs(const swarm_state& swarm, const route_request& req, const routing_params& p) : req_(req), p_(p) {
    for (const auto& r : swarm.servers) {
      pings_[r.id].push_back(&r.rtt_s);
      if (r.relayed) relayed_.insert(r.id);
    }
  }

  // One-way delay between two servers from the pings either of them announced.
  double between(const server_id& a, const server_id& b) const {
    if (a == b) return 0.0;
    if (auto rtt = announced(a, b)) return *rtt / 2;
    if (auto rtt = announced(b, a)) return *rtt / 2;
    return capped(p_.unknown_rtt_s) / 2;
  }
  // Entering the range at server s: from the upstream server or the client.
  double entry(const server_id& s) const {
    if (req_.upstream) return transfer(*req_.upstream, s);
    return client(s) + p_.hop_overhead_s + relay(s);
  }
  // Leaving the range from server s: to the downstream server or the client.
  double exit(const server_id& s) const {
    if (req_.downstream) return transfer(s, *req_.downstream);
    return client(s) + p_.hop_overhead_s + relay(s);
  }
  // Moving the hidden state from server a to server b (a message unless same process).
  double transfer(const server_id& a, const server_id& b) const {
    return a == b ? 0.0 : between(a, b) + p_.hop_overhead_s + relay(a) + relay(b);
  }
  double step(const server_record& r) const {
    return r.step_s_per_block > 0 ? r.step_s_per_block : p_.default_step_s_per_block;
  }
  bool lacks_cache(const server_record& r) const {
    return req_.session_tokens > 0 && r.cache_tokens_left >= 0 && req_.session_tokens > r.cache_tokens_left;
  }
  double penalty(const server_record& r) const { return lacks_cache(r) ? p_.cache_penalty_s : 0.0; }

 private:
  double capped(double rtt) const { return std::min(rtt, p_.max_rtt_s); }
  double relay(const server_id& s) const { return relayed_.count(s) ? p_.relay_penalty_s : 0.0; }
  double client(const server_id& s) const {
    auto it = req_.client_rtt_s.find(s);
    const double rtt = it != req_.client_rtt_s.end() && it->second >= 0 ? it->second : p_.unknown_rtt_s;
    return capped(rtt) / 2;  // NaN fails >= 0 above; +inf is capped
  }
  std::optional<double> announced(const server_id& from, const server_id& to) const {
    auto of = pings_.find(from);
    if (of == pings_.end()) return std::nullopt;
    for (const auto* pings : of->second) {
      auto it = pings->find(to);
      if (it != pings->end() && it->second >= 0) return capped(it->second);
    }
    return std::nullopt;
  }

  const route_request& req_;
  const routing_params& p_;
  // Every record's pings by server id (a server mid-move has several records).
  std::unordered_map<server_id, std::vector<const std::map<server_id, double>*>> pings_;
  std::set<server_id> relayed_;
};

// Groups consecutive blocks of one server into hops.
void append_block(std::vector<route_hop>& hops, const server_id& id, int b, bool cache_ok) {
  if (!hops.empty() && hops.back().server == id && hops.back().end == b) {
    hops.back().end = b + 1;
    hops.back().cache_ok = hops.back().cache_ok && cache_ok;
  } else {
    hops.push_back({id, b, b + 1, cache_ok});
  }
}

}  // namespace

result<route> min_latency_route(const swarm_state& swarm, const route_request& req, const routing_params& p) {
  auto range_or = checked_range(swarm, req.start, req.end);
  if (!range_or) return range_or.error();
  const block_range range = range_or.value();
  if (req.session_tokens < 0)
    return bad_argument("session needs " + std::to_string(req.session_tokens) + " cache tokens; must be >= 0");
  if (range.empty()) return route{};
  const edge_costs cost(swarm, req, p);

  // Usable records, in (id, start) order so ties resolve the same way always.
  std::vector<const server_record*> recs;
  for (const auto& r : swarm.servers)
    if (r.state == server_state::online && !req.excluded.count(r.id) &&
        !(p.exclude_without_cache && cost.lacks_cache(r)) && r.span.start < range.end && range.start < r.span.end)
      recs.push_back(&r);
  std::sort(recs.begin(), recs.end(), [](const server_record* a, const server_record* b) {
    return a->id != b->id ? a->id < b->id : a->span.start < b->span.start;
  });

  // holders[b - range.start]: records computing block b.
  std::vector<std::vector<int>> holders(range.length());
  for (int i = 0; i < static_cast<int>(recs.size()); ++i)
    for (int b = std::max(recs[i]->span.start, range.start); b < std::min(recs[i]->span.end, range.end); ++b)
      holders[b - range.start].push_back(i);
  for (int b = range.start; b < range.end; ++b)
    if (holders[b - range.start].empty())
      return no_server(swarm, b, range, req.excluded, [&](const server_record& r) { return cost.lacks_cache(r); });

  // Positions (i, b) for b in [lo_i, hi_i]: on record i, about to compute b
  // (b == hi_i: done with its part). Node 0 = source, 1 = sink.
  const int n_rec = static_cast<int>(recs.size());
  std::vector<int> lo(n_rec), hi(n_rec), base(n_rec);
  int n_nodes = 2;
  for (int i = 0; i < n_rec; ++i) {
    lo[i] = std::max(recs[i]->span.start, range.start);
    hi[i] = std::min(recs[i]->span.end, range.end);
    base[i] = n_nodes;
    n_nodes += hi[i] - lo[i] + 1;
  }
  auto node = [&](int i, int b) { return base[i] + (b - lo[i]); };
  std::vector<int> rec_of(n_nodes, -1), block_of(n_nodes, -1);
  for (int i = 0; i < n_rec; ++i)
    for (int b = lo[i]; b <= hi[i]; ++b) rec_of[node(i, b)] = i, block_of[node(i, b)] = b;

  // Dijkstra on the implicit graph. Costs include cache penalties; `time`
  // accumulates the real seconds of the same edges for the prediction.
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> dist(n_nodes, inf), time(n_nodes, 0.0);
  std::vector<int> prev(n_nodes, -1);
  using item = std::pair<double, int>;
  std::priority_queue<item, std::vector<item>, std::greater<>> queue;
  auto relax = [&](int from, int to, double seconds, double extra) {
    const double d = dist[from] + seconds + extra;
    if (d < dist[to]) {
      dist[to] = d;
      time[to] = time[from] + seconds;
      prev[to] = from;
      queue.push({d, to});
    }
  };
  // Hop costs per record pair, computed on first use: a dense swarm has many
  // more hop edges than record pairs, and each cost is a few string lookups.
  std::vector<double> hop_cost(static_cast<std::size_t>(n_rec) * n_rec, -1.0);
  auto hop = [&](int i, int j) {
    double& c = hop_cost[static_cast<std::size_t>(i) * n_rec + j];
    if (c < 0) c = cost.transfer(recs[i]->id, recs[j]->id);
    return c;
  };
  dist[0] = 0.0;
  queue.push({0.0, 0});
  while (!queue.empty()) {
    const auto [d, u] = queue.top();
    queue.pop();
    if (d > dist[u]) continue;
    if (u == 1) break;
    if (u == 0) {
      for (int i : holders[0]) relax(0, node(i, range.start), cost.entry(recs[i]->id), cost.penalty(*recs[i]));
      continue;
    }
    const int i = rec_of[u], b = block_of[u];
    if (b < hi[i]) relax(u, node(i, b + 1), cost.step(*recs[i]), 0.0);
    if (b == range.end) relax(u, 1, cost.exit(recs[i]->id), 0.0);
    if (b > range.start && b < range.end)
      for (int j : holders[b - range.start])
        if (j != i) {
          const bool same = recs[j]->id == recs[i]->id;  // another record of the same process
          relax(u, node(j, b), hop(i, j), same ? 0.0 : cost.penalty(*recs[j]));
        }
  }

  if (dist[1] == inf)  // unreachable only if the holder check above is wrong
    return schedule_error{schedule_errc::no_server_for_block, range.start,
                          "no chain of ONLINE servers covers " + to_string(range)};

  // Walk back: every step (i, b) -> (i, b+1) computes block b on record i.
  std::vector<int> path;
  for (int v = prev[1]; v > 1; v = prev[v]) path.push_back(v);
  std::reverse(path.begin(), path.end());
  route r;
  for (std::size_t k = 0; k + 1 < path.size(); ++k)
    if (rec_of[path[k]] == rec_of[path[k + 1]]) {
      const auto* rec = recs[rec_of[path[k]]];
      append_block(r.hops, rec->id, block_of[path[k]], !cost.lacks_cache(*rec));
    }
  r.latency_s = time[1];
  return r;
}

result<double> predicted_latency(const swarm_state& swarm, const std::vector<route_hop>& hops,
                                 const route_request& req, const routing_params& p) {
  auto range_or = checked_range(swarm, req.start, req.end);
  if (!range_or) return range_or.error();
  const block_range range = range_or.value();
  if (range.empty()) {
    if (hops.empty()) return 0.0;
    return bad_argument("hops given for the empty range " + to_string(range));
  }
  const edge_costs cost(swarm, req, p);
  double t = 0.0;
  int at = range.start;
  for (std::size_t k = 0; k < hops.size(); ++k) {
    const auto& h = hops[k];
    if (h.start != at || h.end <= h.start)
      return bad_argument("hop " + to_string(h.span()) + " via " + h.server + " does not continue at block " +
                          std::to_string(at));
    t += k == 0 ? cost.entry(h.server) : cost.transfer(hops[k - 1].server, h.server);
    for (int b = h.start; b < h.end; ++b) {
      const server_record* holder = nullptr;
      for (const auto& r : swarm.servers)
        if (r.id == h.server && r.state == server_state::online && r.span.contains(b)) holder = &r;
      if (!holder)
        return schedule_error{schedule_errc::unknown_server, b,
                              "server '" + h.server + "' has no ONLINE record holding block " + std::to_string(b)};
      t += cost.step(*holder);
    }
    at = h.end;
  }
  if (at != range.end)
    return bad_argument("the hops end at block " + std::to_string(at) + ", not at " + std::to_string(range.end));
  return t + cost.exit(hops.back().server);
}

result<route> max_throughput_route(const swarm_state& swarm, const throughput_route_request& req,
                                   std::mt19937_64& rng) {
  auto range_or = checked_range(swarm, req.start, req.end);
  if (!range_or) return range_or.error();
  const block_range range = range_or.value();

  std::vector<const server_record*> recs;
  for (const auto& r : swarm.servers)
    if (r.state == server_state::online && !req.excluded.count(r.id)) recs.push_back(&r);
  std::sort(recs.begin(), recs.end(), [](const server_record* a, const server_record* b) {
    return a->id != b->id ? a->id < b->id : a->span.start < b->span.start;
  });

  route out;
  int at = range.start;
  std::vector<const server_record*> candidates;
  while (at < range.end) {
    candidates.clear();
    double total = 0.0;
    for (const auto* r : recs)
      if (r->span.contains(at)) candidates.push_back(r), total += r->throughput;
    if (candidates.empty())
      return no_server(swarm, at, range, req.excluded, [](const server_record&) { return false; });
    // A uniform double in [0, 1) from the top 53 bits: unlike
    // std::uniform_real_distribution, the same on every standard library.
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const server_record* pick = candidates.back();
    if (total > 0) {
      // Rounding may leave u * total just above the last sum: fall back to
      // the last candidate that can be drawn at all.
      for (const auto* c : candidates)
        if (c->throughput > 0) pick = c;
      double acc = 0.0;
      for (const auto* c : candidates) {
        acc += c->throughput;
        if (c->throughput > 0 && u * total < acc) {
          pick = c;
          break;
        }
      }
    } else {
      pick = candidates[std::min(candidates.size() - 1, static_cast<std::size_t>(u * candidates.size()))];
    }
    const int end = std::min(pick->span.end, range.end);
    if (!out.hops.empty() && out.hops.back().server == pick->id) {
      out.hops.back().end = end;
    } else {
      out.hops.push_back({pick->id, at, end, true});
    }
    at = end;
  }
  return out;
}

}  // namespace corolla::swarm
