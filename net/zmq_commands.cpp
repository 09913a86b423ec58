// net/zmq_commands.cpp — the ZeroMQ transport's command queue on the I/O
// thread: running what callers pushed (connect, send, set_profile, close,
// offer_rdma), opening DEALER connections (routing ids, CurveZMQ keys,
// monitors), and closing connections at once or once their queue has
// drained. I/O thread only.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "net/zmq_impl.hpp"

namespace corolla::net {

void zmq_transport::impl::run_commands() {
  // Handlers called while running a command may push more; loop until dry.
  for (int round = 0; round < 16; ++round) {
    std::vector<command> batch;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (queue_.empty()) return;
      batch.swap(queue_);
    }
    const auto now = clock_type::now();
    for (auto& cmd : batch) {
      switch (cmd.what) {
        case command::op::connect: open_dealer(cmd); break;
        case command::op::send: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end() || cmd.shared->drop_queued.load()) break;  // closed meanwhile: dropped
          enqueue(*it->second, std::move(cmd.message), now);
          break;
        }
        case command::op::set_profile: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end()) break;
          set_link(*it->second, cmd.profile);
          break;
        }
        case command::op::close:
          if (cmd.drain.count() > 0)
            close_when_drained(cmd.conn, cmd.drain, now);
          else
            close_connection(cmd.conn);
          break;
        case command::op::offer_rdma: {
          auto it = conns_.find(cmd.conn);
          if (it == conns_.end()) break;
          rdma_of(*it->second).offer();
          items_dirty_ = true;
          after_rdma(*it->second);
          break;
        }
      }
    }
  }
}

void zmq_transport::impl::open_dealer(command& cmd) {
  if (cmd.shared->drop_queued.load()) return;  // closed (without draining) before it was opened
  auto c = std::make_unique<connection>();
  c->id = cmd.conn;
  c->outgoing = true;
  c->endpoint = cmd.endpoint;
  c->shared = cmd.shared;
  c->shaper = link_shaper(opts_.default_profile, opts_.shaping_seed + c->id);
  set_link(*c, opts_.default_profile);
  c->in = reassembler(opts_.limits);

  auto fail = [&](const std::string& why) {
    spdlog::error("zmq transport: connection {} to {}: {}", c->id, cmd.endpoint, why);
    close_socket(c->socket, c->monitor);
    cmd.shared->closed.store(true);
    unregister_shared(c->id);
    notify(events_.on_disconnect, "on_disconnect", c->id);
  };
  c->socket = zmq_socket(ctx_, ZMQ_DEALER);
  if (!c->socket) return fail(zmq_error_text("DEALER socket"));
  apply_common_options(c->socket);
  // No ZMQ_IMMEDIATE: messages sent before the connection is up (or while
  // it reconnects) must queue in the pipe, not fail.
  detail::set_int_option(c->socket, ZMQ_RECONNECT_IVL, 100);
  detail::set_int_option(c->socket, ZMQ_RECONNECT_IVL_MAX, 1000);
  // Under CurveZMQ a DEALER presents no routing id: the peer's ROUTER makes
  // one up (a zero byte first, which no peer may present itself), so no
  // other key can take this connection over by presenting the same id
  // (ROUTER handover); identities are proven at the hello instead. Without
  // CurveZMQ the node id is the routing id, and a restarted node takes its
  // old slot over.
  if (presents_identity()) {
    // A second connection of this node to the same peer needs its own
    // routing id (the peer's ROUTER would hand the first one over to it);
    // the first keeps the plain identity so a restarted node takes over.
    auto& used = suffixes_[cmd.endpoint];
    int suffix = 0;
    while (used.count(suffix)) ++suffix;
    used.insert(suffix);
    c->suffix = suffix;
    const std::string rid = suffix == 0 ? opts_.identity : opts_.identity + "#" + std::to_string(suffix);
    zmq_setsockopt(c->socket, ZMQ_ROUTING_ID, rid.data(), rid.size());
  }
  if (opts_.curve.enabled) {
    zmq_setsockopt(c->socket, ZMQ_CURVE_SERVERKEY, cmd.server_key.data(), 40);
    zmq_setsockopt(c->socket, ZMQ_CURVE_PUBLICKEY, opts_.curve.public_key.data(), 40);
    zmq_setsockopt(c->socket, ZMQ_CURVE_SECRETKEY, opts_.curve.secret_key.data(), 40);
  }
  if (auto err = attach_monitor(c->socket, std::to_string(c->id), c->monitor); !err.empty()) {
    if (presents_identity()) suffixes_[cmd.endpoint].erase(c->suffix);
    return fail(err);
  }
  if (zmq_connect(c->socket, cmd.endpoint.c_str()) != 0) {
    if (presents_identity()) suffixes_[cmd.endpoint].erase(c->suffix);
    return fail(zmq_error_text("zmq_connect"));
  }
  spdlog::debug("zmq transport: connection {} connecting to {}", c->id, cmd.endpoint);
  conns_[c->id] = std::move(c);
  items_dirty_ = true;
}

void zmq_transport::impl::close_when_drained(connection_id id, std::chrono::milliseconds drain,
                                             clock_type::time_point now) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  connection& c = *it->second;
  if (queued_count(c) == 0) return close_connection(id, drain);
  c.close_at = now + drain;
  closing_.push_back(id);
}

void zmq_transport::impl::finish_closing(clock_type::time_point now) {
  for (std::size_t i = 0; i < closing_.size();) {
    auto it = conns_.find(closing_[i]);
    if (it == conns_.end()) {  // closed meanwhile (peer gone, teardown)
      closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    connection& c = *it->second;
    if (queued_count(c) > 0 && now < *c.close_at) {
      ++i;
      continue;
    }
    if (queued_count(c) > 0)
      spdlog::debug("zmq transport: connection {} closed with {} messages still queued (drain time up)", c.id,
                    queued_count(c));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*c.close_at - now);
    closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
    close_connection(c.id, std::max(left, std::chrono::milliseconds{1}));
  }
}

void zmq_transport::impl::close_connection(connection_id id, std::chrono::milliseconds linger) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  connection& c = *it->second;
  c.shared->closed.store(true);
  if (c.outgoing) {
    close_socket(c.socket, c.monitor, linger);
    if (presents_identity()) {
      auto used = suffixes_.find(c.endpoint);
      if (used != suffixes_.end()) {
        used->second.erase(c.suffix);
        if (used->second.empty()) suffixes_.erase(used);
      }
    }
    items_dirty_ = true;
  } else {
    by_routing_id_.erase(c.routing_id);
    if (c.peer_fd >= 0) {
      auto f = by_fd_.find(c.peer_fd);
      if (f != by_fd_.end() && f->second == id) by_fd_.erase(f);
    }
  }
  if (c.listed) with_pending_.erase(std::find(with_pending_.begin(), with_pending_.end(), &c));
  c.shared->queued.fetch_sub(queued_count(c));
  if (with_rdma_.erase(id)) items_dirty_ = true;
  conns_.erase(it);
  unregister_shared(id);
}

}  // namespace corolla::net
