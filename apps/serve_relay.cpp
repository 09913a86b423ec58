// How `corolla serve --no-listen` stays reachable (apps/serve_relay.hpp).
#include "apps/serve_relay.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/dialback.hpp"
#include "actors/link_probe.hpp"
#include "net/endpoint.hpp"
#include "net/membership.hpp"

namespace corolla::app {

bool reachable_from_swarm(node& n, net::membership& members, const std::string& model, int n_blocks,
                          const std::string& endpoint) {
  int asked = 0;
  for (const auto& r : members.get_span(model, 0, n_blocks)) {
    if (!r.relay_service || !r.relay.empty() || r.endpoint.empty() || r.node_id == n.id() ||
        r.state != server_state::online)
      continue;
    if (++asked > 3) break;
    connect_options co;
    co.timeout = std::chrono::seconds(3);
    co.server_key = r.public_key;
    const bool linked = n.peer_is_up(r.node_id);
    if (!linked)
      if (auto c = n.connect(r.endpoint, co); !c) {
        spdlog::debug("serve: cannot reach {} to ask for a dial-back: {}", r.node_id, error_message(c.error()));
        continue;
      }
    auto verdict = request_dialback(n, r.node_id, endpoint);
    // A link opened only to ask goes again: the check leaves the links as it
    // found them (later links, e.g. for measuring, are set up as usual).
    if (!linked) n.disconnect(r.node_id);
    if (!verdict) {
      spdlog::info("serve: {} did not dial back: {}", r.node_id, error_message(verdict.error()));
      continue;
    }
    if (verdict->reached) {
      spdlog::info("serve: reachable at {} ({} dialled back)", endpoint, r.node_id);
      return true;
    }
    spdlog::warn("serve: {} could not dial back {} ({}): this server uses a relay", r.node_id, endpoint,
                 verdict->reason);
    return false;
  }
  spdlog::info("serve: no server of the swarm could check that {} is reachable yet: assuming it is", endpoint);
  return true;
}

std::pair<std::string, std::string> given_relay(const std::string& entry) {
  const auto hash = entry.find('#');
  std::string endpoint = entry.substr(0, hash);
  if (endpoint.find("://") == std::string::npos) endpoint = "tcp://" + endpoint;
  if (const std::string why = net::tcp_endpoint_problem(endpoint); !why.empty())
    throw std::invalid_argument("--relay " + entry + ": " + why);
  return {endpoint, hash == std::string::npos ? "" : entry.substr(hash + 1)};
}

relay_keeper::relay_keeper(node& n, std::vector<std::string> relays, net::membership* members, std::string model,
                           int n_blocks)
    : n_(n), given_(std::move(relays)), members_(members), model_(std::move(model)), n_blocks_(n_blocks) {}

relay_keeper::offers relay_keeper::candidates() const {
  offers o;
  std::vector<candidate>& out = o.relays;
  for (const auto& g : given_) {  // serve checked them (given_relay) before it started
    auto [endpoint, key] = given_relay(g);
    out.push_back({std::move(endpoint), std::move(key), ""});
  }
  if (members_) {
    std::vector<candidate> offered;
    for (const auto& r : members_->get_span(model_, 0, n_blocks_)) {
      // A relay passes on every step of every server behind it.
      if (!r.relay.empty() && r.node_id != n_.id() && r.state != server_state::offline) ++o.carried[r.relay];
      if (r.relay_service && r.relay.empty() && !r.endpoint.empty() && r.node_id != n_.id() &&
          r.state == server_state::online &&
          std::none_of(offered.begin(), offered.end(), [&](const candidate& c) { return c.id == r.node_id; }))
        offered.push_back({r.endpoint, r.public_key, r.node_id});
    }
    out.insert(out.end(), offered.begin(), offered.end());
  }
  // Relays that went away are tried last (a restarted one may answer again).
  std::stable_partition(out.begin(), out.end(), [&](const candidate& c) { return !failed_.count(c.endpoint); });
  return o;
}

bool relay_keeper::keep(net::server_record& record, std::chrono::milliseconds grace) {
  const auto now = std::chrono::steady_clock::now();
  if (!relay_id_.empty()) {
    if (n_.peer_is_up(relay_id_)) {
      down_ = false;
      return false;
    }
    if (!down_) {
      down_ = true;
      down_since_ = now;
    }
    if (now - down_since_ < grace) return false;
    spdlog::warn("serve: relay {} at {} has been down for {} ms: looking for another", relay_id_, endpoint_,
                 std::chrono::duration_cast<std::chrono::milliseconds>(now - down_since_).count());
    failed_.insert(endpoint_);
    n_.disconnect(relay_id_);
    relay_id_.clear();
  }
  // Of the first few relays that answer, the nearest: a relay's leg is on
  // every step of every client routed through this server. Relays that
  // went away are asked only when no other answers.
  struct answered {
    candidate c;
    std::string id;
    double rtt_s = 0;  ///< +inf when the echo failed
  };
  std::set<std::string> linked_before;
  for (const link_stats& l : n_.links())
    if (l.up) linked_before.insert(l.peer);
  std::vector<answered> found;
  const offers offered = candidates();
  for (const auto& c : offered.relays) {
    if (found.size() >= measured_candidates || (!found.empty() && failed_.count(c.endpoint))) break;
    connect_options co;
    co.timeout = std::chrono::seconds(3);
    co.server_key = c.key;
    auto id = !c.id.empty() && n_.peer_is_up(c.id) ? caf::expected<std::string>(c.id) : n_.connect(c.endpoint, co);
    if (!id) {
      spdlog::debug("serve: relay candidate {} did not answer: {}", c.endpoint, error_message(id.error()));
      continue;
    }
    if (std::any_of(found.begin(), found.end(), [&](const answered& a) { return a.id == *id; })) continue;
    auto rtt = echo_rtt(n_, *id);
    if (!rtt) spdlog::debug("serve: relay candidate {} did not echo: {}", *id, error_message(rtt.error()));
    found.push_back({c, *id, rtt ? *rtt : std::numeric_limits<double>::infinity()});
  }
  if (found.empty()) return false;
  // Relays not clearly farther than the nearest (under twice its round
  // trip, or within a millisecond of it: echoes on one host differ by noise
  // alone) are alike; of those the one carrying the fewest servers, the
  // first to answer when tied (the order given: --relay, then the DHT's).
  double nearest = std::numeric_limits<double>::infinity();
  for (const answered& a : found) nearest = std::min(nearest, a.rtt_s);
  const auto alike = [&](const answered& a) { return a.rtt_s <= std::max(2 * nearest, nearest + 1e-3); };
  const auto carried = [&](const answered& a) {
    auto it = offered.carried.find(a.id);
    return it == offered.carried.end() ? 0 : it->second;
  };
  auto best = std::find_if(found.begin(), found.end(), alike);
  for (auto a = best + 1; a != found.end(); ++a)
    if (alike(*a) && carried(*a) < carried(*best)) best = a;
  if (found.size() > 1) {
    std::string seen;
    for (const answered& a : found)
      seen += (seen.empty() ? "" : ", ") + a.id + " " +
              (std::isfinite(a.rtt_s) ? std::to_string(static_cast<long>(a.rtt_s * 1e6)) + " us" : "no echo") +
              (carried(a) > 0 ? " carrying " + std::to_string(carried(a)) : "");
    const bool first_alike = alike(found.front());
    spdlog::info("serve: relays answered ({}): taking {}{}", seen, best->id,
                 best == found.begin() ? ", the first"
                 : !first_alike        ? ", clearly the nearest"
                                       : ", the one carrying the fewest servers");
  }
  // Links opened only to measure go again.
  for (const answered& a : found)
    if (a.id != best->id && !linked_before.count(a.id)) n_.disconnect(a.id);
  relay_id_ = best->id;
  n_.accept_relayed_from(relay_id_);
  endpoint_ = best->c.endpoint;
  key_ = best->c.key;
  down_ = false;
  failed_.erase(endpoint_);
  record.endpoint = endpoint_;
  record.public_key = key_;
  record.relay = relay_id_;
  spdlog::info("serve: reachable through relay {} at {}", relay_id_, endpoint_);
  return true;
}

}  // namespace corolla::app
