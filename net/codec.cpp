// net/codec.cpp — messages to wire frames and back (docs/protocol.md).
//
// encode() never copies a raw tensor: its frame points into the tensor's
// storage and holds the storage alive. decode() treats the peer as hostile:
// every count, size, enum and shape is checked against the limits and the
// frames before any payload is touched, and every failure becomes an error
// value naming the offending field (the I/O thread logs it and keeps
// serving).
#include "net/codec.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
// XXH3 inlined and compiled with this build's flags: with -march=native it
// uses AVX2 (about 48 GB/s on the development VM against 14 GB/s through
// the shared library's generic build), and checksums are most of the cost
// of a large message on a loopback link.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <caf/error.hpp>
#include <caf/sec.hpp>

#include "kernels/backend.hpp"
#include "net/wire.capnp.h"

namespace corolla::net {

// The in-memory enums mirror the schema's numbering, so conversion is a cast.
static_assert(static_cast<unsigned>(wire::MessageKind::HELLO) == unsigned(message_kind::hello));
static_assert(static_cast<unsigned>(wire::MessageKind::HEARTBEAT_ACK) ==
              unsigned(message_kind::heartbeat_ack));
static_assert(static_cast<unsigned>(wire::MessageKind::GOODBYE) == unsigned(message_kind::goodbye));
static_assert(static_cast<unsigned>(wire::DType::F32) == unsigned(dtype::f32));
static_assert(static_cast<unsigned>(wire::DType::BF16) == unsigned(dtype::bf16));
static_assert(static_cast<unsigned>(wire::DType::F16) == unsigned(dtype::f16));
static_assert(static_cast<unsigned>(wire::DType::I32) == unsigned(dtype::i32));
static_assert(static_cast<unsigned>(wire::DType::I8) == unsigned(dtype::i8));
static_assert(static_cast<unsigned>(wire::TensorEncoding::INT8_BLOCK) ==
              unsigned(tensor_encoding::int8_block));

namespace {

constexpr unsigned last_kind = static_cast<unsigned>(message_kind::goodbye);
constexpr unsigned last_dtype = static_cast<unsigned>(dtype::i8);
constexpr unsigned last_encoding = static_cast<unsigned>(tensor_encoding::int8_block);
constexpr std::size_t word_bytes = sizeof(capnp::word);
/// Our schemas nest at most Envelope -> List(TensorHeader) -> TensorHeader ->
/// List(Int64); anything deeper is not ours.
constexpr int nesting_limit = 8;
constexpr std::size_t max_hello_bytes = 64 * 1024;
constexpr std::size_t max_capabilities = 64;

caf::error fail(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, std::move(what));
}

std::string tensor_prefix(std::size_t i) { return "tensor " + std::to_string(i) + ": "; }

/// Serialises a finished builder into words owned by a shared_ptr, so an
/// out_frame can keep them alive until the transport has sent them.
out_frame flat_frame(capnp::MessageBuilder& builder) {
  auto words = std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder));
  out_frame f;
  f.data = words->begin();
  f.size = words->size() * word_bytes;
  f.owner = std::move(words);
  return f;
}

/// The int8_block frame of an f32 tensor: [f32 scale x ceil(n/block)]
/// followed by [i8 x n], in one fresh 64-byte aligned buffer.
out_frame quantize_frame(const Tensor& t, std::size_t index) {
  if (t.type() != dtype::f32)
    throw tensor_error("encode: " + tensor_prefix(index) + "int8_block encoding needs f32, not " +
                       dtype_name(t.type()));
  const std::int64_t n = t.numel();
  const std::int64_t blocks = (n + int8_wire_block_size - 1) / int8_wire_block_size;
  const std::size_t scale_bytes = static_cast<std::size_t>(blocks) * sizeof(float);
  auto buffer = storage::allocate(scale_bytes + static_cast<std::size_t>(n));
  if (n > 0) {
    Tensor scales = Tensor::wrap(buffer, 0, {blocks}, dtype::f32);
    Tensor q = Tensor::wrap(buffer, scale_bytes, {n}, dtype::i8);
    cpu_backend().quantize_int8(t.view({n}), int8_wire_block_size, q, scales);
  }
  out_frame f;
  f.data = buffer->data();
  f.size = scale_bytes + static_cast<std::size_t>(n);
  f.owner = std::move(buffer);
  return f;
}

