#include "actors/node.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>

#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <spdlog/spdlog.h>

#include "actors/dialback.hpp"
#include "actors/echo_actor.hpp"
#include "actors/errors.hpp"
#include "actors/link_actor.hpp"
#include "actors/link_gate.hpp"
#include "actors/node_context.hpp"
#include "actors/node_control.hpp"
#include "actors/relay.hpp"
#include "actors/remote_proxy.hpp"
#include "net/nic.hpp"
#include "net/rdma_verbs.hpp"

namespace corolla {
namespace {

std::string generate_node_id() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint32_t> dist;
  char buf[16];
  std::snprintf(buf, sizeof buf, "n-%08x", dist(rd));
  return buf;
}

/// Transport events arrive on the transport's I/O thread: find (or, for a
/// new incoming connection, create) the link and hand the event over.
net::transport_events make_events(const std::weak_ptr<node_context>& weak) {
  net::transport_events ev;
  auto live = [weak]() -> std::shared_ptr<node_context> {
    auto ctx = weak.lock();
    if (!ctx || !ctx->ready.load(std::memory_order_acquire)) return nullptr;
    return ctx;
  };
  // Only the I/O thread creates links for accepted connections, so this
  // check-then-create cannot race with itself.
  auto link_for = [](node_context& ctx, const std::shared_ptr<node_context>& owner, net::connection_id conn,
                     const std::string& routing_id, bool create) -> connection_link {
    auto entry = ctx.directory.connection(conn);
    if (entry.link || !create || ctx.stopping) return entry;
    link_args args;
    args.role = link_role::accepted;
    args.conn = conn;
    // Routing ids the ROUTER made up (CurveZMQ peers present none) start
    // with a zero byte: no label.
    args.endpoint = routing_id.empty() || routing_id[0] == '\0' ? "connection " + std::to_string(conn) : routing_id;
    spawn_link(owner, std::move(args));
    return ctx.directory.connection(conn);
  };
  ev.on_message = [live, link_for](net::connection_id conn, net::message&& m) {
    auto ctx = live();
    if (!ctx) return;
    if (!m.relay_to.empty()) return relay_pass_on(*ctx, conn, std::move(m));
    if (!m.relay_from.empty()) return relay_deliver(ctx, conn, std::move(m));
    auto entry = link_for(*ctx, ctx, conn, m.sender_node, true);
    if (!entry.link) return;
    // While the link is up, its one-way messages go straight to their
    // actor (actors/link_gate.hpp); the rest through the link actor, which
    // counts down when it has handled each.
    if (deliver_through_gate(*ctx, *entry.gate, m)) return;
    entry.gate->inbound_queued.fetch_add(1, std::memory_order_relaxed);
    caf::anon_send(entry.link, inbound_atom::value, std::move(m));
  };
  ev.on_bad_message = [live](net::connection_id conn, const std::string& reason) {
    auto ctx = live();
    if (!ctx) return;
    // The transport has logged it at warning level; this adds
    // which node it was, for multi-node logs read at debug level.
    spdlog::debug("node {}: dropped a malformed message on connection {}: {}", ctx->node_id, conn, reason);
  };
  ev.on_accept = [live, link_for](net::connection_id conn, const std::string& routing_id) {
    auto ctx = live();
    if (!ctx) return;
    link_for(*ctx, ctx, conn, routing_id, true);
  };
  ev.on_disconnect = [live](net::connection_id conn) {
    auto ctx = live();
    if (!ctx) return;
    if (auto link = ctx->directory.link_for_connection(conn)) caf::anon_send(link, disconn_atom::value);
    for (const auto& link : ctx->directory.relayed_links(conn)) caf::anon_send(link, disconn_atom::value);
  };
  ev.on_connect = [live](net::connection_id conn) {
    auto ctx = live();
    if (!ctx) return;
    if (auto link = ctx->directory.link_for_connection(conn)) caf::anon_send(link, reconn_atom::value);
    for (const auto& link : ctx->directory.relayed_links(conn)) caf::anon_send(link, reconn_atom::value);
  };
  ev.on_rdma = [live](net::connection_id conn, bool up, const std::string& reason) {
    auto ctx = live();
    if (!ctx) return;
    if (auto link = ctx->directory.link_for_connection(conn)) caf::anon_send(link, rdma_atom::value, up, reason);
  };
  ev.on_auth_failure = [live](net::connection_id conn, const std::string& reason) {
    auto ctx = live();
    if (!ctx) return;
    // Reported on both sides of a refused handshake (the refusing node and
    // the refused one) and logged by the transport already. The connecting
    // side's link fails its connect at once, with the reason.
    spdlog::debug("node {}: CurveZMQ authentication failed: {}", ctx->node_id, reason);
    if (conn != 0)
      if (auto link = ctx->directory.link_for_connection(conn)) caf::anon_send(link, auth_atom::value, reason);
  };
  return ev;
}

/// The verbs device of this host's best RDMA class (InfiniBand over RoCE),
/// or null with the reason logged: links then stay on TCP.
std::shared_ptr<net::rdma::device> open_best_rdma_device(const std::vector<net::nic_info>& nics) {
  const net::nic_info* best = nullptr;
  for (const auto& n : nics) {
    if (!n.active || n.verbs_device.empty()) continue;
    if (n.kind != net::nic_kind::infiniband && n.kind != net::nic_kind::roce) continue;
    if (!best || (n.kind == net::nic_kind::infiniband && best->kind != net::nic_kind::infiniband)) best = &n;
  }
  if (!best) return nullptr;  // nothing to open: no log, most hosts have no RDMA
  try {
    std::shared_ptr<net::rdma::device> dev = net::rdma::open_verbs_device(best->verbs_device, best->port);
    spdlog::info("RDMA device {} open: links to peers of the same class move to RDMA", dev->name());
    return dev;
  } catch (const std::exception& e) {
    spdlog::warn("RDMA port {} found but not usable, links use TCP: {}", best->name, e.what());
    return nullptr;
  }
}

}  // namespace

