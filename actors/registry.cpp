#include "actors/registry.hpp"

#include <algorithm>

#include <caf/actor_cast.hpp>

#include "actors/errors.hpp"

namespace corolla {

// -- published actors --------------------------------------------------------

caf::error registry::publish(const std::string& name, const caf::actor& a) {
  if (name.empty()) return make_error(errc::invalid_argument, "cannot publish an actor under an empty name");
  if (!a) return make_error(errc::invalid_argument, "cannot publish an invalid actor as '" + name + "'");
  std::lock_guard lock(mutex_);
  auto [it, inserted] = names_.emplace(name, a);
  if (!inserted && it->second != a)
    return make_error(errc::already_published, "an actor is already published as '" + name + "'");
  return {};
}

bool registry::unpublish(const std::string& name) {
  std::lock_guard lock(mutex_);
  return names_.erase(name) > 0;
}

caf::actor registry::find(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = names_.find(name);
  return it == names_.end() ? caf::actor{} : it->second;
}

std::string registry::name_of(const caf::actor_addr& a) const {
  if (!a) return "";
  std::lock_guard lock(mutex_);
  // A node publishes a handful of names: a scan beats keeping a reverse map
  // consistent.
  for (const auto& [name, actor] : names_) {
    if (actor.address() == a) return name;
  }
  return "";
}

std::vector<std::pair<std::string, caf::actor>> registry::published() const {
  std::lock_guard lock(mutex_);
  return {names_.begin(), names_.end()};
}

// -- connections -------------------------------------------------------------

void registry::bind_connection(net::connection_id conn, const caf::actor& link, std::shared_ptr<link_gate> gate) {
  std::lock_guard lock(mutex_);
  connections_[conn] = connection_link{link, std::move(gate)};
}

caf::actor registry::link_for_connection(net::connection_id conn) const {
  std::lock_guard lock(mutex_);
  auto it = connections_.find(conn);
  return it == connections_.end() ? caf::actor{} : it->second.link;
}

connection_link registry::connection(net::connection_id conn) const {
  std::lock_guard lock(mutex_);
  auto it = connections_.find(conn);
  return it == connections_.end() ? connection_link{} : it->second;
}

connection_link registry::direct_link(const std::string& peer) const {
  std::lock_guard lock(mutex_);
  auto d = direct_.find(peer);
  if (d == direct_.end()) return {};
  auto it = connections_.find(d->second);
  return it == connections_.end() ? connection_link{} : it->second;
}

void registry::unbind_connection(net::connection_id conn, const caf::actor_addr& link) {
  std::lock_guard lock(mutex_);
  auto it = connections_.find(conn);
  if (it != connections_.end() && it->second.link.address() == link) connections_.erase(it);
}

std::vector<caf::actor> registry::links() const {
  std::lock_guard lock(mutex_);
  std::vector<caf::actor> out;
  out.reserve(connections_.size());
  for (const auto& [conn, entry] : connections_) out.push_back(entry.link);
  for (const auto& [key, link] : relayed_) out.push_back(link);
  return out;
}

// -- relayed links -------------------------------------------------------------

void registry::bind_relayed(net::connection_id conn, const std::string& peer, const caf::actor& link) {
  std::lock_guard lock(mutex_);
  relayed_[{conn, peer}] = link;
}

caf::actor registry::relayed_link(net::connection_id conn, const std::string& peer) const {
  std::lock_guard lock(mutex_);
  auto it = relayed_.find({conn, peer});
  return it == relayed_.end() ? caf::actor{} : it->second;
}

void registry::unbind_relayed(net::connection_id conn, const std::string& peer, const caf::actor_addr& link) {
  std::lock_guard lock(mutex_);
  auto it = relayed_.find({conn, peer});
  if (it != relayed_.end() && it->second.address() == link) relayed_.erase(it);
}

std::vector<caf::actor> registry::relayed_links(net::connection_id conn) const {
  std::lock_guard lock(mutex_);
  std::vector<caf::actor> out;
  for (auto it = relayed_.lower_bound({conn, std::string()}); it != relayed_.end() && it->first.first == conn; ++it)
    out.push_back(it->second);
  return out;
}

void registry::set_direct(const std::string& peer, net::connection_id conn, bool up) {
  std::lock_guard lock(mutex_);
  if (up) {
    if (auto old = direct_.find(peer); old != direct_.end()) direct_peer_.erase(old->second);
    direct_[peer] = conn;
    direct_peer_[conn] = peer;
    return;
  }
  if (auto it = direct_.find(peer); it != direct_.end() && it->second == conn) direct_.erase(it);
  if (auto it = direct_peer_.find(conn); it != direct_peer_.end() && it->second == peer) direct_peer_.erase(it);
}

net::connection_id registry::direct_connection(const std::string& peer) const {
  std::lock_guard lock(mutex_);
  auto it = direct_.find(peer);
  return it == direct_.end() ? 0 : it->second;
}

void registry::trust_relay(const std::string& relay) {
  std::lock_guard lock(mutex_);
  trusted_relays_.insert(relay);
}

bool registry::trusts_relay(const std::string& relay) const {
  std::lock_guard lock(mutex_);
  return trusted_relays_.count(relay) > 0;
}

std::string registry::peer_of(net::connection_id conn) const {
  std::lock_guard lock(mutex_);
  auto it = direct_peer_.find(conn);
  return it == direct_peer_.end() ? std::string() : it->second;
}

// -- peers -------------------------------------------------------------------

bool registry::any_up(const std::vector<peer_link>& links) const {
  return std::any_of(links.begin(), links.end(), [](const peer_link& l) { return l.up; });
}

bool registry::link_up(const std::string& peer, const std::string& nic_class, const caf::actor& link) {
  std::lock_guard lock(mutex_);
  auto& links = peers_[peer];
  const bool was_up = any_up(links);
  auto it = std::find_if(links.begin(), links.end(),
                         [&](const peer_link& l) { return l.link == link; });
  if (it == links.end()) {
    links.push_back({link, nic_class, true});
  } else {
    it->nic_class = nic_class;
    it->up = true;
  }
  return !was_up;
}

bool registry::link_down(const std::string& peer, const caf::actor_addr& link) {
  std::lock_guard lock(mutex_);
  auto p = peers_.find(peer);
  if (p == peers_.end()) return false;
  const bool was_up = any_up(p->second);
  for (auto& l : p->second) {
    if (l.link.address() == link) l.up = false;
  }
  return was_up && !any_up(p->second);
}

bool registry::remove_link(const std::string& peer, const caf::actor_addr& link) {
  std::lock_guard lock(mutex_);
  auto p = peers_.find(peer);
  if (p == peers_.end()) return false;
  const bool was_up = any_up(p->second);
  auto& links = p->second;
  links.erase(std::remove_if(links.begin(), links.end(),
                             [&](const peer_link& l) { return l.link.address() == link; }),
              links.end());
  const bool now_up = any_up(links);
  if (links.empty()) peers_.erase(p);
  return was_up && !now_up;
}

std::vector<caf::actor> registry::stale_links(const std::string& peer,
                                              const caf::actor_addr& keep) const {
  std::lock_guard lock(mutex_);
  std::vector<caf::actor> out;
  auto p = peers_.find(peer);
  if (p == peers_.end()) return out;
  for (const auto& l : p->second) {
    if (!l.up && l.link.address() != keep) out.push_back(l.link);
  }
  return out;
}

caf::actor registry::route(const std::string& peer, const std::string& nic_class) const {
  std::lock_guard lock(mutex_);
  auto p = peers_.find(peer);
  if (p == peers_.end() || p->second.empty()) return {};
  const peer_link* fallback = nullptr;
  for (const auto& l : p->second) {
    if (!nic_class.empty() && l.nic_class != nic_class) continue;
    if (l.up) return l.link;
    if (!fallback) fallback = &l;
  }
  if (fallback) return fallback->link;
  // No link over that NIC class: any link still answers (or reports down).
  for (const auto& l : p->second) {
    if (l.up) return l.link;
  }
  return p->second.front().link;
}

std::vector<std::string> registry::peers() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [peer, links] : peers_) out.push_back(peer);
  return out;
}

