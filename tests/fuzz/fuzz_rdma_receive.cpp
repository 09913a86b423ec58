// tests/fuzz/fuzz_rdma_receive.cpp — libFuzzer target for the RDMA message
// protocol's receiving side (net/rdma_channel.cpp).
//
// The input is split into frames (fuzz_input.hpp, byte 0 = count - 1); each
// frame is one SEND that a hostile peer posts into the channel's receive
// slots on the in-process fake fabric: headers, frame tables, rendezvous
// entries with arbitrary addresses and keys, FINs and credits. The channel
// must never crash, leak or read outside what arrived; it may refuse a
// message (with a reason) or fail (a READ with a bad key is a remote access
// error, as on hardware).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "net/rdma_channel.hpp"
#include "net/rdma_fake.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace corolla::net;
  auto input = corolla::fuzz::split_input(data, size);
  auto fabric = rdma::fake_fabric::create();
  auto dev = fabric->open_device();
  decode_limits limits;
  limits.verify_checksums = input.verify_checksums;
  limits.max_tensor_bytes = std::size_t{1} << 16;  // allocations stay proportional
  limits.max_tensors = 8;
  rdma::channel ch(dev->create_queue_pair(512), limits, true);
  auto peer = dev->create_queue_pair(512);
  ch.connect(peer->local_address());
  peer->connect(ch.local_address());

  // The hostile peer: one send buffer, receive slots for what the channel
  // sends back (FINs, credits), and a region it lets the channel READ.
  std::vector<std::uint8_t> out(rdma::slot_bytes), in(std::size_t{64} * rdma::slot_bytes), readable(4096, 0x5a);
  const auto out_keys = peer->register_memory(out.data(), out.size(), 0);
  const auto in_keys = peer->register_memory(in.data(), in.size(), rdma::local_write);
  peer->register_memory(readable.data(), readable.size(), rdma::remote_read);
  for (int i = 0; i < 64; ++i)
    peer->post_recv(static_cast<std::uint64_t>(i), in.data() + std::size_t(i) * rdma::slot_bytes, rdma::slot_bytes,
                    in_keys.lkey);

  std::size_t delivered = 0, refused = 0;
  auto drive = [&] {
    for (int round = 0; round < 4; ++round) {
      const bool ok = ch.progress([&](message&& m) { delivered += 1 + m.tensors.size(); },
                                  [&](const std::string& why) {
                                    if (why.empty()) __builtin_trap();  // every refusal says why
                                    ++refused;
                                  });
      rdma::completion c[16];
      for (int n = peer->poll(c, 16); n > 0; n = peer->poll(c, 16))
        for (int k = 0; k < n; ++k)
          if (c[k].what == rdma::completion::op::recv && c[k].ok)
            peer->post_recv(c[k].wr_id, in.data() + c[k].wr_id * rdma::slot_bytes, rdma::slot_bytes, in_keys.lkey);
      if (!ok) return false;
    }
    return true;
  };
  for (const auto& f : input.frames) {
    const std::size_t n = std::min<std::size_t>(f.size, out.size());
    if (n) std::memcpy(out.data(), f.data, n);
    peer->post_send(1, out.data(), static_cast<std::uint32_t>(n), out_keys.lkey);
    if (!drive()) break;
  }
  if (ch.failed() && ch.failure().empty()) __builtin_trap();  // a failure says why
  return static_cast<int>((delivered + refused) & 0);
}