caf::expected<std::unique_ptr<node>> node::start(node_options options) {
  link_settings settings;
  if (options.heartbeat_interval.count() <= 0)
    return make_error(errc::invalid_argument, "heartbeat interval must be positive");
  if (options.peer_timeout <= options.heartbeat_interval)
    return make_error(errc::invalid_argument,
                      "peer timeout (" + std::to_string(options.peer_timeout.count()) +
                          " ms) must exceed the heartbeat interval (" +
                          std::to_string(options.heartbeat_interval.count()) + " ms)");
  settings.heartbeat_interval = options.heartbeat_interval;
  settings.peer_timeout = options.peer_timeout;
  settings.nics = net::discover_nics();
  std::shared_ptr<net::rdma::device> rdma_device = options.rdma_device;
  if (!rdma_device && options.open_rdma) rdma_device = open_best_rdma_device(settings.nics);
  if (rdma_device) {
    const net::nic_info port = rdma_device->nic();
    const bool listed = std::any_of(settings.nics.begin(), settings.nics.end(), [&](const net::nic_info& n) {
      return n.verbs_device == port.verbs_device && n.port == port.port;
    });
    if (!listed) settings.nics.insert(settings.nics.begin(), port);  // a fake fabric's device
  }
  settings.nic_class = options.nic_class.empty() ? net::node_nic_class(settings.nics) : options.nic_class;
  settings.profile_text = options.link_profile.empty() ? "none" : options.link_profile;
  try {
    settings.profile = net::parse_link_profile(settings.profile_text);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "invalid link profile '" + settings.profile_text + "': " + e.what());
  }
  net::transport_options topts;
  topts.listen = options.listen;
  topts.max_frame_bytes = options.max_message_bytes;
  topts.busy_poll_us = options.busy_poll_us;
  topts.rdma_device = rdma_device;
  topts.default_profile = settings.profile;
  if (!options.curve_dir.empty()) {
    try {
      topts.curve = net::load_curve_dir(options.curve_dir);
    } catch (const std::exception& e) {
      return make_error(errc::invalid_argument, e.what());
    }
    topts.curve.enabled = true;
    settings.curve = true;
  }
  const std::string id = options.node_id.empty() ? generate_node_id() : options.node_id;
  topts.identity = id;

  if (options.scheduler_policy != "sharing" && options.scheduler_policy != "stealing")
    return make_error(errc::invalid_argument,
                      "scheduler policy '" + options.scheduler_policy + "' is neither 'sharing' nor 'stealing'");
  std::unique_ptr<node> n{new node()};
  n->config_ = std::make_unique<caf::actor_system_config>();
  if (options.scheduler_threads > 0)
    n->config_->set("scheduler.max-threads", static_cast<std::int64_t>(options.scheduler_threads));
  n->config_->set("scheduler.policy", caf::atom_from_string(options.scheduler_policy));
  n->config_->add_error_category(error_category, render_error);
  n->system_ = std::make_unique<caf::actor_system>(*n->config_);
  n->ctx_ = std::make_shared<node_context>(*n->system_, id, settings);
  n->ctx_->max_message_bytes = static_cast<std::uint64_t>(options.max_message_bytes);
  n->ctx_->relay_service = options.relay_service;
  n->ctx_->relay_rate = options.relay_rate;
  n->ctx_->accept_relayed = options.accept_relayed;
  n->public_key_ = topts.curve.enabled ? topts.curve.public_key : "";

  auto transport = net::zmq_transport::start(std::move(topts), make_events(n->ctx_));
  if (!transport) {
    n->stopped_ = true;
    return make_error(errc::invalid_argument,
                      "cannot start the transport on '" + options.listen + "': " + error_message(transport.error()));
  }
  n->ctx_->listen_endpoint = (*transport)->endpoint();
  n->ctx_->set_transport(std::shared_ptr<net::zmq_transport>(std::move(*transport)));
  n->ctx_->ready.store(true, std::memory_order_release);

  if (options.publish_echo) {
    n->echo_ = spawn_echo_actor(*n->system_);
    if (auto err = n->publish(echo_actor_name, n->echo_)) return err;
  }
  if (options.relay_service)
    if (auto err = n->publish(reach_actor_name, spawn_reach_actor(*n->system_, n->ctx_))) return err;
  if (!options.control_token.empty())
    if (auto err = n->publish(control_actor_name, spawn_control_actor(*n->system_, n->ctx_, options.control_token)))
      return err;
  spdlog::info("node {} listening on {}", id, n->ctx_->listen_endpoint.empty() ? "(nothing)" : n->ctx_->listen_endpoint);
  return n;
}

