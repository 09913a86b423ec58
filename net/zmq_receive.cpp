// net/zmq_receive.cpp — the ZeroMQ transport's receiving side: socket
// monitor events (connections up and down), incoming connections on the
// ROUTER, and turning received frames into messages (reassembling the
// fragments of large ones first). I/O thread only.
#include <algorithm>
#include <string>
#include <vector>

#include <caf/sec.hpp>

#include "net/zmq_impl.hpp"

namespace corolla::net {

// ---- monitors -----------------------------------------------------------------

void zmq_transport::impl::drain_router_monitor() {
  while (auto e = detail::read_monitor_event(router_monitor_)) {
    spdlog::trace("zmq transport: ROUTER event {:#x} value {} ({})", e->event, e->value, e->endpoint);
    switch (e->event) {
      case ZMQ_EVENT_DISCONNECTED: {
        auto it = by_fd_.find(static_cast<int>(e->value));
        if (it == by_fd_.end()) break;  // a peer that never sent a whole message
        const connection_id id = it->second;
        by_fd_.erase(it);
        auto c = conns_.find(id);
        if (c == conns_.end()) break;
        c->second->peer_fd = -1;
        c->second->shared->peer_gone.store(true);
        spdlog::debug("zmq transport: incoming connection {} ({}) disconnected", id, c->second->routing_id);
        mark_down(*c->second);
        break;
      }
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        break;  // the ZAP handler has logged and reported the refused key
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
        const std::string reason = "a peer connecting to " + e->endpoint + " was refused: " +
                                   detail::describe_handshake_failure(*e);
        if (detail::is_auth_failure(*e)) {
          spdlog::warn("zmq transport: {}", reason);
          notify(events_.on_auth_failure, "on_auth_failure", connection_id{0}, reason);
        } else {
          spdlog::debug("zmq transport: {}", reason);
        }
        break;
      }
      default: break;
    }
  }
}

void zmq_transport::impl::drain_dealer_monitor(connection& c) {
  while (auto e = detail::read_monitor_event(c.monitor)) {
    switch (e->event) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        if (!c.established) {
          c.established = true;
          spdlog::debug("zmq transport: connection {} to {} is up", c.id, c.endpoint);
          notify(events_.on_connect, "on_connect", c.id);
        }
        break;
      case ZMQ_EVENT_DISCONNECTED:
        spdlog::debug("zmq transport: connection {} to {} dropped", c.id, c.endpoint);
        mark_down(c);
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
        const std::string reason = "connection " + std::to_string(c.id) + " to " + c.endpoint + ": " +
                                   detail::describe_handshake_failure(*e);
        if (detail::is_auth_failure(*e)) {
          spdlog::warn("zmq transport: {}", reason);
          notify(events_.on_auth_failure, "on_auth_failure", c.id, reason);
        } else {
          spdlog::debug("zmq transport: {}", reason);
        }
        break;
      }
      default: break;
    }
  }
}

void zmq_transport::impl::mark_down(connection& c) {
  // Half-received fragmented messages will not be completed; half-sent ones
  // cannot be (the peer dropped its part).
  c.in.clear();
  c.unacked_fragment_bytes = 0;  // credits for what was in flight will not come
  if (const std::size_t dropped = c.out.drop_started(); dropped > 0) {
    spdlog::debug("zmq transport: connection {} lost: {} partly sent large messages dropped", c.id, dropped);
    c.shared->queued.fetch_sub(dropped);
  }
  if (c.rdma) {
    c.rdma->reset();  // the peer may be gone; a new hello offers again
    items_dirty_ = true;
  }
  if (!c.established) return;
  c.established = false;
  notify(events_.on_disconnect, "on_disconnect", c.id);
}

// ---- receiving ------------------------------------------------------------------

connection* zmq_transport::impl::incoming_for(const std::string& routing_id, int fd) {
  auto known = by_routing_id_.find(routing_id);
  if (known == by_routing_id_.end()) {
    auto c = std::make_unique<connection>();
    c->id = next_id_.fetch_add(1);
    c->routing_id = routing_id;
    c->shaper = link_shaper(opts_.default_profile, opts_.shaping_seed + c->id);
    set_link(*c, opts_.default_profile);
    c->in = reassembler(opts_.limits);
    c->shared = std::make_shared<conn_shared>();
    c->established = true;
    c->peer_fd = fd;
    if (fd >= 0) {
      if (by_fd_.count(fd)) drain_router_monitor();  // a reused descriptor: settle the old owner first
      by_fd_[fd] = c->id;
    }
    register_shared(c->id, c->shared);
    by_routing_id_[routing_id] = c->id;
    connection* raw = c.get();
    conns_[c->id] = std::move(c);
    spdlog::debug("zmq transport: incoming connection {} from routing id of {} bytes", raw->id, routing_id.size());
    notify(events_.on_accept, "on_accept", raw->id, routing_id);
    return raw;
  }
  connection& c = *conns_.at(known->second);
  if (fd >= 0 && fd != c.peer_fd) {
    // A new TCP connection behind this routing id (handover after a restart
    // or a reconnect), or a descriptor reused after another peer left:
    // report pending disconnects first so the order of events is right.
    drain_router_monitor();
    if (c.peer_fd >= 0) {
      auto old = by_fd_.find(c.peer_fd);
      if (old != by_fd_.end() && old->second == c.id) by_fd_.erase(old);
    }
    c.peer_fd = fd;
    by_fd_[fd] = c.id;
    c.in.clear();  // a new TCP connection does not continue a half-received message
  }
  if (!c.established) {
    c.established = true;
    c.shared->peer_gone.store(false);
    spdlog::debug("zmq transport: incoming connection {} is back", c.id);
    notify(events_.on_connect, "on_connect", c.id);
  }
  return &c;
}