bool registry::peer_is_up(const std::string& peer) const {
  std::lock_guard lock(mutex_);
  auto p = peers_.find(peer);
  return p != peers_.end() && any_up(p->second);
}

std::string registry::bind_key(const std::string& peer, const std::string& key) {
  std::lock_guard lock(mutex_);
  if (auto it = keys_.find(peer); it != keys_.end()) return it->second;
  int& ids = ids_per_key_[key];
  if (ids >= max_ids_per_key) return "";
  ++ids;
  keys_.emplace(peer, key);
  return key;
}

// -- subscriptions -----------------------------------------------------------

void registry::subscribe(const std::string& peer, const caf::actor& subscriber) {
  if (!subscriber) return;
  std::lock_guard lock(mutex_);
  auto& subs = subscribers_[peer];
  const auto addr = subscriber.address();
  // Drop subscribers that have terminated while we are here.
  subs.erase(std::remove_if(subs.begin(), subs.end(),
                            [](const caf::actor_addr& a) { return !caf::actor_cast<caf::actor>(a); }),
             subs.end());
  if (std::find(subs.begin(), subs.end(), addr) == subs.end()) subs.push_back(addr);
}

void registry::unsubscribe(const std::string& peer, const caf::actor_addr& subscriber) {
  std::lock_guard lock(mutex_);
  auto it = subscribers_.find(peer);
  if (it == subscribers_.end()) return;
  auto& subs = it->second;
  subs.erase(std::remove(subs.begin(), subs.end(), subscriber), subs.end());
  if (subs.empty()) subscribers_.erase(it);
}

std::vector<caf::actor> registry::subscribers(const std::string& peer) const {
  std::lock_guard lock(mutex_);
  std::vector<caf::actor> out;
  auto add = [&](const std::string& key) {
    auto it = subscribers_.find(key);
    if (it == subscribers_.end()) return;
    for (const auto& addr : it->second) {
      auto a = caf::actor_cast<caf::actor>(addr);
      if (a && std::find(out.begin(), out.end(), a) == out.end()) out.push_back(std::move(a));
    }
  };
  add(peer);
  if (!peer.empty()) add("");
  return out;
}

// -- proxies -----------------------------------------------------------------

caf::actor registry::proxy(const std::string& peer, const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = proxies_.find({peer, name});
  return it == proxies_.end() ? caf::actor{} : it->second;
}

caf::actor registry::store_proxy(const std::string& peer, const std::string& name,
                                 const caf::actor& p) {
  std::lock_guard lock(mutex_);
  auto [it, inserted] = proxies_.emplace(std::make_pair(peer, name), p);
  return it->second;
}

std::vector<caf::actor> registry::proxies() const {
  std::lock_guard lock(mutex_);
  std::vector<caf::actor> out;
  for (const auto& [key, p] : proxies_) out.push_back(p);
  return out;
}

void registry::clear() {
  std::lock_guard lock(mutex_);
  names_.clear();
  connections_.clear();
  relayed_.clear();
  direct_.clear();
  direct_peer_.clear();
  trusted_relays_.clear();
  peers_.clear();
  subscribers_.clear();
  proxies_.clear();
  keys_.clear();
  ids_per_key_.clear();
}

}  // namespace corolla