node::~node() {
  stop();
  ctx_.reset();
  system_.reset();  // waits for every actor of the system
  config_.reset();
}

const std::string& node::id() const { return ctx_->node_id; }
std::string node::endpoint() const { return ctx_->listen_endpoint; }
const std::string& node::public_key() const { return public_key_; }
caf::actor_system& node::system() { return *system_; }

caf::error node::publish(const std::string& name, const caf::actor& a) {
  return ctx_->directory.publish(name, a);
}

bool node::unpublish(const std::string& name) { return ctx_->directory.unpublish(name); }

caf::actor node::local_actor(const std::string& name) const { return ctx_->directory.find(name); }

std::vector<std::string> node::published_names() const {
  std::vector<std::string> out;
  for (const auto& [name, a] : ctx_->directory.published()) out.push_back(name);
  return out;
}

caf::expected<caf::actor> node::connect_async(const std::string& endpoint, connect_options options) {
  if (stopped_ || ctx_->stopping) return make_error(errc::stopped, "node '" + id() + "' is stopped");
  link_args args;
  args.profile = options.link_profile;
  args.connect_timeout = options.timeout;
  if (ctx_->settings.curve) args.server_key = options.server_key;
  return dial_link(ctx_, endpoint, options.server_key, std::move(args));
}

caf::expected<caf::actor> node::connect_via_async(const std::string& relay, const std::string& peer,
                                                  connect_options options) {
  if (stopped_ || ctx_->stopping) return make_error(errc::stopped, "node '" + id() + "' is stopped");
  if (peer.empty() || peer == id() || peer == relay)
    return make_error(errc::invalid_argument, "connect_via: cannot reach '" + peer + "' through relay '" + relay + "'");
  const net::connection_id conn = ctx_->directory.direct_connection(relay);
  if (conn == 0)
    return make_error(errc::not_connected, "no link to relay '" + relay + "' (connect to it first)");
  if (auto existing = ctx_->directory.relayed_link(conn, peer)) {
    if (ctx_->directory.peer_is_up(peer)) return existing;
    // Down (the peer left the relay, or came back): hello anew on a fresh link.
    ctx_->directory.unbind_relayed(conn, peer, existing.address());
    caf::anon_send(existing, close_atom::value, std::string("replaced by a new relayed link"));
  }
  link_args args;
  args.role = link_role::outgoing;
  args.conn = conn;
  args.relay_peer = peer;
  args.endpoint = peer + " via " + relay;
  args.connect_timeout = options.timeout;
  return spawn_link(ctx_, std::move(args));
}

