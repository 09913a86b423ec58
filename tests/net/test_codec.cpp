// Wire codec: round trips of every field and dtype, zero-copy adoption of
// aligned frames, and rejection (with the right reason) of everything a
// hostile or broken peer can send.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "kernels/half.hpp"
#include "net/codec.hpp"
#include "net/wire.capnp.h"

using namespace corolla;
using namespace corolla::net;

namespace {

/// The receiving side of a transport that hands over the sender's buffers
/// as they are (pointers and owners), like ZeroMQ's zero-copy messages.
std::vector<in_frame> as_received(const std::vector<out_frame>& out) {
  std::vector<in_frame> in;
  for (const auto& f : out) in.push_back({f.data, f.size, f.owner});
  return in;
}

/// Copies every frame into its own buffer starting `shift` bytes past a
/// 64-byte boundary (a transport whose buffers are misaligned).
struct shifted_frames {
  std::vector<std::shared_ptr<std::vector<unsigned char>>> buffers;
  std::vector<in_frame> frames;
  shifted_frames(const std::vector<out_frame>& out, std::size_t shift, bool with_owner) {
    for (const auto& f : out) {
      auto buf = std::make_shared<std::vector<unsigned char>>(f.size + 128);
      auto base = reinterpret_cast<std::uintptr_t>(buf->data());
      unsigned char* p = buf->data() + ((64 - base % 64) % 64) + shift;
      if (f.size) std::memcpy(p, f.data, f.size);
      buffers.push_back(buf);
      frames.push_back({p, f.size, with_owner ? std::shared_ptr<const void>(buf) : nullptr});
    }
  }
};

Tensor random_tensor(shape_t shape, dtype t, std::uint32_t seed) {
  Tensor x = Tensor::empty(shape, t);
  std::mt19937 rng(seed);
  auto* bytes = static_cast<unsigned char*>(x.raw());
  for (std::size_t i = 0; i < x.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::string reason_of(const caf::expected<message>& r) {
  REQUIRE_FALSE(r);
  return error_text(r.error());
}

message sample_message() {
  message m;
  m.kind = message_kind::request;
  m.sender_node = "node-a";
  m.sender_actor = "trainer";
  m.target_actor = "stage-3";
  m.correlation_id = 0x1234567890abcdefull;
  m.type = "activations";
  m.body = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  m.sent_at_ns = 987654321;
  m.tensors.push_back(random_tensor({4, 256}, dtype::f32, 1));
  return m;
}

/// A hand-built envelope (for inputs encode() would never produce) plus
/// tensor frames.
struct crafted {
  capnp::MallocMessageBuilder builder;
  kj::Array<capnp::word> words;
  std::vector<std::vector<unsigned char>> payloads;
  std::vector<in_frame> frames;
  wire::Envelope::Builder env() { return builder.getRoot<wire::Envelope>(); }
  crafted() { builder.initRoot<wire::Envelope>().setKind(wire::MessageKind::ONEWAY); }
  /// A tensor header for a shape plus a frame of `frame_bytes` zero bytes.
  void add_payload(std::size_t frame_bytes) { payloads.emplace_back(frame_bytes, 0); }
  std::vector<in_frame>& finish() {
    words = capnp::messageToFlatArray(builder);
    frames = {{words.begin(), words.size() * sizeof(capnp::word), nullptr}};
    for (auto& p : payloads) frames.push_back({p.data(), p.size(), nullptr});
    return frames;
  }
};

/// An envelope with one f32 tensor header of `shape` and `byte_size`.
void one_header(crafted& c, std::initializer_list<std::int64_t> shape, std::uint64_t byte_size,
                wire::DType t = wire::DType::F32) {
  auto hs = c.env().initTensors(1);
  hs[0].setDtype(t);
  auto s = hs[0].initShape(static_cast<unsigned>(shape.size()));
  unsigned i = 0;
  for (auto d : shape) s.set(i++, d);
  hs[0].setByteSize(byte_size);
}

}  // namespace

TEST_CASE("codec round trip keeps every field and every dtype bit-exact") {
  message m = sample_message();
  m.kind = message_kind::error;
  m.error_code = "unknown_actor";
  m.error_message = "no actor named stage-3 on node-b";
  m.tensors.clear();
  const std::vector<shape_t> shapes = {{2, 3, 5}, {}, {0}, {3, 0, 2}, {17}};
  std::uint32_t seed = 10;
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::i32, dtype::i8})
    for (const auto& s : shapes) m.tensors.push_back(random_tensor(s, t, seed++));

