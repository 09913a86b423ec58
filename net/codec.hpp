// net/codec.hpp — encoding messages into wire frames and decoding (with full
// validation) frames received from an untrusted peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "net/message.hpp"

namespace corolla::net {

/// Limits a decoder enforces before touching any payload.
struct decode_limits {
  std::size_t max_envelope_bytes = std::size_t{1} << 20;   ///< frame 0
  std::size_t max_tensor_bytes = std::size_t{1} << 30;     ///< one tensor frame
  std::size_t max_tensors = 64;
  std::size_t max_rank = 8;
  std::size_t max_string_bytes = 4096;                      ///< ids, names, types
  /// Fragmented messages (net/fragment.hpp) one connection may have
  /// half-received at once, and the bytes reserved for them together.
  std::size_t max_partial_messages = 64;
  std::size_t max_reassembly_bytes = std::size_t{4} << 30;
  bool verify_checksums = true;
};

/// One frame to send: bytes that stay valid until `owner` is released.
/// Tensor frames point into the tensor's storage (no copy); `owner` keeps
/// the storage alive until the transport has sent the frame.
struct out_frame {
  const void* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<const void> owner;
};

/// A received frame. If `owner` is set, the bytes stay valid while it lives
/// and aligned tensor frames are adopted without copying.
struct in_frame {
  const void* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<const void> owner;
};

/// Frames of `m`: envelope first, then one per tensor. Tensors with an
/// int8_block encoding are quantised here (f32 only). Checksums (XXH3-64)
/// of every tensor frame go into the envelope.
std::vector<out_frame> encode(const message& m, bool with_checksums = true);

/// Decodes and validates frames from a peer: envelope structure and size,
/// string lengths, kinds, tensor count = frame count, dtype, rank, shape
/// products equal to byte sizes (no overflow), checksums. Any violation is
/// an error naming what was wrong; nothing is read past a frame's size.
caf::expected<message> decode(std::span<const in_frame> frames, const decode_limits& limits = {});

/// Body of hello / hello_ack messages (wire::Hello).
struct hello_info {
  std::uint32_t protocol_version = 0;
  std::string node_id;
  std::string listen_endpoint;            ///< "" for a node that does not listen
  std::string nic_class;                  ///< "ib", "roce", "ethernet", ... or ""
  std::vector<std::string> capabilities;  ///< e.g. "int8-tensors", "curve"
  std::uint64_t max_message_bytes = 0;
};
std::vector<std::uint8_t> encode_hello(const hello_info& h);
caf::expected<hello_info> decode_hello(std::span<const std::uint8_t> body);

/// XXH3-64 of a byte range (the tensor frame checksum).
std::uint64_t frame_checksum(const void* data, std::size_t size);

/// Values per f32 scale in the int8_block encoding produced by encode().
/// Receivers accept any block size in [1, max_int8_block_size] from the
/// tensor header, so the sender's choice can change without a new protocol.
inline constexpr int int8_wire_block_size = 4096;
inline constexpr std::uint32_t max_int8_block_size = std::uint32_t{1} << 24;

/// Checks a peer's hello against this build: an error naming both protocol
/// versions when they differ, or an empty node id. Default-constructed
/// (no error) when the peer is acceptable.
caf::error check_hello(const hello_info& peer);

/// The human-readable reason carried by an error from decode(),
/// decode_hello() or check_hello() ("tensor 1: header says 4096 bytes, frame
/// has 4000"); caf::to_string(e) for errors of other origins, "" for none.
std::string error_text(const caf::error& e);
/// The same for the error an expected holds; "" when it holds a value.
template <class T>
std::string error_text(const caf::expected<T>& e) {
  return e ? std::string() : error_text(e.error());
}

}  // namespace corolla::net
