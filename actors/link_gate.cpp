// What other threads may do with an up link without its actor
// (actors/link_gate.hpp).
#include "actors/link_gate.hpp"

#include <algorithm>

#include <caf/send.hpp>

#include "actors/errors.hpp"
#include "actors/node_context.hpp"
#include "kernels/env_switch.hpp"

namespace corolla {

caf::error check_peer_accepts(const peer_terms& terms, const remote_message& rm) {
  const auto has = [&](const char* cap) {
    return std::find(terms.capabilities.begin(), terms.capabilities.end(), cap) != terms.capabilities.end();
  };
  const std::uint64_t limit = terms.max_message_bytes;
  if (limit > 0 && rm.body.size() > limit)
    return make_error(errc::send_failed, "a body of " + std::to_string(rm.body.size()) + " bytes exceeds the " +
                                             std::to_string(limit) + "-byte messages peer " + terms.peer + " accepts");
  for (std::size_t i = 0; i < rm.tensors.size(); ++i) {
    const Tensor& t = rm.tensors[i];
    if (!t.defined()) continue;  // the encoder names this one
    const bool int8 = i < rm.encodings.size() && rm.encodings[i] == net::tensor_encoding::int8_block;
    if (int8 && !has("int8-tensors"))
      return make_error(errc::send_failed,
                        "peer " + terms.peer + " does not take int8 tensors (no int8-tensors in its hello)");
    // An int8 frame holds one byte per value plus an f32 scale per block.
    const std::uint64_t bytes =
        int8 ? static_cast<std::uint64_t>(t.numel()) + 4 * (static_cast<std::uint64_t>(t.numel()) / net::int8_wire_block_size + 1)
             : t.nbytes();
    if (limit > 0 && bytes > limit)
      return make_error(errc::send_failed, "tensor " + std::to_string(i) + " of " + std::to_string(bytes) +
                                               " bytes exceeds the " + std::to_string(limit) + "-byte messages peer " +
                                               terms.peer + " accepts");
  }
  return {};
}

std::uint64_t payload_bytes(const net::message& m) {
  std::uint64_t n = m.body.size();
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    if (!t.defined()) continue;
    const bool int8 = i < m.encodings.size() && m.encodings[i] == net::tensor_encoding::int8_block;
    const auto numel = static_cast<std::uint64_t>(t.numel());
    n += int8 ? numel + sizeof(float) * ((numel + net::int8_wire_block_size - 1) / net::int8_wire_block_size)
              : t.nbytes();
  }
  return n;
}

remote_message delivered(net::message& m, const std::string& from_node) {
  remote_message rm;
  rm.type = std::move(m.type);
  rm.body = std::move(m.body);
  rm.tensors = std::move(m.tensors);
  rm.encodings = std::move(m.encodings);
  rm.from_node = from_node;
  rm.from_actor = std::move(m.sender_actor);
  return rm;
}

net::message wire_message(net::message_kind kind, remote_message& rm) {
  net::message m;
  m.kind = kind;
  m.type = std::move(rm.type);
  m.body = std::move(rm.body);
  m.tensors = std::move(rm.tensors);
  m.encodings = std::move(rm.encodings);
  return m;
}

// -- the gate ------------------------------------------------------------------

namespace {

/// COROLLA_LINK_GATE=0 (or off, false, no) keeps every message with the
/// link actors (to measure what the gates save, or to rule them out).
bool gates_enabled() {
  static const bool enabled = env_switch("COROLLA_LINK_GATE", true);
  return enabled;
}

}  // namespace

void link_gate::open(peer_terms terms) {
  if (!gates_enabled()) return;
  auto t = std::make_shared<const peer_terms>(std::move(terms));
  std::lock_guard lock(mutex_);
  terms_ = std::move(t);
}

void link_gate::close() {
  std::lock_guard lock(mutex_);
  terms_.reset();
}

std::shared_ptr<const peer_terms> link_gate::terms() const {
  std::lock_guard lock(mutex_);
  return terms_;
}

void link_gate::count_received(std::uint64_t bytes) {
  last_rx_.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  messages_received_.fetch_add(1, std::memory_order_relaxed);
  bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  window_received_.fetch_add(bytes, std::memory_order_relaxed);
}

void link_gate::count_sent(std::uint64_t bytes) {
  messages_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  window_sent_.fetch_add(bytes, std::memory_order_relaxed);
}

link_gate::traffic link_gate::totals() const {
  return {messages_sent_.load(std::memory_order_relaxed), messages_received_.load(std::memory_order_relaxed),
          bytes_sent_.load(std::memory_order_relaxed), bytes_received_.load(std::memory_order_relaxed)};
}

std::pair<std::uint64_t, std::uint64_t> link_gate::take_window() {
  return {window_received_.exchange(0, std::memory_order_relaxed), window_sent_.exchange(0, std::memory_order_relaxed)};
}

link_gate::clock::time_point link_gate::last_received() const {
  return clock::time_point(clock::duration(last_rx_.load(std::memory_order_relaxed)));
}

// -- the fast paths ------------------------------------------------------------

bool deliver_through_gate(node_context& ctx, link_gate& gate, net::message& m) {
  if (m.kind != net::message_kind::oneway) return false;
  // Everything the link actor got before must have reached its actor first.
  if (gate.inbound_queued.load(std::memory_order_acquire) != 0) return false;
  const auto terms = gate.terms();
  if (!terms || ctx.stopping.load(std::memory_order_relaxed)) return false;
  // A forged sender, an unknown target and a partition are the link
  // actor's to refuse, report or drop.
  if (!m.sender_node.empty() && m.sender_node != terms->peer) return false;
  if (ctx.drops(terms->peer)) return false;
  auto target = ctx.directory.find(m.target_actor);
  if (!target) return false;
  gate.count_received(payload_bytes(m));
  caf::anon_send(target, delivered(m, terms->peer));
  return true;
}

bool post_through_gate(node_context& ctx, link_gate& gate, const std::string& target, const std::string& sender,
                       remote_message& rm, caf::error& error) {
  // Earlier posts still with the link actor go first.
  if (gate.outbound_queued.load(std::memory_order_acquire) != 0) return false;
  const auto terms = gate.terms();
  if (!terms) return false;
  auto transport = ctx.transport();
  if (!transport) return false;
  error = check_peer_accepts(*terms, rm);
  if (error) return true;
  if (ctx.drops(terms->peer)) return true;  // a harness's partition: lost on the way
  net::message m = wire_message(net::message_kind::oneway, rm);
  m.target_actor = target;
  m.sender_actor = sender;
  m.sender_node = ctx.node_id;
  m.sent_at_ns = steady_now_ns();
  const auto bytes = payload_bytes(m);
  try {
    if (!transport->send(terms->conn, m)) {
      error = make_error(errc::send_failed, "transport refused a message to " + terms->peer +
                                                " (connection closed or send queue full)");
      return true;
    }
  } catch (const std::exception& e) {
    error = make_error(errc::invalid_argument, "message to " + terms->peer + " cannot be encoded: " + e.what());
    return true;
  }
  gate.count_sent(bytes);
  return true;
}

}  // namespace corolla