/// A tensor header that passed validation: everything decode needs to build
/// the tensor from its frame.
struct checked_header {
  dtype type = dtype::f32;
  shape_t shape;
  std::int64_t numel = 0;
  tensor_encoding encoding = tensor_encoding::raw;
  std::uint32_t block = 0;
  std::uint64_t byte_size = 0;
  std::uint64_t checksum = 0;
};

/// a * b, or false when the product does not fit in 64 bits.
bool mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
bool add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

caf::error check_text(capnp::Text::Reader text, const char* field, std::size_t limit) {
  if (text.size() > limit)
    return fail(std::string(field) + " is " + std::to_string(text.size()) +
                " bytes, the limit is " + std::to_string(limit));
  return {};
}

/// Validates one tensor header against the limits and its frame; fills `out`.
caf::error check_header(wire::TensorHeader::Reader h, std::size_t i, const in_frame& frame,
                        const decode_limits& limits, checked_header& out) {
  const std::string at = tensor_prefix(i);
  const auto raw_dtype = static_cast<unsigned>(h.getDtype());
  if (raw_dtype > last_dtype) return fail(at + "unknown dtype value " + std::to_string(raw_dtype));
  const auto raw_encoding = static_cast<unsigned>(h.getEncoding());
  if (raw_encoding > last_encoding)
    return fail(at + "unknown encoding value " + std::to_string(raw_encoding));
  out.type = static_cast<dtype>(raw_dtype);
  out.encoding = static_cast<tensor_encoding>(raw_encoding);

  auto shape = h.getShape();
  if (shape.size() > limits.max_rank)
    return fail(at + "rank " + std::to_string(shape.size()) + " exceeds the limit of " +
                std::to_string(limits.max_rank));
  out.shape.resize(shape.size());
  std::uint64_t numel = 1;
  bool overflow = false;
  for (unsigned d = 0; d < shape.size(); ++d) {
    const std::int64_t dim = shape[d];
    if (dim < 0)
      return fail(at + "dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                  " (negative)");
    out.shape[d] = dim;
    overflow = overflow || !mul(numel, static_cast<std::uint64_t>(dim), numel);
  }
  // Elements are counted in int64 everywhere (Tensor::numel).
  if (overflow || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return fail(at + "shape " + shape_str(out.shape) + " has more elements than fit in 63 bits");
  out.numel = static_cast<std::int64_t>(numel);

  // Bytes of the reconstructed tensor: bounded like a frame, because an
  // int8 frame expands four-fold on the receiver.
  std::uint64_t decoded_bytes = 0;
  const dtype decoded_type = out.type;
  if (!mul(numel, dtype_size(decoded_type), decoded_bytes) ||
      decoded_bytes > limits.max_tensor_bytes)
    return fail(at + "shape " + shape_str(out.shape) + " of " + dtype_name(decoded_type) +
                " exceeds the limit of " + std::to_string(limits.max_tensor_bytes) + " bytes");

  std::uint64_t expected = 0;
  if (out.encoding == tensor_encoding::raw) {
    expected = decoded_bytes;
  } else {
    if (out.type != dtype::f32)
      return fail(at + "int8Block encoding reconstructs f32, header says dtype " +
                  dtype_name(out.type));
    out.block = h.getBlockSize();
    if (out.block == 0 || out.block > max_int8_block_size)
      return fail(at + "int8Block block size " + std::to_string(out.block) + " is not in [1, " +
                  std::to_string(max_int8_block_size) + "]");
    const std::uint64_t blocks = numel / out.block + (numel % out.block != 0);
    std::uint64_t scale_bytes = 0;
    if (!mul(blocks, sizeof(float), scale_bytes) || !add(scale_bytes, numel, expected))
      return fail(at + "int8Block size of shape " + shape_str(out.shape) +
                  " does not fit in 64 bits");
  }

  out.byte_size = h.getByteSize();
  if (out.byte_size != expected)
    return fail(at + "shape " + shape_str(out.shape) + " of " + dtype_name(out.type) +
                (out.encoding == tensor_encoding::int8_block ? " (int8Block)" : "") + " needs " +
                std::to_string(expected) + " bytes, header says byteSize " +
                std::to_string(out.byte_size));
  if (out.byte_size > limits.max_tensor_bytes)
    return fail(at + "frame of " + std::to_string(out.byte_size) + " bytes exceeds the limit of " +
                std::to_string(limits.max_tensor_bytes) + " bytes");
  if (frame.size != out.byte_size)
    return fail(at + "header says " + std::to_string(out.byte_size) + " bytes, frame has " +
                std::to_string(frame.size));
  if (frame.size > 0 && frame.data == nullptr) return fail(at + "frame has no data");
  out.checksum = h.getChecksum();
  return {};
}

bool aligned_to(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

/// The tensor of a validated raw frame: adopted without a copy when the
/// transport keeps the bytes alive and they are aligned to the element size.
/// (ZeroMQ puts a large message's bytes right after its 40-byte header, so
/// asking for 64-byte alignment copied every large tensor; kernels take
/// any element-aligned pointer, as they do for row slices.)
Tensor adopt_or_copy(const checked_header& h, const in_frame& frame) {
  if (frame.owner && frame.size > 0 && aligned_to(frame.data, dtype_size(h.type))) {
    auto s = storage::borrow(const_cast<void*>(frame.data), frame.size, frame.owner);
    return Tensor::wrap(std::move(s), 0, h.shape, h.type);
  }
  Tensor t = Tensor::empty(h.shape, h.type);
  if (frame.size > 0) std::memcpy(t.raw(), frame.data, frame.size);
  return t;
}

/// The f32 tensor of a validated int8_block frame.
Tensor dequantize_frame(const checked_header& h, const in_frame& frame) {
  Tensor out = Tensor::empty(h.shape, dtype::f32);
  if (h.numel == 0) return out;
  const std::int64_t blocks = (h.numel + h.block - 1) / h.block;
  const std::size_t scale_bytes = static_cast<std::size_t>(blocks) * sizeof(float);
  std::shared_ptr<storage> bytes;
  if (aligned_to(frame.data, alignof(float))) {
    // Only read during this call: no owner needed.
    bytes = storage::borrow(const_cast<void*>(frame.data), frame.size, nullptr);
  } else {
    bytes = storage::allocate(frame.size);
    std::memcpy(bytes->data(), frame.data, frame.size);
  }
  Tensor scales = Tensor::wrap(bytes, 0, {blocks}, dtype::f32);
  Tensor q = Tensor::wrap(bytes, scale_bytes, {h.numel}, dtype::i8);
  Tensor flat = out.view({h.numel});
  cpu_backend().dequantize_int8(q, scales, static_cast<int>(h.block), flat);
  return out;
}

std::string to_hex(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Word-aligned view of a flat-array message, copying only when `data` is
/// not 8-byte aligned (Cap'n Proto reads words in place).
kj::ArrayPtr<const capnp::word> word_view(const void* data, std::size_t size,
                                          kj::Array<capnp::word>& copy) {
  const std::size_t words = size / word_bytes;
  if (aligned_to(data, alignof(capnp::word)))
    return {static_cast<const capnp::word*>(data), words};
  copy = kj::heapArray<capnp::word>(words);
  std::memcpy(copy.begin(), data, words * word_bytes);
  return copy.asPtr();
}

}  // namespace

std::uint64_t frame_checksum(const void* data, std::size_t size) {
  return XXH3_64bits(data, size);
}

std::vector<out_frame> encode(const message& m, bool with_checksums) {
  if (!m.encodings.empty() && m.encodings.size() != m.tensors.size())
    throw tensor_error("encode: " + std::to_string(m.encodings.size()) + " encodings for " +
                       std::to_string(m.tensors.size()) + " tensors");

  std::vector<out_frame> frames(1 + m.tensors.size());
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    if (!t.defined()) throw tensor_error("encode: " + tensor_prefix(i) + "undefined tensor");
    if (t.dev().kind != device_kind::cpu)
      throw tensor_error("encode: " + tensor_prefix(i) + "on " + t.dev().str() +
                         "; copy it to the host first");
    const auto enc = m.encodings.empty() ? tensor_encoding::raw : m.encodings[i];
    if (enc == tensor_encoding::int8_block) {
      frames[i + 1] = quantize_frame(t, i);
    } else {
      frames[i + 1] = {t.raw(), t.nbytes(), t.storage_ptr()};
    }
  }

  // Enough words for the usual envelope in one segment (one allocation).
  std::size_t hint = 32 + m.body.size() / word_bytes + m.tensors.size() * 8 +
                     (m.sender_node.size() + m.sender_actor.size() + m.target_actor.size() +
                      m.type.size() + m.error_code.size() + m.error_message.size() + m.relay_to.size() +
                      m.relay_from.size()) /
                         word_bytes;
  for (const auto& t : m.tensors) hint += t.shape().size();
  capnp::MallocMessageBuilder builder(static_cast<unsigned>(hint));
  auto env = builder.initRoot<wire::Envelope>();
  env.setKind(static_cast<wire::MessageKind>(m.kind));
  env.setSenderNode(m.sender_node);
  env.setSenderActor(m.sender_actor);
  env.setTargetActor(m.target_actor);
  env.setCorrelationId(m.correlation_id);
  env.setType(m.type);
  if (!m.body.empty()) env.setBody(kj::arrayPtr(m.body.data(), m.body.size()));
  env.setSentAtNs(m.sent_at_ns);
  if (!m.error_code.empty()) env.setErrorCode(m.error_code);
  if (!m.error_message.empty()) env.setErrorMessage(m.error_message);
  if (!m.relay_to.empty()) env.setRelayTo(m.relay_to);
  if (!m.relay_from.empty()) env.setRelayFrom(m.relay_from);
  auto headers = env.initTensors(static_cast<unsigned>(m.tensors.size()));
  for (std::size_t i = 0; i < m.tensors.size(); ++i) {
    const Tensor& t = m.tensors[i];
    const auto enc = m.encodings.empty() ? tensor_encoding::raw : m.encodings[i];
    auto h = headers[static_cast<unsigned>(i)];
    h.setDtype(static_cast<wire::DType>(t.type()));
    auto shape = h.initShape(static_cast<unsigned>(t.shape().size()));
    for (std::size_t d = 0; d < t.shape().size(); ++d)
      shape.set(static_cast<unsigned>(d), t.shape()[d]);
    h.setByteSize(frames[i + 1].size);
    h.setEncoding(static_cast<wire::TensorEncoding>(enc));
    if (enc == tensor_encoding::int8_block) h.setBlockSize(int8_wire_block_size);
    if (with_checksums) h.setChecksum(frame_checksum(frames[i + 1].data, frames[i + 1].size));
  }
  frames[0] = flat_frame(builder);
  return frames;
}

caf::expected<message> decode(std::span<const in_frame> frames, const decode_limits& limits) {
  if (frames.empty()) return fail("no frames (a message starts with its envelope frame)");
  const in_frame& env_frame = frames[0];
  if (env_frame.size == 0 || env_frame.data == nullptr) return fail("envelope frame is empty");
  if (env_frame.size > limits.max_envelope_bytes)
    return fail("envelope frame is " + std::to_string(env_frame.size) +
                " bytes, the limit is " + std::to_string(limits.max_envelope_bytes));
  if (env_frame.size % word_bytes != 0)
    return fail("envelope frame is " + std::to_string(env_frame.size) +
                " bytes, not a whole number of 8-byte words");
  if (frames.size() - 1 > limits.max_tensors)
    return fail(std::to_string(frames.size() - 1) + " tensor frames exceed the limit of " +
                std::to_string(limits.max_tensors));

  kj::Array<capnp::word> aligned_copy;
  auto words = word_view(env_frame.data, env_frame.size, aligned_copy);
  capnp::ReaderOptions options;
  // Every field is read once, so a well-formed envelope never traverses more
  // than its own size; the margin covers Cap'n Proto's accounting of empty
  // lists. This stops amplification (lists of zero-sized elements, shared
  // pointers) from turning a small frame into a long read.
  options.traversalLimitInWords = words.size() * 2 + 64;
  options.nestingLimit = nesting_limit;

  message m;
  std::vector<checked_header> headers;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end())
      return fail("envelope frame has " +
                  std::to_string((words.end() - reader.getEnd()) * word_bytes) +
                  " bytes after the end of the message");
    auto env = reader.getRoot<wire::Envelope>();

    const auto raw_kind = static_cast<unsigned>(env.getKind());
    if (raw_kind > last_kind) return fail("unknown message kind value " + std::to_string(raw_kind));
    m.kind = static_cast<message_kind>(raw_kind);

    auto sender_node = env.getSenderNode();
    auto sender_actor = env.getSenderActor();
    auto target_actor = env.getTargetActor();
    auto type = env.getType();
    auto error_code = env.getErrorCode();
    auto error_message = env.getErrorMessage();
    auto relay_to = env.getRelayTo();
    auto relay_from = env.getRelayFrom();
    const std::size_t limit = limits.max_string_bytes;
    const std::pair<capnp::Text::Reader, const char*> texts[] = {
        {sender_node, "senderNode"}, {sender_actor, "senderActor"},
        {target_actor, "targetActor"}, {type, "type"},
        {error_code, "errorCode"},     {error_message, "errorMessage"},
        {relay_to, "relayTo"},         {relay_from, "relayFrom"}};
    for (const auto& [text, field] : texts)
      if (auto err = check_text(text, field, limit)) return err;

    auto tensors = env.getTensors();
    if (tensors.size() > limits.max_tensors)
      return fail("envelope declares " + std::to_string(tensors.size()) +
                  " tensors, the limit is " + std::to_string(limits.max_tensors));
    if (tensors.size() != frames.size() - 1)
      return fail("envelope declares " + std::to_string(tensors.size()) + " tensors but " +
                  std::to_string(frames.size() - 1) + " tensor frames arrived");
    headers.resize(tensors.size());
    for (unsigned i = 0; i < tensors.size(); ++i)
      if (auto err = check_header(tensors[i], i, frames[i + 1], limits, headers[i])) return err;

    m.sender_node.assign(sender_node.cStr(), sender_node.size());
    m.sender_actor.assign(sender_actor.cStr(), sender_actor.size());
    m.target_actor.assign(target_actor.cStr(), target_actor.size());
    m.type.assign(type.cStr(), type.size());
    m.error_code.assign(error_code.cStr(), error_code.size());
    m.error_message.assign(error_message.cStr(), error_message.size());
    m.relay_to.assign(relay_to.cStr(), relay_to.size());
    m.relay_from.assign(relay_from.cStr(), relay_from.size());
    m.correlation_id = env.getCorrelationId();
    m.sent_at_ns = env.getSentAtNs();
    auto body = env.getBody();
    m.body.assign(body.begin(), body.end());
  } catch (const kj::Exception& e) {
    return fail("malformed envelope: " + std::string(e.getDescription().cStr()));
  }

  // Structure is sound; now the payloads.
  if (limits.verify_checksums) {
    for (std::size_t i = 0; i < headers.size(); ++i) {
      if (headers[i].checksum == 0) continue;  // sender did not compute one
      const in_frame& f = frames[i + 1];
      const std::uint64_t actual = frame_checksum(f.data, f.size);
      if (actual != headers[i].checksum)
        return fail(tensor_prefix(i) + "checksum mismatch: header " + to_hex(headers[i].checksum) +
                    ", frame " + to_hex(actual));
    }
  }

  bool any_int8 = false;
  m.tensors.reserve(headers.size());
  try {
    for (std::size_t i = 0; i < headers.size(); ++i) {
      const bool int8 = headers[i].encoding == tensor_encoding::int8_block;
      any_int8 = any_int8 || int8;
      m.tensors.push_back(int8 ? dequantize_frame(headers[i], frames[i + 1])
                               : adopt_or_copy(headers[i], frames[i + 1]));
    }
  } catch (const std::bad_alloc&) {
    return fail(tensor_prefix(m.tensors.size()) + "out of memory for " +
                std::to_string(headers[m.tensors.size()].byte_size) + " bytes");
  } catch (const std::exception& e) {
    // Unreachable after validation; kept so that no exception leaves decode.
    return fail(tensor_prefix(m.tensors.size()) + e.what());
  }
  if (any_int8) {
    m.encodings.reserve(headers.size());
    for (const auto& h : headers) m.encodings.push_back(h.encoding);
  }
  return m;
}