  for (bool checksums : {true, false}) {
    auto frames = encode(m, checksums);
    REQUIRE(frames.size() == 1 + m.tensors.size());
    auto in = as_received(frames);
    auto r = decode(in);
    REQUIRE_MESSAGE(r, error_text(r));
    CHECK(r->kind == message_kind::error);
    CHECK(r->sender_node == "node-a");
    CHECK(r->sender_actor == "trainer");
    CHECK(r->target_actor == "stage-3");
    CHECK(r->correlation_id == 0x1234567890abcdefull);
    CHECK(r->type == "activations");
    CHECK(r->body == m.body);
    CHECK(r->sent_at_ns == 987654321);
    CHECK(r->error_code == "unknown_actor");
    CHECK(r->error_message == "no actor named stage-3 on node-b");
    CHECK(r->encodings.empty());
    REQUIRE(r->tensors.size() == m.tensors.size());
    for (std::size_t i = 0; i < m.tensors.size(); ++i)
      CHECK_MESSAGE(same_bytes(r->tensors[i], m.tensors[i]), "tensor " << i);
    // The shape [] is a scalar with one element, not an empty tensor.
    CHECK(r->tensors[1].numel() == 1);
    CHECK(r->tensors[2].numel() == 0);
  }
}

TEST_CASE("codec round trip of every message kind, an empty message and the tensor limit") {
  for (int k = 0; k <= static_cast<int>(message_kind::goodbye); ++k) {
    message m;
    m.kind = static_cast<message_kind>(k);
    auto r = decode(as_received(encode(m)));
    REQUIRE(r);
    CHECK(r->kind == m.kind);
    CHECK(r->tensors.empty());
    CHECK(r->body.empty());
    CHECK(std::string(kind_name(m.kind)) != "unknown");
  }
  CHECK(std::string(kind_name(message_kind::heartbeat_ack)) == "heartbeat_ack");

  message many;
  decode_limits limits;
  for (std::size_t i = 0; i < limits.max_tensors; ++i)
    many.tensors.push_back(random_tensor({static_cast<std::int64_t>(i + 1)}, dtype::i32, 100 + i));
  auto r = decode(as_received(encode(many)), limits);
  REQUIRE(r);
  REQUIRE(r->tensors.size() == limits.max_tensors);
  for (std::size_t i = 0; i < limits.max_tensors; ++i) CHECK(same_bytes(r->tensors[i], many.tensors[i]));
}