void zmq_transport::impl::receive_from(void* socket, connection* dealer) {
  // Routing id (ROUTER only), envelope, at most max_tensors tensor frames,
  // plus one so that decode() can name an excess.
  const std::size_t max_parts = opts_.limits.max_tensors + 2 + (dealer ? 0 : 1);
  std::vector<std::shared_ptr<detail::received_part>> parts;
  std::vector<in_frame> frames;
  for (int n = 0; n < receive_batch; ++n) {
    parts.clear();
    auto first = std::make_shared<detail::received_part>();
    if (zmq_msg_recv(static_cast<zmq_msg_t*>(first->msg()), socket, ZMQ_DONTWAIT) < 0) {
      if (zmq_errno() != EAGAIN) spdlog::error("zmq transport: {}", zmq_error_text("receive"));
      return;
    }
    std::size_t bytes = first->size(), dropped_parts = 0;
    bool more = first->more();
    parts.push_back(std::move(first));
    while (more) {  // the rest of a multi-part message is already here
      auto part = std::make_shared<detail::received_part>();
      if (zmq_msg_recv(static_cast<zmq_msg_t*>(part->msg()), socket, 0) < 0) break;
      bytes += part->size();
      more = part->more();
      if (parts.size() < max_parts)
        parts.push_back(std::move(part));
      else
        ++dropped_parts;  // bounded memory for a message of a million frames
    }

    connection* c = dealer;
    std::size_t first_frame = 0;
    if (!dealer) {
      const std::string routing_id(static_cast<const char*>(parts[0]->data()), parts[0]->size());
      // The ROUTER makes the routing-id frame itself and leaves its source
      // descriptor unset (-1); the peer's own frames carry it.
      const int fd = parts.size() > 1 ? zmq_msg_get(static_cast<zmq_msg_t*>(parts[1]->msg()), ZMQ_SRCFD) : -1;
      spdlog::trace("zmq transport: message from fd {}", fd);
      c = incoming_for(routing_id, fd);
      bytes -= parts[0]->size();
      first_frame = 1;
    }
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    if (c->shared->closed.load()) continue;

    std::string reason;
    if (dropped_parts > 0) {
      reason = "message of " + std::to_string(parts.size() - first_frame + dropped_parts) +
               " frames exceeds the limit of " + std::to_string(opts_.limits.max_tensors) + " tensors";
    } else if (parts.size() <= first_frame) {
      reason = "message without frames";
    } else {
      frames.clear();
      for (std::size_t i = first_frame; i < parts.size(); ++i)
        frames.push_back(in_frame{parts[i]->data(), parts[i]->size(), parts[i]});
      if (auto credit = decode_credit(frames[0].data, frames[0].size); credit && frames.size() == 1) {
        c->unacked_fragment_bytes -= std::min<std::size_t>(c->unacked_fragment_bytes, *credit);
        continue;  // the loop's flush sends what the window now lets go
      }
      bool whole = true;
      if (is_fragment_header(frames[0].data, frames[0].size)) {
        fragments_received_.fetch_add(1, std::memory_order_relaxed);
        std::uint64_t payload = 0;
        for (std::size_t i = 1; i < frames.size(); ++i) payload += frames[i].size;
        send_credit(*c, payload);  // taken in, whatever the reassembler makes of it
        auto done = c->in.add(std::span<const in_frame>(frames));
        if (!done) {
          reason = error_text(done.error());
          whole = false;
        } else if (!*done) {
          continue;  // more fragments of it to come
        } else {
          frames = std::move(**done);
        }
      }
      auto decoded = whole ? decode(std::span<const in_frame>(frames), opts_.limits)
                           : caf::expected<message>(caf::make_error(caf::sec::invalid_argument, reason));
      if (decoded) {
        frames.clear();  // the message holds what it needs of the parts
        if (rdma::link::is_control(*decoded)) {
          if (!c->delivered && decoded->type == "rdma.offer") {
            // A queue pair pins memory: only for a peer that has said hello.
            spdlog::warn("zmq transport: RDMA offer before any message on connection {}: refused", c->id);
            message no;
            no.kind = message_kind::oneway;
            no.type = "rdma.refuse";
            const std::string why = "offer before the hello";
            no.body.assign(why.begin(), why.end());
            send_over_zmq(*c, no);
            continue;
          }
          rdma_of(*c).on_control(*decoded);
          items_dirty_ = true;  // a queue pair may have come or gone
          after_rdma(*c);
          continue;
        }
        messages_received_.fetch_add(1, std::memory_order_relaxed);
        c->delivered = true;
        if (!dealer && opts_.curve.enabled) {
          // ZAP made the client's key the connection's user id (curve.cpp).
          if (const char* key = zmq_msg_gets(static_cast<zmq_msg_t*>(parts[first_frame]->msg()), "User-Id"))
            decoded->peer_key = key;
        }
        notify(events_.on_message, "on_message", c->id, std::move(*decoded));
        continue;
      }
      reason = error_text(decoded.error());
    }
    bad_messages_.fetch_add(1, std::memory_order_relaxed);
    if (c->bad_log.allow())
      spdlog::warn("zmq transport: dropped a bad message on connection {}: {}{}", c->id, reason, c->bad_log.note());
    notify(events_.on_bad_message, "on_bad_message", c->id, reason);
  }
}

}  // namespace corolla::net