std::vector<std::uint8_t> encode_hello(const hello_info& h) {
  capnp::MallocMessageBuilder builder;
  auto w = builder.initRoot<wire::Hello>();
  w.setProtocolVersion(h.protocol_version);
  w.setNodeId(h.node_id);
  w.setListenEndpoint(h.listen_endpoint);
  w.setNicClass(h.nic_class);
  auto caps = w.initCapabilities(static_cast<unsigned>(h.capabilities.size()));
  for (std::size_t i = 0; i < h.capabilities.size(); ++i)
    caps.set(static_cast<unsigned>(i), h.capabilities[i]);
  w.setMaxMessageBytes(h.max_message_bytes);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return {bytes.begin(), bytes.end()};
}

caf::expected<hello_info> decode_hello(std::span<const std::uint8_t> body) {
  if (body.empty()) return fail("hello body is empty");
  if (body.size() > max_hello_bytes)
    return fail("hello body is " + std::to_string(body.size()) + " bytes, the limit is " +
                std::to_string(max_hello_bytes));
  if (body.size() % word_bytes != 0)
    return fail("hello body is " + std::to_string(body.size()) +
                " bytes, not a whole number of 8-byte words");
  kj::Array<capnp::word> aligned_copy;
  auto words = word_view(body.data(), body.size(), aligned_copy);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words.size() * 2 + 64;
  options.nestingLimit = nesting_limit;
  const decode_limits limits;
  hello_info h;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    auto w = reader.getRoot<wire::Hello>();
    auto node_id = w.getNodeId();
    auto listen = w.getListenEndpoint();
    auto nic = w.getNicClass();
    const std::pair<capnp::Text::Reader, const char*> texts[] = {
        {node_id, "hello nodeId"}, {listen, "hello listenEndpoint"}, {nic, "hello nicClass"}};
    for (const auto& [text, field] : texts)
      if (auto err = check_text(text, field, limits.max_string_bytes)) return err;
    auto caps = w.getCapabilities();
    if (caps.size() > max_capabilities)
      return fail("hello lists " + std::to_string(caps.size()) + " capabilities, the limit is " +
                  std::to_string(max_capabilities));
    for (auto c : caps) {
      if (auto err = check_text(c, "hello capability", limits.max_string_bytes)) return err;
      h.capabilities.emplace_back(c.cStr(), c.size());
    }
    h.protocol_version = w.getProtocolVersion();
    h.node_id.assign(node_id.cStr(), node_id.size());
    h.listen_endpoint.assign(listen.cStr(), listen.size());
    h.nic_class.assign(nic.cStr(), nic.size());
    h.max_message_bytes = w.getMaxMessageBytes();
  } catch (const kj::Exception& e) {
    return fail("malformed hello: " + std::string(e.getDescription().cStr()));
  }
  return h;
}

caf::error check_hello(const hello_info& peer) {
  if (peer.protocol_version != protocol_version)
    return fail("peer " + (peer.node_id.empty() ? std::string("(unnamed)") : peer.node_id) +
                " speaks protocol version " + std::to_string(peer.protocol_version) +
                ", this node speaks version " + std::to_string(protocol_version));
  if (peer.node_id.empty()) return fail("peer sent an empty node id in its hello");
  return {};
}

std::string error_text(const caf::error& e) {
  if (!e) return "";
  const auto& ctx = e.context();
  if (e.category() == caf::atom("system") && ctx.size() == 1 && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  return caf::to_string(e);
}

}  // namespace corolla::net
