// net/rdma_channel.cpp — the RDMA message protocol (see rdma_channel.hpp).
#include "net/rdma_channel.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace corolla::net::rdma {

namespace {

constexpr std::uint32_t wire_magic = 0x31445243;  // "CRD1"
constexpr std::size_t header_bytes = 24;
constexpr std::size_t rendezvous_entry_bytes = 24;
/// Rendezvous bytes a peer may have this side reading at once.
constexpr std::uint64_t max_incoming_bytes = std::uint64_t{4} << 30;

enum class kind : std::uint8_t { eager = 1, rendezvous = 2, fin = 3, credit = 4 };

// wr_id: the top byte says what the work request was, the rest which.
enum class wr_type : std::uint64_t { recv = 1, send = 2, read = 3 };
constexpr std::uint64_t wr_id(wr_type t, std::uint64_t index) {
  return (static_cast<std::uint64_t>(t) << 56) | (index & ((std::uint64_t{1} << 56) - 1));
}

struct header {
  kind what = kind::credit;
  std::uint32_t credits = 0;
  std::uint32_t nframes = 0;
  std::uint64_t id = 0;
};

void write_header(std::uint8_t* p, const header& h) {
  std::memset(p, 0, header_bytes);
  std::memcpy(p, &wire_magic, 4);
  p[4] = static_cast<std::uint8_t>(h.what);
  std::memcpy(p + 8, &h.credits, 4);
  std::memcpy(p + 12, &h.nframes, 4);
  std::memcpy(p + 16, &h.id, 8);
}

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

void channel::buffer_deleter::operator()(std::uint8_t* p) const {
  ::operator delete[](p, std::align_val_t{64});
}

channel::aligned_buffer channel::allocate(std::size_t size) {
  auto* p = static_cast<std::uint8_t*>(::operator new[](std::max<std::size_t>(size, 1), std::align_val_t{64}));
  return aligned_buffer(p);
}

channel::channel(std::unique_ptr<queue_pair> qp, decode_limits limits, bool send_checksums)
    : limits_(limits), send_checksums_(send_checksums), qp_(std::move(qp)) {
  recv_area_ = allocate(std::size_t{recv_slots} * slot_bytes);
  send_area_ = allocate(std::size_t{send_slots} * slot_bytes);
  recv_keys_ = qp_->register_memory(recv_area_.get(), std::size_t{recv_slots} * slot_bytes, local_write);
  send_keys_ = qp_->register_memory(send_area_.get(), std::size_t{send_slots} * slot_bytes, 0);
  for (int i = 0; i < recv_slots; ++i)
    qp_->post_recv(wr_id(wr_type::recv, i), recv_area_.get() + std::size_t(i) * slot_bytes, slot_bytes,
                   recv_keys_.lkey);
  for (int i = send_slots - 1; i >= 0; --i) free_send_slots_.push_back(i);
}

channel::~channel() = default;  // qp_ goes first and takes every registration with it

void channel::connect(const qp_address& remote) { qp_->connect(remote); }

void channel::send(const message& m) { send_frames(encode(m, send_checksums_)); }

void channel::send_frames(std::vector<out_frame> frames) {
  out_message o;
  o.frames = std::move(frames);
  for (const auto& f : o.frames) o.bytes += f.size;
  out_.push_back(std::move(o));
}

bool channel::idle() const {
  return out_.empty() && fins_.empty() && rendezvous_out_.empty() && in_.empty() && reads_to_post_.empty() &&
         outstanding_ == 0;
}

std::uint64_t channel::rendezvous_bytes_out() const {
  std::uint64_t n = 0;
  for (const auto& [id, o] : rendezvous_out_) n += o.bytes;
  return n;
}

void channel::fail(const std::string& why) {
  if (failure_.empty()) failure_ = why;
}

bool channel::progress(const std::function<void(message&&)>& on_message,
                       const std::function<void(const std::string&)>& on_bad) {
  if (failed()) return false;
  completion batch[32];
  try {
    for (;;) {
      const int n = qp_->poll(batch, 32);
      for (int i = 0; i < n && !failed(); ++i) handle(batch[i]);
      if (n < 32 || failed()) break;
    }
    if (!failed()) pump();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  deliver(on_message, on_bad);
  return !failed();
}

void channel::handle(const completion& c) {
  const auto type = static_cast<wr_type>(c.wr_id >> 56);
  const std::uint64_t index = c.wr_id & ((std::uint64_t{1} << 56) - 1);
  if (!c.ok) {
    const char* what = type == wr_type::recv ? "receive" : type == wr_type::send ? "send" : "RDMA READ";
    return fail(std::string("RDMA ") + what + " failed: " + c.error);
  }
  switch (type) {
    case wr_type::recv: on_receive(static_cast<int>(index), c.bytes); break;
    case wr_type::send:
      free_send_slots_.push_back(static_cast<int>(index));
      --outstanding_;
      break;
    case wr_type::read: {
      --outstanding_;
      if (index < first_in_seq_ || index - first_in_seq_ >= in_.size()) break;  // cannot happen
      incoming& in = in_[index - first_in_seq_];
      if (--in.reads_left == 0) finish_rendezvous(in);
      break;
    }
    default: fail("RDMA completion with an unknown work request id"); break;
  }
}

void channel::on_receive(int slot, std::uint32_t bytes) {
  if (slot < 0 || slot >= recv_slots) return fail("RDMA receive completion for an unknown slot");
  std::uint8_t* p = recv_area_.get() + std::size_t(slot) * slot_bytes;
  auto repost = [&] {
    qp_->post_recv(wr_id(wr_type::recv, slot), p, slot_bytes, recv_keys_.lkey);
    ++credits_to_return_;
  };
  auto refuse = [&](const std::string& why) {
    incoming in;
    in.seq = next_in_seq_++;
    in.ready = true;
    in.bad = why;
    in_.push_back(std::move(in));
  };
  if (bytes < header_bytes || load<std::uint32_t>(p) != wire_magic) {
    // Not our protocol: nothing in it can be trusted, credits included.
    refuse("RDMA message of " + std::to_string(bytes) + " bytes without a valid header");
    return repost();
  }
  header h;
  h.what = static_cast<kind>(p[4]);
  h.credits = load<std::uint32_t>(p + 8);
  h.nframes = load<std::uint32_t>(p + 12);
  h.id = load<std::uint64_t>(p + 16);
  // A peer never returns more receives than it has.
  peer_credits_ = static_cast<int>(std::min<std::int64_t>(recv_slots, std::int64_t{peer_credits_} + h.credits));

  const std::size_t max_frames = limits_.max_tensors + 1;
  switch (h.what) {
    case kind::credit: break;
    case kind::fin: {
      auto it = rendezvous_out_.find(h.id);
      if (it == rendezvous_out_.end()) {
        if (peer_log_.allow()) spdlog::warn("rdma: FIN for unknown rendezvous {}{}", h.id, peer_log_.note());
        break;
      }
      for (const auto& k : it->second.keys) qp_->deregister(k);
      rendezvous_out_.erase(it);
      break;
    }
    case kind::eager: {
      if (h.nframes < 1 || h.nframes > max_frames) {
        refuse("RDMA eager message with " + std::to_string(h.nframes) + " frames");
        break;
      }
      const std::size_t table_end = header_bytes + 8 * std::size_t{h.nframes};
      if (table_end > bytes) {
        refuse("RDMA eager message truncated in its frame table");
        break;
      }
      std::vector<in_frame> frames(h.nframes);
      std::size_t offset = table_end;
      bool fits = true;
      for (std::uint32_t i = 0; i < h.nframes; ++i) {
        const auto size = load<std::uint64_t>(p + header_bytes + 8 * i);
        if (size > bytes - offset) {
          fits = false;
          break;
        }
        frames[i] = in_frame{p + offset, static_cast<std::size_t>(size), nullptr};
        offset += size;
      }
      if (!fits || offset != bytes) {
        refuse("RDMA eager message: frame sizes do not add up to the " + std::to_string(bytes) + " bytes received");
        break;
      }
      incoming in;
      in.seq = next_in_seq_++;
      settle(in, decode(std::span<const in_frame>(frames), limits_), bytes);  // copies out of the slot
      in_.push_back(std::move(in));
      break;
    }
    case kind::rendezvous: {
      if (h.nframes < 1 || h.nframes > max_frames ||
          header_bytes + rendezvous_entry_bytes * std::size_t{h.nframes} > bytes) {
        refuse("RDMA rendezvous message with a bad frame table (" + std::to_string(h.nframes) + " frames, " +
               std::to_string(bytes) + " bytes)");
        fins_.push_back(h.id);  // let the sender release what it holds
        break;
      }
      incoming in;
      in.seq = next_in_seq_++;
      in.rendezvous_id = h.id;
      // The table is copied out: the slot is re-posted below, and the
      // READs may have to wait for earlier rendezvous to finish.
      in.table.assign(p + header_bytes, p + header_bytes + rendezvous_entry_bytes * std::size_t{h.nframes});
      in_.push_back(std::move(in));
      start_rendezvous(in_.back(), true);
      break;
    }
    default: refuse("RDMA message of unknown kind " + std::to_string(static_cast<int>(h.what))); break;
  }
  repost();
}

void channel::start_rendezvous(incoming& in, bool may_wait) {
  auto refuse = [&](const std::string& why) {
    in.ready = true;
    in.bad = why;
    in.table.clear();
    fins_.push_back(in.rendezvous_id);
  };
  const auto nframes = static_cast<std::uint32_t>(in.table.size() / rendezvous_entry_bytes);
  const std::uint8_t* table = in.table.data();
  std::uint64_t total = 0;
  for (std::uint32_t i = 0; i < nframes; ++i) {
    const auto size = load<std::uint64_t>(table + rendezvous_entry_bytes * i);
    const std::size_t limit = i == 0 ? limits_.max_envelope_bytes : limits_.max_tensor_bytes;
    if (size > limit)
      return refuse("RDMA rendezvous frame " + std::to_string(i) + " of " + std::to_string(size) +
                    " bytes is over the limit of " + std::to_string(limit));
    if (total + size < total) return refuse("RDMA rendezvous frame sizes overflow");
    total += size;
  }
  // Past the budget a message waits (in order) until earlier ones are read;
  // one that is larger than the whole budget still goes when nothing else is
  // being read.
  in.bytes = total;
  if (may_wait && incoming_bytes_ > 0 && (incoming_bytes_ + total > max_incoming_bytes || !deferred_.empty())) {
    deferred_.push_back(in.seq);
    return;
  }
  incoming_bytes_ += total;
  for (std::uint32_t i = 0; i < nframes; ++i) {
    const std::uint8_t* e = table + rendezvous_entry_bytes * i;
    const auto size = load<std::uint64_t>(e);
    const auto remote = load<std::uint64_t>(e + 8);
    const auto rkey = load<std::uint32_t>(e + 16);
    std::shared_ptr<std::uint8_t> buf(allocate(static_cast<std::size_t>(size)).release(), buffer_deleter{});
    in.buffers.push_back(buf);
    in.sizes.push_back(static_cast<std::size_t>(size));
    if (size == 0) {
      in.keys.push_back({});
      continue;
    }
    const memory_keys k = qp_->register_memory(buf.get(), static_cast<std::size_t>(size), local_write);
    in.keys.push_back(k);
    for (std::uint64_t off = 0; off < size; off += read_chunk_bytes) {
      const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(read_chunk_bytes, size - off));
      reads_to_post_.push_back({in.seq, buf.get() + off, n, k.lkey, rkey, remote + off});
      ++in.reads_left;
    }
  }
  in.table.clear();
  if (in.reads_left == 0) finish_rendezvous(in);
}

void channel::settle(incoming& in, caf::expected<message> decoded, std::uint64_t bytes) {
  in.ready = true;
  if (decoded) {
    in.msg = std::move(*decoded);
    stats_.bytes_received += bytes;
  } else {
    in.bad = error_text(decoded.error());
  }
}

void channel::finish_rendezvous(incoming& in) {
  for (const auto& k : in.keys)
    if (k.lkey || k.rkey) qp_->deregister(k);
  in.keys.clear();
  std::vector<in_frame> frames;
  for (std::size_t i = 0; i < in.buffers.size(); ++i)
    frames.push_back(in_frame{in.buffers[i].get(), in.sizes[i], in.buffers[i]});
  settle(in, decode(std::span<const in_frame>(frames), limits_), in.bytes);  // adopts the aligned buffers
  in.buffers.clear();
  incoming_bytes_ -= in.bytes;
  fins_.push_back(in.rendezvous_id);
  // Start what waited for the budget, in arrival order.
  while (!deferred_.empty()) {
    const std::uint64_t seq = deferred_.front();
    incoming& next = in_[seq - first_in_seq_];
    if (incoming_bytes_ > 0 && incoming_bytes_ + next.bytes > max_incoming_bytes) break;
    deferred_.pop_front();
    start_rendezvous(next, false);
  }
}

bool channel::post_header(const std::vector<std::uint8_t>& head, const std::vector<out_frame>* eager_frames) {
  const int slot = free_send_slots_.back();
  std::uint8_t* p = send_area_.get() + std::size_t(slot) * slot_bytes;
  std::memcpy(p, head.data(), head.size());
  // Every SEND returns the credits gathered so far.
  const auto credits = static_cast<std::uint32_t>(credits_to_return_);
  std::memcpy(p + 8, &credits, 4);
  std::size_t size = head.size();
  if (eager_frames)
    for (const auto& f : *eager_frames) {
      if (f.size) std::memcpy(p + size, f.data, f.size);
      size += f.size;
    }
  qp_->post_send(wr_id(wr_type::send, slot), p, static_cast<std::uint32_t>(size), send_keys_.lkey);
  free_send_slots_.pop_back();
  credits_to_return_ = 0;
  --peer_credits_;
  ++outstanding_;
  return true;
}

void channel::pump() {
  // `reserve` credits stay unused: data and FINs keep one for a credit
  // message, which may take the last.
  auto can_send = [&](int reserve) {
    return peer_credits_ > reserve && !free_send_slots_.empty() && outstanding_ < max_outstanding;
  };
  std::vector<std::uint8_t> head(header_bytes);
  while (!fins_.empty() && can_send(1)) {
    write_header(head.data(), {kind::fin, 0, 0, fins_.front()});
    post_header(head, nullptr);
    fins_.pop_front();
  }
  while (!out_.empty() && can_send(1)) {
    out_message& o = out_.front();
    const auto n = static_cast<std::uint32_t>(o.frames.size());
    const std::size_t eager_size = header_bytes + 8 * std::size_t{n} + o.bytes;
    if (eager_size <= slot_bytes) {
      head.assign(header_bytes + 8 * std::size_t{n}, 0);
      write_header(head.data(), {kind::eager, 0, n, 0});
      for (std::uint32_t i = 0; i < n; ++i) {
        const std::uint64_t size = o.frames[i].size;
        std::memcpy(head.data() + header_bytes + 8 * i, &size, 8);
      }
      post_header(head, &o.frames);
      ++stats_.eager_sent;
    } else if (header_bytes + rendezvous_entry_bytes * std::size_t{n} > slot_bytes) {
      // A frame table that does not fit a slot (thousands of tensors; no
      // peer accepts that many anyway): dropped here, as the peer would.
      spdlog::error("rdma: dropping a message of {} frames: its rendezvous table does not fit a {}-byte slot", n,
                    slot_bytes);
      ++stats_.dropped;
      out_.pop_front();
      continue;
    } else {
      const std::uint64_t id = next_rendezvous_id_++;
      head.assign(header_bytes + rendezvous_entry_bytes * std::size_t{n}, 0);
      write_header(head.data(), {kind::rendezvous, 0, n, id});
      for (std::uint32_t i = 0; i < n; ++i) {
        out_frame& f = o.frames[i];
        memory_keys k{};
        if (f.size) {
          try {
            k = qp_->register_memory(const_cast<void*>(f.data), f.size, remote_read);
          } catch (const std::exception& e) {
            // Memory the device will not pin (some mappings): send a copy.
            spdlog::debug("rdma: registering a {}-byte frame failed ({}); sending a copy", f.size, e.what());
            std::shared_ptr<std::uint8_t> copy(allocate(f.size).release(), buffer_deleter{});
            std::memcpy(copy.get(), f.data, f.size);
            f.data = copy.get();
            f.owner = copy;
            k = qp_->register_memory(copy.get(), f.size, remote_read);
          }
        }
        o.keys.push_back(k);
        std::uint8_t* e = head.data() + header_bytes + rendezvous_entry_bytes * i;
        const std::uint64_t size = f.size, addr = reinterpret_cast<std::uint64_t>(f.data);
        std::memcpy(e, &size, 8);
        std::memcpy(e + 8, &addr, 8);
        std::memcpy(e + 16, &k.rkey, 4);
      }
      post_header(head, nullptr);
      ++stats_.rendezvous_sent;
      // Only registered frames need releasing on FIN.
      o.keys.erase(std::remove_if(o.keys.begin(), o.keys.end(),
                                  [](const memory_keys& k) { return k.lkey == 0 && k.rkey == 0; }),
                   o.keys.end());
      rendezvous_out_.emplace(id, std::move(o));
    }
    ++stats_.messages_sent;
    stats_.bytes_sent += eager_size;
    out_.pop_front();
  }
  if (credits_to_return_ >= recv_slots / 2 && can_send(0)) {
    write_header(head.data(), {kind::credit, 0, 0, 0});
    head.resize(header_bytes);
    post_header(head, nullptr);
  }
  while (!reads_to_post_.empty() && outstanding_ < max_outstanding) {
    const read_chunk& r = reads_to_post_.front();
    qp_->post_read(wr_id(wr_type::read, r.in_seq), r.local, r.size, r.lkey, r.remote, r.rkey);
    ++outstanding_;
    reads_to_post_.pop_front();
  }
}

void channel::deliver(const std::function<void(message&&)>& on_message,
                      const std::function<void(const std::string&)>& on_bad) {
  while (!in_.empty() && in_.front().ready) {
    incoming in = std::move(in_.front());
    in_.pop_front();
    ++first_in_seq_;
    if (in.msg) {
      ++stats_.messages_received;
      on_message(std::move(*in.msg));
    } else {
      ++stats_.bad_messages;
      on_bad(in.bad);
    }
  }
}

}  // namespace corolla::net::rdma
