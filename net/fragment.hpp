// net/fragment.hpp — large messages as fragments: the wire form of one
// fragment, and the receiver's reassembly.
//
// A message larger than the transport's fragment size is cut into pieces of
// at most that size (net/outbox.hpp) that interleave with the connection's
// other traffic, so a heartbeat or a small request never waits behind a
// whole gigabyte, and a peer moving a big tensor still looks alive. A
// fragment is one ZeroMQ message: a header frame (an 8-byte marker, then a
// wire::Fragment) and the payload frames, which are slices of the message's
// own frames (envelope, tensors) laid end to end. The receiver copies the
// slices into 64-byte aligned buffers, one per frame, and hands the whole
// frames to decode() when the last byte is in: checksums and every other
// check apply to the reassembled message as to an unfragmented one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/codec.hpp"

namespace corolla::net {

/// The first 8 bytes of a fragment's header frame. An Envelope frame cannot
/// start with FF FF FF FF (Cap'n Proto would read 2^32 segments).
inline constexpr unsigned char fragment_marker[8] = {0xff, 0xff, 0xff, 0xff, 'f', 'r', 'a', 'g'};

/// True when `frame` is a fragment's header frame (starts with the marker).
bool is_fragment_header(const void* data, std::size_t size);

/// A credit: the receiver of fragments tells the sender it has taken in
/// `bytes` more of their payload (one frame: FF FF FF FF 'f' 'c' 'r' 'd',
/// then the count as 8 bytes little-endian). The sender keeps at most a
/// window of fragment bytes unacknowledged, so a receiver slower than the
/// link does not queue a whole transfer in front of the next small message.
out_frame encode_credit(std::uint64_t bytes);
/// The count of a credit frame; nothing when `data` is not one (or is malformed).
std::optional<std::uint64_t> decode_credit(const void* data, std::size_t size);

/// What a fragment's header says.
struct fragment_header {
  std::uint64_t message_id = 0;            ///< per connection and direction, from 1
  std::uint64_t position = 0;              ///< offset of the payload in the message's bytes
  std::vector<std::uint64_t> frame_sizes;  ///< first fragment (position 0) only
};

/// The header frame of one fragment (marker + wire::Fragment).
out_frame encode_fragment_header(const fragment_header& h);
/// Parses a header frame; an error naming what is wrong.
caf::expected<fragment_header> decode_fragment_header(const void* data, std::size_t size);

/// Reassembles the fragmented messages of one connection and direction.
/// Fragments of one message arrive in order (one ZeroMQ connection keeps
/// order), fragments of different messages may interleave. Validates every
/// header against the decoder's limits before allocating anything, and
/// bounds the messages and bytes held at once. Not thread-safe (the
/// transport's I/O thread owns it).
class reassembler {
 public:
  explicit reassembler(decode_limits limits = {});

  /// Adds one fragment: `parts[0]` is the header frame, the rest its
  /// payload. Returns the frames of the message it completed (each in its
  /// own aligned buffer, which `in_frame::owner` keeps alive), an empty
  /// optional while the message is incomplete, or an error; after an error
  /// the message it belonged to is dropped, later fragments of it are
  /// refused too.
  caf::expected<std::optional<std::vector<in_frame>>> add(std::span<const in_frame> parts);

  /// Drops every incomplete message (the connection was lost: the rest of
  /// them will not come).
  void clear();

  /// How long an incomplete message may go without a fragment.
  static constexpr std::chrono::seconds partial_ttl{120};

  /// Incomplete messages held, and the bytes reserved for them.
  std::size_t partial_messages() const { return partial_.size(); }
  std::size_t reserved_bytes() const { return reserved_; }

 private:
  struct partial {
    std::vector<std::shared_ptr<unsigned char>> buffers;  ///< one per frame
    std::vector<std::uint64_t> sizes;
    std::uint64_t total = 0, received = 0;
    std::chrono::steady_clock::time_point last{};  ///< when its last fragment came
  };
  /// Drops messages that got no fragment for partial_ttl (their sender gave
  /// them up without the connection dropping), so they cannot hold the
  /// limits forever.
  void expire(std::chrono::steady_clock::time_point now);
  caf::error start(std::uint64_t id, const std::vector<std::uint64_t>& sizes, partial& p) const;

  decode_limits limits_;
  std::map<std::uint64_t, partial> partial_;
  std::size_t reserved_ = 0;
};

}  // namespace corolla::net
