// A rank joining a training job (actors/train_roster.hpp).
#include "actors/train_roster.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/scoped_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/train_wire.hpp"

namespace corolla {

rank_rings rings_of(const train_layout& l, int rank) {
  rank_rings r;
  const int stage = l.stage_of(rank);
  for (int q = 0; q < l.dp; ++q) r.dp.ranks.push_back(l.rank_of(stage, q));
  r.dp.position = l.replica_of(rank);
  if (stage == 0 || stage == l.pp - 1) {
    for (int q = 0; q < l.dp; ++q) r.head.ranks.push_back(l.rank_of(0, q));
    if (l.pp > 1)
      for (int q = 0; q < l.dp; ++q) r.head.ranks.push_back(l.rank_of(l.pp - 1, q));
    r.head.position =
        static_cast<int>(std::find(r.head.ranks.begin(), r.head.ranks.end(), rank) - r.head.ranks.begin());
  }
  return r;
}

std::set<int> neighbours_of(const train_layout& l, int rank, const rank_rings& rings) {
  std::set<int> n;
  const int stage = l.stage_of(rank);
  const int replica = l.replica_of(rank);
  if (stage > 0) n.insert(l.rank_of(stage - 1, replica));
  if (stage + 1 < l.pp) n.insert(l.rank_of(stage + 1, replica));
  for (const ring* r : {&rings.dp, &rings.head})
    if (r->size() > 1) {
      n.insert(r->next());
      n.insert(r->prev());
    }
  n.erase(rank);
  return n;
}

namespace {

/// Sends the join, again after 10 ms, 20 ms, ... up to every second, until
/// the roster comes (or o.timeout passes): a join that reaches the
/// coordinator's node before its mailbox is published there is dropped
/// ("no actor named 'train-coord'"), which a rank started before rank 0
/// (torchrun style) hit when the join was sent once, and a rank process
/// handed the next grid's rank (apps/rank_hold.hpp) before its launcher's
/// coordinator listens hits at once. The coordinator takes the first join
/// of each rank; later copies stay filed unread.
remote_message join_until_roster(node& n, const dist_train_options& o, const model_config& cfg, int rank,
                                 train_inbox& inbox, train_comm& comm) {
  const auto body = encode_body(train_join{rank, o.layout.world(), n.endpoint(), join_key(o, cfg)});
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  std::chrono::milliseconds again{10};
  for (;;) {
    comm.send_coordinator(train_msg::join, body);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      const auto wait = std::clamp(left, std::chrono::milliseconds(0), again);
      again = std::min(again * 2, std::chrono::milliseconds(1000));
      return inbox.take(train_key(train_msg::roster, 0, 0, 0), wait, "roster from the coordinator");
    } catch (const train_error&) {
      if (inbox.failure()) throw;
      if (std::chrono::steady_clock::now() >= deadline)
        throw train_error("no roster from the coordinator within " + std::to_string(o.timeout.count()) + " ms");
    }
  }
}

/// Waits until every peer of `lower` (rank, node id: the lower neighbours,
/// which connect to this rank) has a link up, as peer_up messages to
/// `watcher` (subscribed to them before this rank's own connects). Throws
/// train_error when the inbox fails (its reason; checked every 50 ms) or at
/// `timeout`, naming the first rank that did not connect.
void await_links_from(node& n, caf::scoped_actor& watcher, const std::vector<std::pair<int, std::string>>& lower,
                      train_inbox& inbox, const train_layout& l, std::chrono::milliseconds timeout) {
  std::vector<std::pair<int, std::string>> waiting;
  for (const auto& p : lower)
    if (!n.peer_is_up(p.second)) waiting.push_back(p);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!waiting.empty()) {
    if (auto f = inbox.failure()) throw train_error(*f);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0)
      throw train_error(l.label(waiting.front().first) + " did not connect within " +
                        std::to_string(timeout.count()) + " ms");
    watcher->receive(
        [&](const peer_up& up) {
          waiting.erase(std::remove_if(waiting.begin(), waiting.end(), [&](const auto& p) { return p.second == up.peer; }),
                        waiting.end());
        },
        [](const peer_down&) {},  // it may come back; the deadline decides
        caf::after(std::min(left, std::chrono::milliseconds(50))) >> [] {});
  }
}

}  // namespace