TEST_CASE("int8_block encoding quantises f32 tensors within half a step per block") {
  message m;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const std::int64_t n = 2 * int8_wire_block_size + 123;  // two full blocks and a partial one
  std::vector<float> values(static_cast<std::size_t>(n));
  for (auto& v : values) v = normal(rng);
  values[5] = 40.0f;  // an outlier only coarsens its own block
  m.tensors.push_back(Tensor::from_f32(values, {n}));
  m.tensors.push_back(random_tensor({3, 3}, dtype::i32, 3));  // raw next to int8
  m.tensors.push_back(Tensor::from_f32(std::vector<float>{0, 0, 0}, {3}));  // all-zero block
  m.tensors.push_back(Tensor::empty({0, 4}, dtype::f32));
  m.encodings = {tensor_encoding::int8_block, tensor_encoding::raw, tensor_encoding::int8_block,
                 tensor_encoding::int8_block};
  auto frames = encode(m);
  const std::int64_t blocks = (n + int8_wire_block_size - 1) / int8_wire_block_size;
  CHECK(frames[1].size == static_cast<std::size_t>(blocks * 4 + n));  // ~4x smaller than f32

  auto r = decode(as_received(frames));
  REQUIRE_MESSAGE(r, error_text(r));
  REQUIRE(r->encodings.size() == 4);
  CHECK(r->encodings[0] == tensor_encoding::int8_block);
  CHECK(r->encodings[1] == tensor_encoding::raw);
  const Tensor& x = r->tensors[0];
  CHECK(x.type() == dtype::f32);
  CHECK(x.shape() == shape_t{n});
  auto got = x.to_vector();
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = b * int8_wire_block_size;
    const std::int64_t hi = std::min(n, lo + int8_wire_block_size);
    float amax = 0;
    for (auto i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(values[i]));
    const float bound = amax / 127.0f * 0.5f * 1.0001f;
    float worst = 0;
    for (auto i = lo; i < hi; ++i) worst = std::max(worst, std::fabs(got[i] - values[i]));
    CHECK_MESSAGE(worst <= bound, "block " << b << " error " << worst << " bound " << bound);
  }
  CHECK(same_bytes(r->tensors[1], m.tensors[1]));
  CHECK(r->tensors[2].to_vector() == std::vector<float>{0, 0, 0});
  CHECK(r->tensors[3].shape() == shape_t{0, 4});

  message bad;
  bad.tensors.push_back(random_tensor({4}, dtype::bf16, 1));
  bad.encodings = {tensor_encoding::int8_block};
  CHECK_THROWS_AS(encode(bad), tensor_error);
  bad.encodings = {};
  bad.tensors.push_back(Tensor());
  CHECK_THROWS_AS(encode(bad), tensor_error);
}

TEST_CASE("encode sends tensor storage without copying and keeps it alive") {
  message m = sample_message();
  const void* storage_bytes = m.tensors[0].raw();
  auto frames = encode(m);
  CHECK(frames[1].data == storage_bytes);
  CHECK(frames[1].owner.get() == m.tensors[0].storage_ptr().get());
  const long uses = m.tensors[0].storage_ptr().use_count();
  m.tensors.clear();
  // The frame alone keeps the storage alive until the transport is done.
  CHECK(uses >= 2);
  CHECK(frames[1].owner.use_count() == 1);
  CHECK(static_cast<const float*>(frames[1].data)[0] == static_cast<const float*>(storage_bytes)[0]);
}

TEST_CASE("decode adopts aligned frames without copying and copies misaligned ones") {
  message m = sample_message();
  m.tensors.push_back(random_tensor({3, 7}, dtype::bf16, 2));
  auto frames = encode(m);

  SUBCASE("aligned frames with an owner are wrapped in place") {
    auto in = as_received(frames);
    auto r = decode(in);
    REQUIRE(r);
    CHECK(r->tensors[0].raw() == frames[1].data);
    CHECK(r->tensors[1].raw() == frames[2].data);
    CHECK(same_bytes(r->tensors[0], m.tensors[0]));
  }
  SUBCASE("the adopted tensor keeps the transport's buffer alive") {
    shifted_frames aligned(frames, 0, true);
    std::weak_ptr<std::vector<unsigned char>> buffer = aligned.buffers[1];
    auto r = decode(aligned.frames);
    REQUIRE(r);
    CHECK(r->tensors[0].raw() == aligned.frames[1].data);
    aligned.buffers.clear();
    aligned.frames.clear();
    CHECK_FALSE(buffer.expired());
    CHECK(same_bytes(r->tensors[0], m.tensors[0]));
    Tensor kept = r->tensors[0];
    r = caf::expected<message>(message{});
    CHECK_FALSE(buffer.expired());
    kept = Tensor();
    CHECK(buffer.expired());
  }
  SUBCASE("frames not aligned to their element size (and an unaligned envelope) are copied to aligned memory") {
    // ZeroMQ's large messages start 8 bytes past a 64-byte boundary at best:
    // element alignment is all the kernels need, so those are adopted.
    for (std::size_t shift : {1, 2, 3, 4, 8, 32, 40}) {
      CAPTURE(shift);
      shifted_frames odd(frames, shift, true);
      auto r = decode(odd.frames);
      REQUIRE_MESSAGE(r, error_text(r));
      for (std::size_t i = 0; i < 2; ++i) {
        const bool element_aligned = shift % dtype_size(m.tensors[i].type()) == 0;
        CHECK((r->tensors[i].raw() == odd.frames[i + 1].data) == element_aligned);
        if (!element_aligned) CHECK(reinterpret_cast<std::uintptr_t>(r->tensors[i].raw()) % 64 == 0);
        CHECK(same_bytes(r->tensors[i], m.tensors[i]));
      }
    }
  }
  SUBCASE("frames without an owner are always copied") {
    shifted_frames unowned(frames, 0, false);
    auto r = decode(unowned.frames);
    REQUIRE(r);
    CHECK(r->tensors[0].raw() != unowned.frames[1].data);
    CHECK(same_bytes(r->tensors[0], m.tensors[0]));
  }
}

