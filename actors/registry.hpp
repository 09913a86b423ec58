// actors/registry.hpp — a node's directory: published actor names, which
// link actor owns which connection, which links reach which peer, who
// subscribed to peer failures, and the proxies handed out for remote actors.
//
// Thread-safe (one mutex): the transport's I/O thread looks up links for
// incoming messages while actors and the embedding program publish names
// and send. Every operation is a short map access; nothing blocks while the
// lock is held (no messages are sent under it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/error.hpp>

#include "net/zmq_transport.hpp"

namespace corolla {

class link_gate;  // actors/link_gate.hpp

/// A direct connection's link actor and its gate.
struct connection_link {
  caf::actor link;
  std::shared_ptr<link_gate> gate;
};

class registry {
 public:
  // -- published actors ------------------------------------------------------

  /// Makes `a` reachable from other nodes as `name`. Fails with
  /// errc::already_published when the name is taken by another actor, and
  /// errc::invalid_argument for an empty name or an invalid handle.
  caf::error publish(const std::string& name, const caf::actor& a);
  /// Removes `name`; returns whether it was published.
  bool unpublish(const std::string& name);
  /// The actor published as `name`, or an invalid handle.
  caf::actor find(const std::string& name) const;
  /// The name `a` is published under, or "".
  std::string name_of(const caf::actor_addr& a) const;
  /// Every published (name, actor).
  std::vector<std::pair<std::string, caf::actor>> published() const;

  // -- connections -----------------------------------------------------------

  /// Records that `link`, with `gate`, owns connection `conn`.
  void bind_connection(net::connection_id conn, const caf::actor& link, std::shared_ptr<link_gate> gate);
  /// The link owning `conn`, or an invalid handle.
  caf::actor link_for_connection(net::connection_id conn) const;
  /// The link owning `conn` and its gate (both null when none).
  connection_link connection(net::connection_id conn) const;
  /// The link and gate of the connection `peer` is up on directly (both
  /// null when none).
  connection_link direct_link(const std::string& peer) const;
  /// Forgets `conn` if `link` still owns it.
  void unbind_connection(net::connection_id conn, const caf::actor_addr& link);
  /// Every link actor (one per connection, and the relayed ones).
  std::vector<caf::actor> links() const;

  // -- relayed links (actors/relay.hpp) --------------------------------------

  /// Records that `link` carries the traffic with node `peer` that a relay
  /// passes over connection `conn`.
  void bind_relayed(net::connection_id conn, const std::string& peer, const caf::actor& link);
  /// The link for `peer` relayed over `conn`, or an invalid handle.
  caf::actor relayed_link(net::connection_id conn, const std::string& peer) const;
  /// Forgets (conn, peer) if `link` still owns it.
  void unbind_relayed(net::connection_id conn, const std::string& peer, const caf::actor_addr& link);
  /// The links relayed over `conn` (they learn of its loss with it).
  std::vector<caf::actor> relayed_links(net::connection_id conn) const;
  /// Records (`up`) or forgets (`!up`, if it is still the one recorded) the
  /// direct connection over which `peer` is up: what a relay passes
  /// messages on over, and how it names where a message came from.
  void set_direct(const std::string& peer, net::connection_id conn, bool up);
  /// The connection `peer` is up on directly, or 0.
  net::connection_id direct_connection(const std::string& peer) const;
  /// The peer that is up on connection `conn` directly, or "".
  std::string peer_of(net::connection_id conn) const;
  /// Relays this node chose (node::accept_relayed_from): only through them
  /// may new relayed links reach it.
  void trust_relay(const std::string& relay);
  bool trusts_relay(const std::string& relay) const;

  // -- peers -----------------------------------------------------------------

  /// Records that `link` reaches `peer` over `nic_class` and is up. Returns
  /// true when the peer was not up before (no other link up): the caller
  /// announces peer_up.
  bool link_up(const std::string& peer, const std::string& nic_class, const caf::actor& link);
  /// Records that `link` to `peer` is down. Returns true when the peer was
  /// up and no other link to it is up: the caller announces peer_down.
  bool link_down(const std::string& peer, const caf::actor_addr& link);
  /// Forgets `link` as a route to `peer` (the link is closing). Returns true
  /// when it was up and no other link to the peer is up.
  bool remove_link(const std::string& peer, const caf::actor_addr& link);
  /// Links to `peer` other than `keep` that are down: superseded by `keep`
  /// (the peer came back on a new connection) and to be closed.
  std::vector<caf::actor> stale_links(const std::string& peer, const caf::actor_addr& keep) const;
  /// The link to use for `peer`: an up link (over `nic_class` when not
  /// empty), else any link to the peer (it answers peer_down), else invalid.
  caf::actor route(const std::string& peer, const std::string& nic_class = "") const;
  /// Node ids of every peer with at least one link, in order.
  std::vector<std::string> peers() const;
  /// Whether `peer` has a link that is up.
  bool peer_is_up(const std::string& peer) const;
  /// CurveZMQ: binds node id `peer` to public key `key` unless it is bound
  /// already; returns the key it is bound to (the first one presented, for
  /// the node's lifetime), or "" when `peer` is new and `key` already
  /// speaks for max_ids_per_key node ids (bounded memory against a peer
  /// inventing ids).
  std::string bind_key(const std::string& peer, const std::string& key);
  static constexpr int max_ids_per_key = 8;

  // -- peer failure subscriptions --------------------------------------------

  /// `subscriber` receives peer_down / peer_up for `peer` ("" = every peer).
  void subscribe(const std::string& peer, const caf::actor& subscriber);
  /// Cancels subscribe(peer, subscriber).
  void unsubscribe(const std::string& peer, const caf::actor_addr& subscriber);
  /// Live subscribers for `peer` (including those of every peer), each once.
  std::vector<caf::actor> subscribers(const std::string& peer) const;

  // -- proxies for remote actors ---------------------------------------------

  /// The proxy for (peer, name) made earlier, or an invalid handle.
  caf::actor proxy(const std::string& peer, const std::string& name) const;
  /// Stores `p` as the proxy for (peer, name) unless one exists; returns the
  /// one now stored (so concurrent callers share one proxy).
  caf::actor store_proxy(const std::string& peer, const std::string& name, const caf::actor& p);
  /// Every proxy handed out.
  std::vector<caf::actor> proxies() const;

  /// Forgets everything (node shutdown).
  void clear();

 private:
  struct peer_link {
    caf::actor link;
    std::string nic_class;
    bool up = false;
  };
  bool any_up(const std::vector<peer_link>& links) const;

  mutable std::mutex mutex_;
  std::map<std::string, caf::actor> names_;
  std::unordered_map<net::connection_id, connection_link> connections_;
  std::map<std::pair<net::connection_id, std::string>, caf::actor> relayed_;
  std::map<std::string, net::connection_id> direct_;           ///< peer -> connection
  std::unordered_map<net::connection_id, std::string> direct_peer_;  ///< connection -> peer
  std::set<std::string> trusted_relays_;
  std::map<std::string, std::vector<peer_link>> peers_;
  std::map<std::string, std::vector<caf::actor_addr>> subscribers_;  // weak: a dead subscriber is skipped
  std::map<std::pair<std::string, std::string>, caf::actor> proxies_;
  std::map<std::string, std::string> keys_;  ///< node id -> CurveZMQ key
  std::map<std::string, int> ids_per_key_;
};

}  // namespace corolla
