// tests/fuzz/fuzz_wire_decode.cpp — libFuzzer target for the wire decoder.
//
// The input is split into frames (fuzz_input.hpp) and handed to
// corolla::net::decode exactly as the transport would; hello bodies are
// also run through decode_hello. An input whose first frame is a fragment
// header goes through the reassembler (net/fragment.hpp) instead, frame by
// frame as fragments arrive. Decoding must never crash, hang, leak or
// read outside a frame: any such finding fails the "fuzz: wire decoder" test.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_input.hpp"
#include "net/codec.hpp"
#include "net/fragment.hpp"

namespace {

/// Frames starting with the fragment marker each begin a fragment, the
/// frames after one are its payload: every fragment goes through one
/// reassembler, and the messages it completes are decoded.
int reassemble(const corolla::fuzz::fuzz_frames& input, const corolla::net::decode_limits& limits) {
  using namespace corolla;
  net::reassembler in(limits);
  unsigned sum = 0;
  for (auto fragment : fuzz::fragment_groups(input.frames)) {
    auto done = in.add(fragment);
    if (!done) {
      if (net::error_text(done.error()).empty()) __builtin_trap();
      continue;
    }
    if (!*done) continue;
    auto m = net::decode(**done, limits);
    if (!m) continue;
    for (const auto& t : m->tensors) {
      const auto* p = static_cast<const unsigned char*>(t.raw());
      for (std::size_t b = 0; b < t.nbytes(); ++b) sum += p[b];
    }
  }
  if (in.reserved_bytes() > limits.max_reassembly_bytes) __builtin_trap();
  return static_cast<int>(sum & 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace corolla;
  auto input = fuzz::split_input(data, size);
  net::decode_limits limits;
  limits.verify_checksums = input.verify_checksums;
  // Small limits keep every allocation proportional to the input.
  limits.max_tensor_bytes = std::size_t{1} << 22;
  limits.max_reassembly_bytes = std::size_t{1} << 24;
  if (!input.frames.empty() && net::is_fragment_header(input.frames[0].data, input.frames[0].size))
    return reassemble(input, limits);
  auto m = net::decode(input.frames, limits);
  if (!m) {
    // Every rejection carries a reason.
    if (net::error_text(m.error()).empty()) __builtin_trap();
    return 0;
  }
  // Touch every decoded byte: adopted tensors must point at live memory of
  // the right size.
  unsigned sum = 0;
  for (const auto& t : m->tensors) {
    const auto* p = static_cast<const unsigned char*>(t.raw());
    for (std::size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
  }
  if (m->kind == net::message_kind::hello || m->kind == net::message_kind::hello_ack) {
    auto h = net::decode_hello(m->body);
    if (h) (void)net::check_hello(*h);
  }
  // Re-encoding what was accepted must work and decode to the same shapes.
  auto again = net::decode(
      [&] {
        std::vector<net::in_frame> in;
        for (auto& f : net::encode(*m)) in.push_back({f.data, f.size, f.owner});
        return in;
      }(),
      limits);
  if (!again || again->tensors.size() != m->tensors.size()) __builtin_trap();
  return static_cast<int>(sum & 0);
}