TEST_CASE("decode rejects broken envelopes with the reason") {
  auto frames = encode(sample_message());
  auto in = as_received(frames);

  SUBCASE("no frames") {
    CHECK(reason_of(decode(std::span<const in_frame>{})).find("no frames") != std::string::npos);
  }
  SUBCASE("truncated envelope") {
    in[0].size = 16;
    CHECK(reason_of(decode(in)).find("malformed envelope") == 0);
  }
  SUBCASE("envelope size not a multiple of 8") {
    in[0].size -= 3;
    CHECK(reason_of(decode(in)).find("not a whole number of 8-byte words") != std::string::npos);
  }
  SUBCASE("garbage envelope") {
    std::vector<unsigned char> garbage(256);
    std::mt19937 rng(99);
    for (auto& b : garbage) b = static_cast<unsigned char>(rng());
    garbage[0] = 0xff;  // an absurd segment count
    std::vector<std::uint64_t> words(garbage.size() / 8);
    std::memcpy(words.data(), garbage.data(), garbage.size());
    in[0] = {words.data(), garbage.size(), nullptr};
    CHECK(reason_of(decode(in)).find("malformed envelope") == 0);
  }
  SUBCASE("bytes after the message") {
    std::vector<capnp::word> longer(frames[0].size / 8 + 2);
    std::memcpy(longer.data(), frames[0].data, frames[0].size);
    in[0] = {longer.data(), longer.size() * 8, nullptr};
    CHECK(reason_of(decode(in)) == "envelope frame has 16 bytes after the end of the message");
  }
  SUBCASE("oversize envelope") {
    decode_limits small;
    small.max_envelope_bytes = 64;
    CHECK(reason_of(decode(in, small)).find(", the limit is 64") != std::string::npos);
  }
  SUBCASE("more tensor frames than the envelope declares") {
    std::vector<in_frame> extra = in;
    extra.push_back(in[1]);
    CHECK(reason_of(decode(extra)) == "envelope declares 1 tensors but 2 tensor frames arrived");
  }
  SUBCASE("fewer tensor frames than the envelope declares") {
    in.pop_back();
    CHECK(reason_of(decode(in)) == "envelope declares 1 tensors but 0 tensor frames arrived");
  }
  SUBCASE("bad checksum") {
    std::vector<unsigned char> copy(static_cast<const unsigned char*>(frames[1].data),
                                    static_cast<const unsigned char*>(frames[1].data) + frames[1].size);
    copy[100] ^= 0x10;
    in[1] = {copy.data(), copy.size(), nullptr};
    CHECK(reason_of(decode(in)).find("tensor 0: checksum mismatch: header 0x") == 0);
    decode_limits trusting;
    trusting.verify_checksums = false;
    CHECK(decode(in, trusting));
  }
}

