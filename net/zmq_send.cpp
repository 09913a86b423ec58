// net/zmq_send.cpp — the ZeroMQ transport's sending side: each connection's
// outbox (lanes, fragments; net/outbox.hpp) feeding its link, shaping, the
// bulk window on what ZeroMQ holds, handing frames to ZeroMQ or the RDMA
// path, and the RDMA path's control messages. I/O thread only.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <string>
#include <vector>

#include "net/zmq_impl.hpp"

namespace corolla::net {

// ---- sending --------------------------------------------------------------------

void zmq_transport::impl::add_pending(connection& c) {
  if (c.listed) return;
  c.listed = true;
  with_pending_.push_back(&c);
}

void zmq_transport::impl::set_link(connection& c, const link_profile& p) {
  c.shaper.set_profile(p);
  c.shaped = !p.unshaped();
  // On a link whose rate is known (an emulated profile), a fragment takes
  // about fragment_airtime to transmit, so a small message never waits
  // longer than that behind one: 1 Gbit/s keeps the configured 1 MiB,
  // 100 Mbit/s gets 104 KiB pieces, 10 Mbit/s the 64 KiB minimum. The rate
  // of a real NIC path is unknown here: the configured size.
  std::size_t bytes = opts_.fragment_bytes;
  if (bytes > 0 && p.bandwidth_bps > 0) {
    const double airtime_bytes = p.bandwidth_bps / 8 * std::chrono::duration<double>(fragment_airtime).count();
    bytes = std::clamp(static_cast<std::size_t>(airtime_bytes), std::min(min_fragment_bytes, bytes), bytes);
  }
  c.out.set_fragment_bytes(bytes);
  // Fragments in flight on the emulated link: its bandwidth-delay product
  // (two without a bandwidth limit, where only the latency holds them).
  // Credits come back over the peer's link, shaped alike: the window
  // covers the round trip.
  c.max_pending_fragments = 2;
  c.credit_window = min_credit_window;
  if (bytes > 0 && p.bandwidth_bps > 0) {
    const double delay_s = p.latency_s + p.jitter_s + std::chrono::duration<double>(shaping_lookahead).count();
    c.max_pending_fragments += static_cast<std::size_t>(std::ceil(p.bandwidth_bps / 8 * delay_s / static_cast<double>(bytes)));
    c.credit_window = std::max(c.credit_window, 2 * c.max_pending_fragments * bytes);
  }
}

void zmq_transport::impl::enqueue(connection& c, out_message&& m, clock_type::time_point now) {
  c.out.push(std::move(m));
  if (c.rdma_blocked || (c.blocked && c.outgoing))
    pump(c, now);  // what may go joins `pending`; POLLOUT or the RDMA path's drain sends it
  else
    flush(c, now);
  if (!c.out.empty() || !c.pending.empty()) add_pending(c);
}

void zmq_transport::impl::pump(connection& c, clock_type::time_point now) {
  for (;;) {
    // Fragments go on while ZeroMQ holds less than the window of them, and
    // (shaped) the emulated link frees up within the lookahead, or
    // (unshaped) the last one has reached ZeroMQ: so whatever is sent next
    // waits behind at most about a window of bytes.
    // (A shaped link also holds at most its bandwidth-delay product of
    // them waiting for their delivery time: with no bandwidth limit the
    // link never looks busy.)
    const bool room = c.shared->bulk_in_zmq.load(std::memory_order_relaxed) < bulk_window_ &&
                      c.unacked_fragment_bytes < c.credit_window &&
                      (c.shaped ? c.shaper.link_free() <= now + shaping_lookahead &&
                                      c.pending_fragments < c.max_pending_fragments
                                : c.pending_fragments == 0);
    // The RDMA path moves a large message without holding up the rest.
    const bool rdma = c.rdma && c.rdma->sending();
    auto unit = c.out.next(room, !rdma);
    if (!unit) return;
    // The path is chosen here, not when the unit leaves `pending`: a unit
    // queued before the RDMA path came up stays on ZeroMQ, in order with the
    // fragments after it (which always go over ZeroMQ).
    if (!rdma) unit->tcp_only = true;
    // Shaped from the moment send() was called, not when this thread got it.
    // A fragment whose message waited for the link's window is shaped from
    // at most wake_slack ago: the link idled meanwhile, and should not make
    // up for it in a burst; within the slack, a late wake-up of this thread
    // leaves no gap between the fragments of a message.
    if (unit->fragment) unit->due = std::max(unit->due, now - wake_slack);
    unit->due = c.shaped ? c.shaper.schedule(unit->bytes, unit->due) : now;
    if (unit->fragment) ++c.pending_fragments;
    c.pending.push_back(std::move(*unit));
  }
}

void zmq_transport::impl::flush(connection& c, clock_type::time_point now) {
  c.blocked = false;
  pump(c, now);
  while (!c.pending.empty() && c.pending.front().due <= now) {
    const int err = transmit(c, c.pending.front());
    if (err == EAGAIN || err == EINTR) {  // EINTR: a signal came first; the next flush tries again
      c.blocked = true;
      return;
    }
    if (err == EBUSY) {
      c.rdma_blocked = true;
      return;
    }
    const bool fragment = c.pending.front().fragment;
    if (c.pending.front().last) c.shared->queued.fetch_sub(1);
    if (fragment) --c.pending_fragments;
    c.pending.pop_front();
    if (err == EHOSTUNREACH) return peer_gone(c, "unreachable");
    if (err != 0 && c.bad_log.allow())  // ETERM, ENOTSOCK...: the socket refused the message for good
      spdlog::error("zmq transport: connection {}: {}; message lost{}", c.id, zmq_strerror(err), c.bad_log.note());
    if (fragment || c.pending.empty()) pump(c, now);  // room for the next fragment
  }
}

std::size_t zmq_transport::impl::queued_count(const connection& c) {
  std::size_t n = c.out.size();
  for (const auto& u : c.pending) n += u.last ? 1 : 0;
  return n;
}

void zmq_transport::impl::drop_queued(connection& c) {
  c.shared->queued.fetch_sub(queued_count(c));
  c.pending.clear();
  c.pending_fragments = 0;
  c.out.clear();
  c.blocked = false;
}

void zmq_transport::impl::peer_gone(connection& c, const char* why) {
  // Only a ROUTER peer can be unreachable: drop what waits for it; a
  // message from it later brings the connection back.
  spdlog::debug("zmq transport: incoming connection {} {}: dropping {} queued messages", c.id, why,
                queued_count(c));
  drop_queued(c);
  c.shared->peer_gone.store(true);
  mark_down(c);
}

int zmq_transport::impl::transmit(connection& c, const out_message& m) {
  if (c.rdma && c.rdma->sending() && !m.tcp_only) {
    if (c.rdma->backlog_full()) return EBUSY;  // waits in `pending` until the path drains
    c.rdma->send(m.frames);
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(m.bytes, std::memory_order_relaxed);
    return 0;
  }
  void* socket = c.socket;
  if (!c.outgoing) {
    socket = router_;
    if (!socket) return EHOSTUNREACH;
    const out_frame rid{c.routing_id.data(), c.routing_id.size(), nullptr};
    if (const int err = detail::send_frame(socket, rid, true); err != 0) return err;
  }
  // A fragment's payload is owned by one token while ZeroMQ holds it, so
  // the connection knows how much bulk data waits inside ZeroMQ (pump()).
  const std::vector<out_frame>* frames = &m.frames;
  std::vector<out_frame> tracked;
  if (m.fragment) {
    auto token = std::make_shared<bulk_token>();
    token->shared = c.shared;
    token->wake_fd = wake_fd_;
    tracked.reserve(m.frames.size());
    tracked.push_back(m.frames[0]);
    for (std::size_t i = 1; i < m.frames.size(); ++i) {
      token->owners.push_back(m.frames[i].owner);
      token->bytes += m.frames[i].size;
      tracked.push_back(out_frame{m.frames[i].data, m.frames[i].size, std::shared_ptr<const void>(token, m.frames[i].data)});
    }
    c.shared->bulk_in_zmq.fetch_add(token->bytes, std::memory_order_relaxed);
    frames = &tracked;
  }
  for (std::size_t i = 0; i < frames->size(); ++i) {
    const int err = detail::send_frame(socket, (*frames)[i], i + 1 < frames->size());
    if (err == 0) continue;
    // Once the first part is accepted ZeroMQ takes the rest of the message
    // (the high-water mark counts whole messages), so only part 0 can fail
    // with EAGAIN or EHOSTUNREACH.
    if (i == 0 && c.outgoing) return err;
    spdlog::error("zmq transport: connection {}: {} (frame {} of {}); message lost", c.id,
                  zmq_strerror(err), i + 1, m.frames.size());
    return 0;
  }
  if (m.fragment) {
    fragments_sent_.fetch_add(1, std::memory_order_relaxed);
    // Counted once it went out: a fragment refused (EAGAIN) is sent again.
    c.unacked_fragment_bytes += m.bytes - m.frames[0].size;
  }
  if (m.last) messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(m.bytes, std::memory_order_relaxed);
  return 0;
}

// ---- RDMA path --------------------------------------------------------------------

rdma::link& zmq_transport::impl::rdma_of(connection& c) {
  if (c.rdma) return *c.rdma;
  const connection_id id = c.id;
  rdma::link::hooks h;
  h.send_control = [this, id](message&& m) {
    auto it = conns_.find(id);
    if (it != conns_.end()) send_over_zmq(*it->second, m);
  };
  h.deliver = [this, id](message&& m) {
    std::uint64_t bytes = m.body.size();
    for (const auto& t : m.tensors) bytes += t.defined() ? t.nbytes() : 0;
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    messages_received_.fetch_add(1, std::memory_order_relaxed);
    rdma_messages_received_.fetch_add(1, std::memory_order_relaxed);
    notify(events_.on_message, "on_message", id, std::move(m));
  };
  h.bad = [this, id](const std::string& reason) {
    bad_messages_.fetch_add(1, std::memory_order_relaxed);
    auto it = conns_.find(id);
    if (it != conns_.end() && it->second->bad_log.allow())
      spdlog::warn("zmq transport: dropped a bad RDMA message on connection {}: {}{}", id, reason,
                   it->second->bad_log.note());
    notify(events_.on_bad_message, "on_bad_message", id, reason);
  };
  h.changed = [this, id](bool up, const std::string& reason) {
    spdlog::log(up ? spdlog::level::info : spdlog::level::debug, "zmq transport: connection {} {} RDMA: {}", id,
                up ? "now runs over" : "does not use", reason);
    notify(events_.on_rdma, "on_rdma", id, up, reason);
  };
  h.admit = [this]() -> std::string {
    std::size_t open = 0;
    for (connection_id other : with_rdma_) {
      auto it = conns_.find(other);
      if (it != conns_.end() && it->second->rdma && it->second->rdma->has_queue_pair()) ++open;
    }
    if (open >= max_queue_pairs)
      return "this node already has " + std::to_string(open) + " RDMA queue pairs (the limit)";
    return "";
  };
  c.rdma = std::make_unique<rdma::link>(opts_.rdma_device, opts_.limits, opts_.send_checksums, std::move(h));
  with_rdma_.insert(id);
  return *c.rdma;
}

void zmq_transport::impl::send_over_zmq(connection& c, const message& m) {
  out_message o;
  o.frames = encode(m, false);
  for (const auto& f : o.frames) o.bytes += f.size;
  o.tcp_only = true;
  o.barrier = true;  // switch markers keep the order of everything around them
  o.due = clock_type::now();
  c.shared->queued.fetch_add(1);
  enqueue(c, std::move(o), o.due);
}

void zmq_transport::impl::send_credit(connection& c, std::uint64_t bytes) {
  out_message o;
  o.frames.push_back(encode_credit(bytes));
  o.bytes = o.frames[0].size;
  o.lane = 0;  // with the heartbeats: never behind a large message
  o.tcp_only = true;
  o.due = clock_type::now();
  c.shared->queued.fetch_add(1);
  enqueue(c, std::move(o), o.due);
}

void zmq_transport::impl::rdma_progress() {
  if (with_rdma_.empty()) return;
  // Handlers run inside: walk a copy (kept in a member, so a loop turn
  // allocates nothing once it has grown).
  rdma_ids_.assign(with_rdma_.begin(), with_rdma_.end());
  for (connection_id id : rdma_ids_) {
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second->rdma) continue;
    connection& c = *it->second;
    const std::uint64_t before = c.rdma->messages_sent();
    if (!c.rdma->progress()) items_dirty_ = true;
    rdma_messages_sent_.fetch_add(c.rdma->messages_sent() - before, std::memory_order_relaxed);
    after_rdma(c);
  }
}

void zmq_transport::impl::after_rdma(connection& c) {
  if (c.rdma->take_failure()) report_rdma_loss(c);
  // Messages held back for the RDMA path go out once it drained (or over
  // ZeroMQ, if the path is gone).
  if (c.rdma_blocked && (!c.rdma->sending() || !c.rdma->backlog_full())) {
    c.rdma_blocked = false;
    flush(c, clock_type::now());
  }
}

void zmq_transport::impl::report_rdma_loss(connection& c) {
  // Messages on the lost path may be gone: report the connection down and
  // up again, as after a TCP reconnect, so links re-run their hello (over
  // TCP now) and requests in flight fail instead of hanging.
  items_dirty_ = true;
  if (!c.established) return;  // already reported down; its reconnect will say up
  notify(events_.on_disconnect, "on_disconnect", c.id);
  notify(events_.on_connect, "on_connect", c.id);
}

}  // namespace corolla::net