caf::expected<std::string> node::connect_via(const std::string& relay, const std::string& peer,
                                             connect_options options) {
  const auto timeout = options.timeout;
  return await_hello(connect_via_async(relay, peer, std::move(options)), timeout, peer + " via " + relay);
}

void node::accept_relayed_from(const std::string& relay) { ctx_->directory.trust_relay(relay); }

std::uint64_t node::relayed_messages() const { return ctx_->relayed_messages.load(std::memory_order_relaxed); }
std::uint64_t node::relay_refused() const { return ctx_->relay_refused.load(std::memory_order_relaxed); }

caf::expected<std::string> node::connect(const std::string& endpoint, connect_options options) {
  const auto timeout = options.timeout;
  return await_hello(connect_async(endpoint, std::move(options)), timeout, endpoint);
}

caf::expected<std::string> node::await_hello(caf::expected<caf::actor> link, std::chrono::milliseconds timeout,
                                             const std::string& endpoint) {
  if (!link) return link.error();
  caf::expected<std::string> result{make_error(errc::handshake_timeout, "no hello from " + endpoint)};
  caf::scoped_actor self{*system_};
  // The link enforces `timeout` itself and answers with a precise error;
  // the extra second only guards against a lost answer.
  self->request(*link, timeout + std::chrono::seconds(1), hello_atom::value)
      .receive([&](std::string& peer) { result = std::move(peer); },
               [&](caf::error& e) {
                 if (error_code(e) == "request_receiver_down")
                   result = make_error(errc::handshake_timeout, "connection to " + endpoint + " closed during the hello");
                 else
                   result = std::move(e);
               });
  return result;
}

void node::disconnect(const std::string& peer) {
  for (;;) {
    auto link = ctx_->directory.route(peer);
    if (!link) return;
    caf::scoped_actor self{*system_};
    self->monitor(link);
    self->send(link, close_atom::value, std::string("disconnected by this node"));
    bool done = false;
    self->receive([&](caf::down_msg&) { done = true; },
                  caf::after(std::chrono::seconds(2)) >> [&] { done = false; });
    if (!done) return;
  }
}

caf::expected<caf::actor> node::remote_actor(const std::string& peer, const std::string& name) {
  if (name.empty()) return make_error(errc::invalid_argument, "remote_actor: empty actor name");
  if (peer == id()) {
    auto local = local_actor(name);
    if (!local) return make_error(errc::unknown_actor, "no actor named '" + name + "' on node '" + peer + "'");
    return local;
  }
  if (stopped_) return make_error(errc::stopped, "node '" + id() + "' is stopped");
  if (!ctx_->directory.route(peer))
    return make_error(errc::not_connected, "no link to peer '" + peer + "' (connect to it first)");
  if (auto p = ctx_->directory.proxy(peer, name)) return p;
  auto fresh = spawn_remote_proxy(ctx_, peer, name);
  auto stored = ctx_->directory.store_proxy(peer, name, fresh);
  if (stored != fresh) caf::anon_send_exit(fresh, caf::exit_reason::user_shutdown);
  return stored;
}

caf::error node::post(const std::string& peer, const std::string& name, remote_message m, const std::string& from) {
  if (name.empty()) return make_error(errc::invalid_argument, "post: empty actor name");
  if (stopped_) return make_error(errc::stopped, "node '" + id() + "' is stopped");
  if (peer == id()) {
    auto local = local_actor(name);
    if (!local) return make_error(errc::unknown_actor, "no actor named '" + name + "' on node '" + peer + "'");
    m.from_node.clear();
    m.from_actor = from;
    caf::anon_send(local, std::move(m));
    return {};
  }
  auto entry = ctx_->directory.direct_link(peer);
  if (entry.link) {
    caf::error error;
    if (post_through_gate(*ctx_, *entry.gate, name, from, m, error)) return error;
    // The link is up but earlier posts still wait at its actor (or went
    // down with them there): behind them, in order.
    if (entry.gate->terms() || entry.gate->outbound_queued.load(std::memory_order_acquire) > 0) {
      entry.gate->outbound_queued.fetch_add(1, std::memory_order_relaxed);
      caf::anon_send(entry.link, post_atom::value, name, from, std::move(m), true);
      return {};
    }
  }
  // Relayed, or the direct link is not up: whichever link to the peer is.
  if (!ctx_->directory.peer_is_up(peer)) return make_error(errc::not_connected, "peer '" + peer + "' is not up");
  auto link = ctx_->directory.route(peer);
  if (!link) return make_error(errc::not_connected, "no link to peer '" + peer + "'");
  caf::anon_send(link, post_atom::value, name, from, std::move(m), false);
  return {};
}