TEST_CASE("decode rejects bad tensor headers and sizes with the reason") {
  SUBCASE("byteSize that does not match the shape") {
    crafted c;
    one_header(c, {4, 256}, 4000);
    c.add_payload(4000);
    CHECK(reason_of(decode(c.finish())) ==
          "tensor 0: shape [4, 256] of f32 needs 4096 bytes, header says byteSize 4000");
  }
  SUBCASE("frame shorter than its header") {
    crafted c;
    one_header(c, {4, 256}, 4096);
    c.add_payload(4000);
    CHECK(reason_of(decode(c.finish())) == "tensor 0: header says 4096 bytes, frame has 4000");
  }
  SUBCASE("negative dimension") {
    crafted c;
    one_header(c, {4, -3}, 0);
    c.add_payload(0);
    CHECK(reason_of(decode(c.finish())) == "tensor 0: dimension 1 is -3 (negative)");
  }
  SUBCASE("shape product that overflows 64 bits") {
    crafted c;
    one_header(c, {std::int64_t{1} << 32, std::int64_t{1} << 32, 4}, 16);
    c.add_payload(16);
    CHECK(reason_of(decode(c.finish())) ==
          "tensor 0: shape [4294967296, 4294967296, 4] has more elements than fit in 63 bits");
  }
  SUBCASE("shape whose byte size overflows or exceeds the limit") {
    crafted c;
    one_header(c, {std::int64_t{1} << 40, std::int64_t{1} << 21}, 16);
    c.add_payload(16);
    CHECK(reason_of(decode(c.finish())).find("exceeds the limit of 1073741824 bytes") !=
          std::string::npos);
  }
  SUBCASE("rank above the limit") {
    crafted c;
    one_header(c, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 4);
    c.add_payload(4);
    CHECK(reason_of(decode(c.finish())) == "tensor 0: rank 9 exceeds the limit of 8");
  }
  SUBCASE("unknown dtype value") {
    crafted c;
    one_header(c, {2}, 8, static_cast<wire::DType>(9));
    c.add_payload(8);
    CHECK(reason_of(decode(c.finish())) == "tensor 0: unknown dtype value 9");
  }
  SUBCASE("unknown encoding value") {
    crafted c;
    one_header(c, {2}, 8);
    c.env().getTensors()[0].setEncoding(static_cast<wire::TensorEncoding>(7));
    c.add_payload(8);
    CHECK(reason_of(decode(c.finish())) == "tensor 0: unknown encoding value 7");
  }
  SUBCASE("unknown message kind value") {
    crafted c;
    c.env().setKind(static_cast<wire::MessageKind>(42));
    CHECK(reason_of(decode(c.finish())) == "unknown message kind value 42");
  }
  SUBCASE("int8Block with a bad block size or a non-f32 dtype") {
    crafted c;
    one_header(c, {10}, 4 + 10);
    c.env().getTensors()[0].setEncoding(wire::TensorEncoding::INT8_BLOCK);
    c.add_payload(14);
    CHECK(reason_of(decode(c.finish())).find("tensor 0: int8Block block size 0 is not in [1, ") == 0);
    crafted d;
    one_header(d, {10}, 4 + 10, wire::DType::BF16);
    d.env().getTensors()[0].setEncoding(wire::TensorEncoding::INT8_BLOCK);
    d.env().getTensors()[0].setBlockSize(16);
    d.add_payload(14);
    CHECK(reason_of(decode(d.finish())) ==
          "tensor 0: int8Block encoding reconstructs f32, header says dtype bf16");
    crafted e;
    one_header(e, {10}, 3 * 4 + 10);  // block 4 -> 3 scales
    e.env().getTensors()[0].setEncoding(wire::TensorEncoding::INT8_BLOCK);
    e.env().getTensors()[0].setBlockSize(4);
    e.add_payload(22);
    auto r = decode(e.finish());
    REQUIRE_MESSAGE(r, error_text(r));
    CHECK(r->tensors[0].to_vector() == std::vector<float>(10, 0.0f));
  }
  SUBCASE("oversize strings") {
    crafted c;
    c.env().setTargetActor(std::string(5000, 'x'));
    CHECK(reason_of(decode(c.finish())) == "targetActor is 5000 bytes, the limit is 4096");
    crafted d;
    d.env().setErrorMessage(std::string(4097, 'e'));
    CHECK(reason_of(decode(d.finish())) == "errorMessage is 4097 bytes, the limit is 4096");
  }
  SUBCASE("more tensors than the limit") {
    crafted c;
    c.env().initTensors(65);
    for (int i = 0; i < 65; ++i) c.add_payload(0);
    CHECK(reason_of(decode(c.finish())) == "65 tensor frames exceed the limit of 64");
    crafted d;
    d.env().initTensors(100);
    CHECK(reason_of(decode(d.finish())) == "envelope declares 100 tensors, the limit is 64");
  }
  SUBCASE("a tensor larger than the limit") {
    crafted c;
    one_header(c, {64}, 256);
    c.add_payload(256);
    decode_limits small;
    small.max_tensor_bytes = 255;
    CHECK(reason_of(decode(c.finish(), small)) ==
          "tensor 0: shape [64] of f32 exceeds the limit of 255 bytes");
  }
}

