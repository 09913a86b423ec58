// actors/capnp_body.hpp — Cap'n Proto bodies of remote_message: encoding a
// builder to the flat bytes a remote_message carries, and decoding them
// with limits so that a malformed body is a bad_message error, never an
// exception or an unbounded read. Shared by every *_wire.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <caf/expected.hpp>
#include <kj/exception.h>

#include "actors/errors.hpp"

namespace corolla::capnp_body {

/// Texts (ids, names) longer than this are refused.
inline constexpr std::size_t max_text_bytes = 256;

/// The builder's message as flat bytes.
inline std::vector<std::uint8_t> flat(capnp::MessageBuilder& b) {
  auto words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  return {bytes.begin(), bytes.end()};
}

/// Reads `body` as message T and hands its root to `read`; any structural
/// problem (size, pointers, limits, or an std::invalid_argument thrown by
/// `read`) is a bad_message naming `what`.
template <class T, class Read>
auto decode(const std::vector<std::uint8_t>& body, const char* what, Read read)
    -> caf::expected<decltype(read(std::declval<typename T::Reader>()))> {
  const std::string name = what;
  if (body.empty() || body.size() % sizeof(capnp::word) != 0)
    return make_error(errc::bad_message, name + " body of " + std::to_string(body.size()) +
                                             " bytes is not a Cap'n Proto message");
  std::vector<capnp::word> words(body.size() / sizeof(capnp::word));
  std::memcpy(words.data(), body.data(), body.size());
  try {
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = 1 << 16;
    limits.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()), limits);
    return read(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    return make_error(errc::bad_message, "malformed " + name + " body: " + e.getDescription().cStr());
  } catch (const std::invalid_argument& e) {
    return make_error(errc::bad_message, "malformed " + name + " body: " + e.what());
  }
}

/// A text field, refused (std::invalid_argument) beyond `limit` bytes.
inline std::string text(capnp::Text::Reader t, const char* field, std::size_t limit = max_text_bytes) {
  if (t.size() > limit)
    throw std::invalid_argument(std::string(field) + " of " + std::to_string(t.size()) + " bytes (at most " +
                                std::to_string(limit) + ")");
  return t.cStr();
}

}  // namespace corolla::capnp_body
