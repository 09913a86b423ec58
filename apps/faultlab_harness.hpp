// apps/faultlab_harness.hpp — faultlab's own node for the control actors of
// the processes it starts (actors/node_control.hpp): throttle and heal
// reshape a target's sends, partition cuts it off from every peer but this
// node (which keeps its link, so the heal reaches it), corrupt makes a
// server's span actor answer wrong. It is a node of its own, not the swarm
// client's: a partition must cut the client off too. A target is an
// endpoint, or ID@RELAY_ENDPOINT for a node behind NAT, reached through its
// relay as clients reach it (node::connect_via).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "actors/corolla.hpp"
#include "actors/node_control.hpp"

namespace corolla::app {

class faultlab_harness {
 public:
  explicit faultlab_harness(std::string token) : token_(std::move(token)) {}

  /// Shapes what the node at `endpoint` (or ID@RELAY) sends ("" = as it was set up); cuts
  /// it off from every peer but this node (on) or lets it back (off). ""
  /// when done, else why not.
  std::string reshape(const std::string& endpoint, const std::string& profile) { return act(endpoint, &profile, nullptr); }
  std::string partition(const std::string& endpoint, bool on) { return act(endpoint, nullptr, &on); }
  /// The span server of the node at `endpoint` answers wrong from now on.
  std::string corrupt(const std::string& endpoint) {
    const bool on = true;
    return act(endpoint, nullptr, nullptr, &on);
  }
  /// The training rank at `endpoint`: its stage stalls inside its next
  /// compute call (its "train-watch" actor; the watchdog must report it).
  std::string stall(const std::string& endpoint) {
    const bool on = true;
    return act(endpoint, nullptr, nullptr, nullptr, &on);
  }
  /// The training rank at `endpoint`: its mailbox drops the next message
  /// of `type` ("train.act"), lost on the way (the coordinator's stall
  /// check must find the waits it leaves).
  std::string lose(const std::string& endpoint, const std::string& type) {
    std::string peer;
    if (std::string err = link(endpoint, peer); !err.empty()) return err;
    if (const caf::error err = request_lose(*node_, peer, token_, type, 1)) return error_message(err);
    return {};
  }
  /// A heal: the node's own shaping back, and no partition.
  std::string heal(const std::string& endpoint) {
    const std::string none;
    const bool off = false;
    return act(endpoint, &none, &off);
  }

 private:
  std::string act(const std::string& endpoint, const std::string* profile, const bool* partition,
                  const bool* corrupt = nullptr, const bool* stall = nullptr) {
    std::string peer;
    if (std::string err = link(endpoint, peer); !err.empty()) return err;
    // Lift a partition first: the reshape of a heal then travels a whole link.
    if (partition)
      if (const caf::error err = request_partition(*node_, peer, token_, *partition)) return error_message(err);
    if (profile)
      if (const caf::error err = request_reshape(*node_, peer, token_, *profile)) return error_message(err);
    if (corrupt)
      if (const caf::error err = request_corrupt(*node_, peer, token_, "span", *corrupt)) return error_message(err);
    if (stall)
      if (const caf::error err = request_stall(*node_, peer, token_, "train-watch", *stall)) return error_message(err);
    return {};
  }

  /// The node id of the link to `endpoint` (or ID@RELAY) in `peer`; ""
  /// when done, else why not.
  std::string link(const std::string& endpoint, std::string& peer) {
    if (!node_) {
      auto n = node::start([] {
        node_options o;
        o.listen = "";  // dials out only
        return o;
      }());
      if (!n) return "cannot start faultlab's node: " + error_message(n.error());
      node_ = std::move(*n);
    }
    // One link per target, kept while it is up: faults on the same process
    // reuse it instead of opening a connection each.
    auto known = peers_.find(endpoint);
    if (known == peers_.end() || !node_->peer_is_up(known->second)) {
      connect_options co;
      co.timeout = std::chrono::seconds(5);
      const auto at = endpoint.find('@');
      auto direct = node_->connect(at == std::string::npos ? endpoint : endpoint.substr(at + 1), co);
      if (!direct) return error_message(direct.error());
      auto via = at == std::string::npos ? direct : node_->connect_via(*direct, endpoint.substr(0, at), co);
      if (!via) return error_message(via.error());
      known = peers_.insert_or_assign(endpoint, *via).first;
    }
    peer = known->second;
    return {};
  }

  std::string token_;
  std::unique_ptr<node> node_;
  std::map<std::string, std::string> peers_;  ///< endpoint -> node id of the link to it
};

}  // namespace corolla::app