std::unique_ptr<train_comm> join_train_job(node& n, const dist_train_options& o, const model_config& cfg, int rank,
                                           const std::shared_ptr<train_inbox>& inbox, train_comm& joining,
                                           const rank_rings& rings) {
  const train_layout& l = o.layout;
  const std::string coordinator = joining.coordinator();
  remote_message r = join_until_roster(n, o, cfg, rank, *inbox, joining);
  auto roster = decode_train_roster(r.body);
  if (!roster) throw train_error("bad roster from the coordinator: " + error_message(roster.error()));
  const int world = l.world();
  if (static_cast<int>(roster->peers.size()) != world)
    throw train_error("the coordinator's roster has " + std::to_string(roster->peers.size()) + " ranks, expected " +
                      std::to_string(world));
  std::vector<std::string> ids(static_cast<std::size_t>(world));
  std::vector<std::string> endpoints(static_cast<std::size_t>(world));
  for (const train_peer& p : roster->peers) {
    if (p.rank < 0 || p.rank >= world) throw train_error("roster names rank " + std::to_string(p.rank));
    ids[static_cast<std::size_t>(p.rank)] = p.node_id;
    endpoints[static_cast<std::size_t>(p.rank)] = p.endpoint;
    inbox->name_peer(p.node_id, l.label(p.rank));
  }
  // Links: the lower rank of each pair connects, the higher one waits for
  // it, so no pair ever has two connections. The lower neighbours' links
  // are watched before any connect of this rank's (none is missed), and
  // waited for after them.
  std::vector<std::pair<int, std::string>> lower;
  for (int q : neighbours_of(l, rank, rings))
    if (q < rank) lower.emplace_back(q, ids[static_cast<std::size_t>(q)]);
  caf::scoped_actor watcher{n.system()};
  const caf::actor watching = caf::actor_cast<caf::actor>(watcher);
  for (const auto& [q, id] : lower) n.monitor_peer(id, watching);
  struct unwatch {
    node& n;
    const std::vector<std::pair<int, std::string>>& peers;
    const caf::actor who;
    ~unwatch() {
      for (const auto& [q, id] : peers) n.demonitor_peer(id, who);
    }
  } on_exit{n, lower, watching};
  for (int q : neighbours_of(l, rank, rings)) {
    if (q < rank) continue;
    const auto qi = static_cast<std::size_t>(q);
    connect_options co;
    const auto world_size = static_cast<std::size_t>(world);
    if (!o.link_profiles.empty()) co.link_profile = o.link_profiles.at(static_cast<std::size_t>(rank) * world_size + qi);
    if (co.link_profile.empty()) co.link_profile = "none";
    auto c = n.connect(endpoints[qi], co);
    if (!c)
      throw train_error("cannot connect to " + l.label(q) + " at " + endpoints[qi] + ": " + error_message(c.error()));
  }
  await_links_from(n, watcher, lower, *inbox, l, o.timeout);
  auto comm = std::make_unique<train_comm>(n, inbox, rank, ids, coordinator, o.timeout);
  comm->set_job(roster->job);
  inbox->set_job(roster->job);
  return comm;
}

std::unique_ptr<device_group> join_device_group(Backend& be, train_comm& comm,
                                                const std::shared_ptr<train_inbox>& inbox,
                                                const dist_train_options& o, const ring& r, int tag) {
  if (r.size() < 2) return nullptr;
  const std::string group = tag == 0 ? "data-parallel" : "head";
  device_group_id id{};
  if (r.position == 0) {
    id = be.new_group_id();
  } else {
    const std::string what = "the " + group + " group's device id from " + o.layout.label(r.prev());
    remote_message m = inbox->take(train_key(train_msg::group, comm.job(), 0, tag), o.timeout, what);
    if (m.tensors.size() != 1 || m.tensors[0].type() != dtype::i8 ||
        m.tensors[0].numel() != static_cast<std::int64_t>(id.size()))
      throw train_error(what + " is malformed (expected one i8 tensor of " + std::to_string(id.size()) + " values)");
    std::memcpy(id.data(), m.tensors[0].raw(), id.size());
  }
  if (r.position + 1 < r.size()) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(id.size())}, dtype::i8);
    std::memcpy(t.raw(), id.data(), id.size());
    comm.send(r.next(), train_msg::group, {0, tag, 0, comm.rank()}, t);
  }
  spdlog::debug("{} joins the {} device group as member {} of {}", o.layout.label(comm.rank()), group, r.position,
                r.size());
  return be.join_group(id, r.position, r.size(), [inbox]() { return inbox->failure(); });
}

}  // namespace corolla