TEST_CASE("hello round trip and version refusal") {
  hello_info h;
  h.protocol_version = protocol_version;
  h.node_id = "node-7";
  h.listen_endpoint = "tcp://127.0.0.1:5555";
  h.nic_class = "roce";
  h.capabilities = {"int8-tensors", "curve"};
  h.max_message_bytes = std::uint64_t{1} << 30;
  auto body = encode_hello(h);
  CHECK(body.size() % 8 == 0);
  auto r = decode_hello(body);
  REQUIRE_MESSAGE(r, error_text(r));
  CHECK(r->protocol_version == protocol_version);
  CHECK(r->node_id == "node-7");
  CHECK(r->listen_endpoint == "tcp://127.0.0.1:5555");
  CHECK(r->nic_class == "roce");
  CHECK(r->capabilities == h.capabilities);
  CHECK(r->max_message_bytes == h.max_message_bytes);
  CHECK_FALSE(check_hello(*r));

  // The hello travels as the body of a hello message.
  message m;
  m.kind = message_kind::hello;
  m.body = body;
  auto decoded = decode(as_received(encode(m)));
  REQUIRE(decoded);
  CHECK(decode_hello(decoded->body)->node_id == "node-7");
  // A misaligned body (a view into another buffer) is copied, not misread.
  std::vector<std::uint8_t> shifted(body.size() + 3);
  std::memcpy(shifted.data() + 3, body.data(), body.size());
  CHECK(decode_hello(std::span(shifted).subspan(3))->node_id == "node-7");

  h.protocol_version = protocol_version + 1;
  auto err = check_hello(h);
  REQUIRE(err);
  CHECK(error_text(err) == "peer node-7 speaks protocol version " +
                               std::to_string(protocol_version + 1) +
                               ", this node speaks version " + std::to_string(protocol_version));
  h.protocol_version = protocol_version;
  h.node_id = "";
  CHECK(error_text(check_hello(h)) == "peer sent an empty node id in its hello");

  CHECK(error_text(decode_hello({}).error()) == "hello body is empty");
  std::vector<std::uint8_t> garbage(24, 0xff);
  CHECK(error_text(decode_hello(garbage).error()).find("malformed hello") == 0);
  CHECK(error_text(decode_hello(std::span(body).first(body.size() - 1)).error())
            .find("not a whole number of 8-byte words") != std::string::npos);
  h.node_id = std::string(5000, 'n');
  CHECK(error_text(decode_hello(encode_hello(h)).error()) ==
        "hello nodeId is 5000 bytes, the limit is 4096");
}
