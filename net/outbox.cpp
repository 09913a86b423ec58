// net/outbox.cpp — lanes, barriers and fragments of one connection's
// outgoing messages (net/outbox.hpp).
#include "net/outbox.hpp"

#include <algorithm>
#include <functional>
#include <string_view>

#include "net/fragment.hpp"

namespace corolla::net {

namespace {

/// How far down the queue next() looks for a message that may overtake:
/// bounds a pick's cost when a thousand messages wait behind a large one.
constexpr std::size_t scan_limit = 256;

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // boost::hash_combine's 64-bit step.
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

std::uint64_t nonzero(std::uint64_t h) { return h == 0 ? 1 : h; }

}  // namespace

std::uint64_t lane_of(const message& m) {
  using k = message_kind;
  const std::hash<std::string_view> text;
  switch (m.kind) {
    case k::hello:
    case k::hello_ack:
    case k::hello_reject:
    case k::heartbeat:
    case k::heartbeat_ack:
    case k::goodbye: return 0;
    case k::response:
    case k::error: return nonzero(mix(0x616e73, m.correlation_id));  // each answer on its own
    case k::request:
      // An anonymous requester (a scoped actor, the embedding API) waits
      // for each answer: its requests need no order among themselves.
      if (m.sender_actor.empty()) return nonzero(mix(0x726571, m.correlation_id));
      [[fallthrough]];
    case k::oneway: break;
  }
  return nonzero(mix(mix(0x6f6e65, text(m.sender_actor)), text(m.target_actor)));
}

bool is_barrier(const message& m) { return m.kind == message_kind::goodbye; }

outbox::outbox(std::size_t fragment_bytes) : fragment_bytes_(fragment_bytes) {}

void outbox::push(out_message&& m) {
  entry e;
  e.large = fragment_bytes_ > 0 && !m.barrier && !m.tcp_only && m.bytes > fragment_bytes_ + fragment_bytes_ / 16;
  e.seq = ++seq_;
  e.m = std::move(m);
  q_.push_back(std::move(e));
}

std::optional<std::size_t> outbox::eligible(std::vector<std::size_t>* large) const {
  seen_.clear();
  const std::size_t n = std::min(q_.size(), scan_limit);
  for (std::size_t i = 0; i < n; ++i) {
    const entry& e = q_[i];
    if (e.m.barrier) {
      if (i == 0) return i;  // everything before it has gone
      break;                 // nothing behind it may overtake it
    }
    if (std::find(seen_.begin(), seen_.end(), e.m.lane) != seen_.end()) continue;
    seen_.push_back(e.m.lane);
    if (!e.large) return i;
    if (large) large->push_back(i);
  }
  return std::nullopt;
}

std::size_t outbox::drop_started() {
  const auto before = q_.size();
  q_.erase(std::remove_if(q_.begin(), q_.end(), [](const entry& e) { return e.id != 0; }), q_.end());
  return before - q_.size();
}

bool outbox::small_ready() const { return eligible(nullptr).has_value(); }

std::optional<out_message> outbox::next(bool bulk, bool fragment) {
  large_.clear();
  if (auto i = eligible(&large_)) {
    out_message m = std::move(q_[*i].m);
    q_.erase(q_.begin() + static_cast<std::ptrdiff_t>(*i));
    return m;
  }
  if (!bulk || large_.empty()) return std::nullopt;
  // Large messages of different lanes take turns, in the order sent.
  std::size_t pick = large_.front();
  for (std::size_t i : large_)
    if (q_[i].seq > last_turn_) {
      pick = i;
      break;
    }
  entry& e = q_[pick];
  last_turn_ = e.seq;
  if (!fragment && e.id == 0) {
    out_message m = std::move(e.m);
    q_.erase(q_.begin() + static_cast<std::ptrdiff_t>(pick));
    return m;
  }
  out_message u = cut(e);
  if (u.last) q_.erase(q_.begin() + static_cast<std::ptrdiff_t>(pick));
  return u;
}

out_message outbox::cut(entry& e) {
  fragment_header h;
  if (e.id == 0) {
    e.id = next_id_++;
    h.frame_sizes.reserve(e.m.frames.size());
    for (const auto& f : e.m.frames) h.frame_sizes.push_back(f.size);
  }
  h.message_id = e.id;
  h.position = e.position;
  out_message u;
  u.frames.push_back(encode_fragment_header(h));
  u.bytes = u.frames.back().size;
  std::size_t budget = fragment_bytes_;
  while (budget > 0 && e.frame < e.m.frames.size()) {
    const out_frame& f = e.m.frames[e.frame];
    const std::size_t n = std::min(budget, f.size - e.offset);
    if (n > 0) {
      u.frames.push_back(out_frame{static_cast<const unsigned char*>(f.data) + e.offset, n, f.owner});
      u.bytes += n;
      budget -= n;
      e.offset += n;
      e.position += n;
    }
    if (e.offset == f.size) {
      ++e.frame;
      e.offset = 0;
    }
  }
  // Zero-byte frames at the end need no fragment of their own.
  while (e.frame < e.m.frames.size() && e.m.frames[e.frame].size == 0) ++e.frame;
  u.lane = e.m.lane;
  u.tcp_only = true;
  u.fragment = true;
  u.last = e.frame == e.m.frames.size();
  u.due = e.m.due;
  ++fragments_;
  return u;
}

}  // namespace corolla::net