caf::expected<remote_message> node::request(const std::string& peer, const std::string& name,
                                            remote_message m, std::chrono::milliseconds timeout) {
  auto target = remote_actor(peer, name);
  if (!target) return target.error();
  caf::expected<remote_message> result{make_error(errc::peer_down, "no answer")};
  caf::scoped_actor self{*system_};
  self->request(*target, timeout, std::move(m))
      .receive([&](remote_message& reply) { result = std::move(reply); },
               [&](caf::error& e) { result = std::move(e); });
  return result;
}

void node::monitor_peer(const std::string& peer, const caf::actor& subscriber) {
  ctx_->directory.subscribe(peer, subscriber);
}

void node::demonitor_peer(const std::string& peer, const caf::actor& subscriber) {
  ctx_->directory.unsubscribe(peer, subscriber.address());
}

std::vector<std::string> node::peers() const { return ctx_->directory.peers(); }

bool node::peer_is_up(const std::string& peer) const { return ctx_->directory.peer_is_up(peer); }

caf::expected<link_stats> node::stats(const std::string& peer) const {
  auto link = ctx_->directory.route(peer);
  if (!link) return make_error(errc::not_connected, "no link to peer '" + peer + "'");
  caf::expected<link_stats> result{make_error(errc::not_connected, "link to '" + peer + "' closed")};
  caf::scoped_actor self{*system_};
  self->request(link, std::chrono::seconds(2), stats_atom::value)
      .receive([&](link_stats& s) { result = std::move(s); }, [&](caf::error& e) { result = std::move(e); });
  return result;
}

caf::error node::reshape_links(const std::string& profile) { return corolla::reshape_links(*ctx_, profile); }

std::vector<link_stats> node::links() const {
  std::vector<link_stats> out;
  caf::scoped_actor self{*system_};
  for (const auto& link : ctx_->directory.links()) {
    self->request(link, std::chrono::seconds(2), stats_atom::value)
        .receive([&](link_stats& s) { out.push_back(std::move(s)); }, [&](caf::error&) {});
  }
  return out;
}

node_traffic node::traffic() const {
  // Ended links first: a link ending meanwhile is then missed by both reads
  // for a moment rather than counted twice, so the totals never go down.
  node_traffic t;
  t.bytes_sent = ctx_->ended_traffic.bytes_sent;
  t.bytes_received = ctx_->ended_traffic.bytes_received;
  t.messages_sent = ctx_->ended_traffic.messages_sent;
  t.messages_received = ctx_->ended_traffic.messages_received;
  for (const link_stats& l : links()) {
    t.bytes_sent += l.bytes_sent;
    t.bytes_received += l.bytes_received;
    t.messages_sent += l.messages_sent;
    t.messages_received += l.messages_received;
  }
  return t;
}

void node::stop() {
  if (stopped_) return;
  stopped_ = true;
  ctx_->stopping = true;
  {
    caf::scoped_actor self{*system_};
    // Messages already sent to remote actors go out before the goodbye: each
    // proxy hands what it holds to its link first (one-way sends that
    // returned before stop() must not be overtaken by it).
    for (const auto& p : ctx_->directory.proxies())
      self->request(p, std::chrono::seconds(1), flush_atom::value).receive([](flush_atom) {}, [](caf::error&) {});
    // Goodbye to every peer; each link closes its connection and ends.
    auto links = ctx_->directory.links();
    for (const auto& link : links) {
      self->monitor(link);
      self->send(link, goodbye_atom::value);
    }
    std::size_t down = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (down < links.size()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        spdlog::warn("node {}: {} link(s) did not close in time", id(), links.size() - down);
        break;
      }
      self->receive([&](caf::down_msg&) { ++down; }, caf::after(left) >> [] {});
    }
  }
  for (const auto& p : ctx_->directory.proxies()) caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  // Published actors serve the network, which is gone now; ending them here
  // also keeps ~node (which waits for every actor) from hanging on them.
  for (const auto& [name, a] : ctx_->directory.published()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  echo_ = caf::actor{};
  ctx_->directory.clear();
  // Join the I/O thread here (the links have let go of the transport).
  auto transport = ctx_->transport();
  ctx_->set_transport(nullptr);
  transport.reset();
  spdlog::info("node {} stopped", id());
}

}  // namespace corolla
