// tests/fuzz/fuzz_input.hpp — how one fuzzer input becomes the frames of a
// wire message (shared by the fuzz target and the seed corpus writer).
//
//   byte 0: bits 0-5 = frame count - 1 (1..64)
//           bit 6    = decode with verify_checksums off
//           bit 7    = hand frames over in 64-byte aligned buffers with an
//                      owner (the zero-copy adoption path); otherwise each
//                      frame starts one byte past an aligned address and has
//                      no owner (the copying path, and an unaligned envelope)
//   then per frame: u16 little-endian length, then that many bytes (clamped
//           to what is left; frames past the end of the input are empty).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "net/codec.hpp"
#include "net/fragment.hpp"

namespace corolla::fuzz {

struct fuzz_frames {
  std::vector<net::in_frame> frames;
  std::vector<std::shared_ptr<unsigned char>> buffers;  // keeps the bytes alive
  bool verify_checksums = true;
};

/// Each frame gets its own exactly sized heap block (plus the shift), so
/// AddressSanitizer sees any read past a frame's end.
inline fuzz_frames split_input(const std::uint8_t* data, std::size_t size) {
  fuzz_frames out;
  if (size == 0) return out;
  const unsigned count = (data[0] & 0x3f) + 1;
  out.verify_checksums = (data[0] & 0x40) == 0;
  const bool aligned_owned = (data[0] & 0x80) != 0;
  std::size_t pos = 1;
  for (unsigned i = 0; i < count; ++i) {
    std::size_t len = 0;
    if (pos + 2 <= size) {
      len = static_cast<std::size_t>(data[pos]) | (static_cast<std::size_t>(data[pos + 1]) << 8);
      pos += 2;
    } else {
      pos = size;
    }
    if (len > size - pos) len = size - pos;
    const std::size_t shift = aligned_owned ? 0 : 1;
    const std::size_t bytes = (shift + len + 63) / 64 * 64;
    std::shared_ptr<unsigned char> buf(static_cast<unsigned char*>(std::aligned_alloc(64, bytes ? bytes : 64)),
                                       [](unsigned char* p) { std::free(p); });
    if (len) std::memcpy(buf.get() + shift, data + pos, len);
    pos += len;
    net::in_frame f;
    f.data = len ? buf.get() + shift : nullptr;
    f.size = len;
    if (aligned_owned) f.owner = buf;
    out.buffers.push_back(std::move(buf));
    out.frames.push_back(std::move(f));
  }
  return out;
}

/// The inverse of split_input, for writing seed inputs.
inline std::vector<std::uint8_t> join_frames(const std::vector<net::out_frame>& frames,
                                             bool aligned_owned, bool verify_checksums = true) {
  std::vector<std::uint8_t> out;
  out.push_back(static_cast<std::uint8_t>((frames.size() - 1) | (verify_checksums ? 0 : 0x40) |
                                          (aligned_owned ? 0x80 : 0)));
  for (const auto& f : frames) {
    const auto len = static_cast<std::uint16_t>(f.size);
    out.push_back(static_cast<std::uint8_t>(len & 0xff));
    out.push_back(static_cast<std::uint8_t>(len >> 8));
    const auto* p = static_cast<const std::uint8_t*>(f.data);
    out.insert(out.end(), p, p + len);
  }
  return out;
}

/// The fragments in `frames`: each frame that starts with the fragment
/// marker begins one, the frames after it (up to the next marker) are its
/// payload.
inline std::vector<std::span<const net::in_frame>> fragment_groups(const std::vector<net::in_frame>& frames) {
  std::vector<std::span<const net::in_frame>> groups;
  std::size_t i = 0;
  while (i < frames.size()) {
    std::size_t end = i + 1;
    while (end < frames.size() && !net::is_fragment_header(frames[end].data, frames[end].size)) ++end;
    groups.emplace_back(frames.data() + i, end - i);
    i = end;
  }
  return groups;
}

}  // namespace corolla::fuzz
