// net/fragment.cpp — fragment headers and reassembly (net/fragment.hpp).
#include "net/fragment.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <caf/sec.hpp>
#include <kj/array.h>

#include "net/wire.capnp.h"

namespace corolla::net {

namespace {

constexpr std::size_t word_bytes = sizeof(capnp::word);
constexpr std::size_t marker_bytes = sizeof fragment_marker;

caf::error fail(std::string what) { return caf::make_error(caf::sec::invalid_argument, "fragment: " + what); }

/// A 64-byte aligned buffer of `size` bytes (at least one), freed with free().
std::shared_ptr<unsigned char> aligned_buffer(std::size_t size) {
  const std::size_t rounded = (std::max<std::size_t>(size, 1) + 63) / 64 * 64;
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
  if (!p) return nullptr;
  return std::shared_ptr<unsigned char>(p, [](unsigned char* q) { std::free(q); });
}

}  // namespace

bool is_fragment_header(const void* data, std::size_t size) {
  return size >= marker_bytes && std::memcmp(data, fragment_marker, marker_bytes) == 0;
}

namespace {
constexpr unsigned char credit_marker[8] = {0xff, 0xff, 0xff, 0xff, 'f', 'c', 'r', 'd'};
}  // namespace

out_frame encode_credit(std::uint64_t bytes) {
  auto buf = std::make_shared<std::array<unsigned char, 16>>();
  std::memcpy(buf->data(), credit_marker, 8);
  for (int i = 0; i < 8; ++i) (*buf)[8 + i] = static_cast<unsigned char>(bytes >> (8 * i));
  return out_frame{buf->data(), buf->size(), buf};
}

std::optional<std::uint64_t> decode_credit(const void* data, std::size_t size) {
  if (size != 16 || std::memcmp(data, credit_marker, 8) != 0) return std::nullopt;
  const auto* p = static_cast<const unsigned char*>(data) + 8;
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

out_frame encode_fragment_header(const fragment_header& h) {
  capnp::MallocMessageBuilder builder(16 + static_cast<unsigned>(h.frame_sizes.size()));
  auto f = builder.initRoot<wire::Fragment>();
  f.setMessageId(h.message_id);
  f.setPosition(h.position);
  if (!h.frame_sizes.empty()) {
    auto sizes = f.initFrameSizes(static_cast<unsigned>(h.frame_sizes.size()));
    for (unsigned i = 0; i < sizes.size(); ++i) sizes.set(i, h.frame_sizes[i]);
  }
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = std::make_shared<std::vector<unsigned char>>(marker_bytes + words.size() * word_bytes);
  std::memcpy(bytes->data(), fragment_marker, marker_bytes);
  std::memcpy(bytes->data() + marker_bytes, words.begin(), words.size() * word_bytes);
  out_frame out;
  out.data = bytes->data();
  out.size = bytes->size();
  out.owner = std::move(bytes);
  return out;
}

caf::expected<fragment_header> decode_fragment_header(const void* data, std::size_t size) {
  if (!is_fragment_header(data, size)) return fail("header frame does not start with the fragment marker");
  const std::size_t body = size - marker_bytes;
  if (body == 0 || body % word_bytes != 0 || body > 4096)
    return fail("header of " + std::to_string(body) + " bytes after the marker (want 8..4096, whole words)");
  // Copied into words: the frame need not be 8-byte aligned, and it is tiny.
  auto words = kj::heapArray<capnp::word>(body / word_bytes);
  std::memcpy(words.begin(), static_cast<const unsigned char*>(data) + marker_bytes, body);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words.size() * 2 + 64;
  options.nestingLimit = 4;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    auto f = reader.getRoot<wire::Fragment>();
    fragment_header h;
    h.message_id = f.getMessageId();
    h.position = f.getPosition();
    auto sizes = f.getFrameSizes();
    h.frame_sizes.reserve(sizes.size());
    for (auto s : sizes) h.frame_sizes.push_back(s);
    return h;
  } catch (const std::exception& e) {
    return fail(std::string("malformed header: ") + e.what());
  }
}

reassembler::reassembler(decode_limits limits) : limits_(limits) {}

void reassembler::expire(std::chrono::steady_clock::time_point now) {
  for (auto it = partial_.begin(); it != partial_.end();) {
    if (now - it->second.last < partial_ttl) {
      ++it;
      continue;
    }
    reserved_ -= it->second.total;
    it = partial_.erase(it);
  }
}

void reassembler::clear() {
  partial_.clear();
  reserved_ = 0;
}

caf::error reassembler::start(std::uint64_t id, const std::vector<std::uint64_t>& sizes, partial& p) const {
  const std::string at = "message " + std::to_string(id) + ": ";
  if (sizes.empty()) return fail(at + "first fragment lists no frame sizes");
  if (sizes.size() - 1 > limits_.max_tensors)
    return fail(at + std::to_string(sizes.size() - 1) + " tensor frames exceed the limit of " +
                std::to_string(limits_.max_tensors));
  if (sizes[0] == 0 || sizes[0] > limits_.max_envelope_bytes)
    return fail(at + "envelope of " + std::to_string(sizes[0]) + " bytes (limit " +
                std::to_string(limits_.max_envelope_bytes) + ")");
  std::uint64_t total = 0;
  for (std::size_t i = 1; i < sizes.size(); ++i) {
    if (sizes[i] > limits_.max_tensor_bytes)
      return fail(at + "tensor frame " + std::to_string(i - 1) + " of " + std::to_string(sizes[i]) +
                  " bytes exceeds the limit of " + std::to_string(limits_.max_tensor_bytes));
    total += sizes[i];  // bounded: at most max_tensors frames of max_tensor_bytes
  }
  total += sizes[0];
  if (partial_.size() >= limits_.max_partial_messages)
    return fail(at + "already " + std::to_string(partial_.size()) + " incomplete messages on this connection (the limit)");
  if (reserved_ + total > limits_.max_reassembly_bytes)
    return fail(at + std::to_string(total) + " bytes would exceed the " +
                std::to_string(limits_.max_reassembly_bytes) + " bytes held for incomplete messages");
  p.sizes = sizes;
  p.total = total;
  p.buffers.reserve(sizes.size());
  for (auto s : sizes) {
    auto b = aligned_buffer(static_cast<std::size_t>(s));
    if (!b) return fail(at + "cannot allocate " + std::to_string(s) + " bytes");
    p.buffers.push_back(std::move(b));
  }
  return {};
}

caf::expected<std::optional<std::vector<in_frame>>> reassembler::add(std::span<const in_frame> parts) {
  if (parts.empty()) return fail("no frames");
  auto h = decode_fragment_header(parts[0].data, parts[0].size);
  if (!h) return h.error();
  const auto now = std::chrono::steady_clock::now();
  auto it = partial_.find(h->message_id);
  if (h->position == 0) {
    expire(now);
    it = partial_.find(h->message_id);
    // A first fragment. One with a known id means the sender started over
    // (a restarted process behind the same routing id): the old one is dead.
    if (it != partial_.end()) {
      reserved_ -= it->second.total;
      partial_.erase(it);
    }
    partial p;
    if (auto err = start(h->message_id, h->frame_sizes, p)) return err;
    reserved_ += p.total;
    it = partial_.emplace(h->message_id, std::move(p)).first;
  } else if (it == partial_.end()) {
    return fail("message " + std::to_string(h->message_id) + ": fragment at byte " + std::to_string(h->position) +
                " of a message that was never started (or was dropped)");
  } else if (!h->frame_sizes.empty()) {
    reserved_ -= it->second.total;
    partial_.erase(it);
    return fail("message " + std::to_string(h->message_id) + ": frame sizes in a fragment that is not the first");
  }
  partial& p = it->second;
  auto drop = [&](std::string why) {
    reserved_ -= p.total;
    partial_.erase(it);
    return fail("message " + std::to_string(h->message_id) + ": " + why);
  };
  if (h->position != p.received)
    return drop("fragment at byte " + std::to_string(h->position) + ", expected byte " + std::to_string(p.received));
  std::uint64_t payload = 0;
  for (std::size_t i = 1; i < parts.size(); ++i) payload += parts[i].size;
  if (payload == 0) return drop("fragment without payload");
  if (payload > p.total - p.received)
    return drop("fragment of " + std::to_string(payload) + " bytes runs past the message's end (" +
                std::to_string(p.total - p.received) + " bytes left)");
  // Copy the payload slices to their places: walk the frames from the
  // position (fragments are few per message, frames at most max_tensors+1).
  std::size_t frame = 0;
  std::uint64_t frame_start = 0;
  std::uint64_t pos = p.received;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const auto* src = static_cast<const unsigned char*>(parts[i].data);
    std::uint64_t left = parts[i].size;
    while (left > 0) {
      while (pos >= frame_start + p.sizes[frame]) frame_start += p.sizes[frame++];
      const std::uint64_t in_frame_pos = pos - frame_start;
      const std::uint64_t n = std::min(left, p.sizes[frame] - in_frame_pos);
      std::memcpy(p.buffers[frame].get() + in_frame_pos, src, n);
      src += n;
      left -= n;
      pos += n;
    }
  }
  p.received = pos;
  p.last = now;
  if (p.received < p.total) return std::optional<std::vector<in_frame>>{};
  std::vector<in_frame> frames;
  frames.reserve(p.sizes.size());
  for (std::size_t i = 0; i < p.sizes.size(); ++i)
    frames.push_back(in_frame{p.buffers[i].get(), static_cast<std::size_t>(p.sizes[i]), p.buffers[i]});
  reserved_ -= p.total;
  partial_.erase(it);
  return std::optional<std::vector<in_frame>>(std::move(frames));
}

}  // namespace corolla::net
