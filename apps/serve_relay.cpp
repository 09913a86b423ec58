// How `corolla serve --no-listen` stays reachable (apps/serve_relay.hpp).
#include "apps/serve_relay.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "actors/dialback.hpp"
#include "net/membership.hpp"

namespace corolla::app {

bool reachable_from_swarm(node& n, net::membership& members, const std::string& model, int n_blocks,
                          const std::string& endpoint) {
  int asked = 0;
  for (const auto& r : members.get_span(model, 0, n_blocks)) {
    if (!r.relay_service || !r.relay.empty() || r.endpoint.empty() || r.node_id == n.id() ||
        r.state != net::member_state::online)
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

relay_keeper::relay_keeper(node& n, std::vector<std::string> relays, net::membership* members, std::string model,
                           int n_blocks)
    : n_(n), given_(std::move(relays)), members_(members), model_(std::move(model)), n_blocks_(n_blocks) {}

std::vector<relay_keeper::candidate> relay_keeper::candidates() const {
  std::vector<candidate> out;
  for (const auto& g : given_) {
    const auto hash = g.find('#');
    std::string endpoint = g.substr(0, hash);
    if (endpoint.find("://") == std::string::npos) endpoint = "tcp://" + endpoint;
    out.push_back({endpoint, hash == std::string::npos ? "" : g.substr(hash + 1), ""});
  }
  if (members_) {
    std::vector<candidate> offered;
    for (const auto& r : members_->get_span(model_, 0, n_blocks_))
      if (r.relay_service && r.relay.empty() && !r.endpoint.empty() && r.node_id != n_.id() &&
          r.state == net::member_state::online &&
          std::none_of(offered.begin(), offered.end(), [&](const candidate& c) { return c.id == r.node_id; }))
        offered.push_back({r.endpoint, r.public_key, r.node_id});
    out.insert(out.end(), offered.begin(), offered.end());
  }
  // Relays that went away are tried last (a restarted one may answer again).
  std::stable_partition(out.begin(), out.end(), [&](const candidate& c) { return !failed_.count(c.endpoint); });
  return out;
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
  for (const auto& c : candidates()) {
    connect_options co;
    co.timeout = std::chrono::seconds(3);
    co.server_key = c.key;
    auto id = !c.id.empty() && n_.peer_is_up(c.id) ? caf::expected<std::string>(c.id) : n_.connect(c.endpoint, co);
    if (!id) {
      spdlog::debug("serve: relay candidate {} did not answer: {}", c.endpoint, error_message(id.error()));
      continue;
    }
    relay_id_ = *id;
    n_.accept_relayed_from(relay_id_);
    endpoint_ = c.endpoint;
    key_ = c.key;
    down_ = false;
    failed_.erase(endpoint_);
    record.endpoint = endpoint_;
    record.public_key = key_;
    record.relay = relay_id_;
    spdlog::info("serve: reachable through relay {} at {}", relay_id_, endpoint_);
    return true;
  }
  return false;
}

}  // namespace corolla::app
