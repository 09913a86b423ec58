#include "actors/swarm_wire.hpp"

#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "actors/errors.hpp"
#include "net/wire.capnp.h"

namespace corolla {
namespace {

/// Session ids and model names longer than this are refused.
constexpr std::size_t max_text_bytes = 256;

std::vector<std::uint8_t> flat(capnp::MessageBuilder& b) {
  auto words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  return {bytes.begin(), bytes.end()};
}

/// Reads a body as message T and hands its root to `read`; any structural
/// problem (size, pointers, limits, a text too long) is a bad_message.
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

std::string text(capnp::Text::Reader t, const char* field) {
  if (t.size() > max_text_bytes)
    throw std::invalid_argument(std::string(field) + " of " + std::to_string(t.size()) + " bytes (at most " +
                                std::to_string(max_text_bytes) + ")");
  return t.cStr();
}

}  // namespace

std::vector<std::uint8_t> encode_body(const span_info& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanInfo>();
  r.setModel(v.model);
  r.setFirst(v.first);
  r.setLast(v.last);
  r.setNBlocks(v.n_blocks);
  r.setHiddenSize(v.hidden_size);
  r.setMaxPositions(v.max_positions);
  r.setCacheTokens(v.cache_tokens);
  r.setCacheTokensLeft(v.cache_tokens_left);
  r.setStepSPerBlock(v.step_s_per_block);
  r.setSessions(v.sessions);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_open& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanOpen>();
  r.setSessionId(v.session_id);
  r.setMaxLength(v.max_length);
  r.setFirst(v.first);
  r.setLast(v.last);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_step& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanStep>();
  r.setSessionId(v.session_id);
  r.setStart(v.start);
  r.setStepId(v.step_id);
  r.setCompressOutput(v.compress_output);
  return flat(b);
}

std::vector<std::uint8_t> encode_close_body(const std::string& session_id) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::SpanClose>().setSessionId(session_id);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_batch& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanBatch>();
  r.setBatch(v.batch);
  r.setSeq(v.seq);
  r.setWithPrompts(v.with_prompts);
  return flat(b);
}

caf::expected<span_info> decode_span_info(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanInfo>(body, "span.info", [](wire::SpanInfo::Reader r) {
    span_info v;
    v.model = text(r.getModel(), "model");
    v.first = r.getFirst();
    v.last = r.getLast();
    v.n_blocks = r.getNBlocks();
    v.hidden_size = r.getHiddenSize();
    v.max_positions = r.getMaxPositions();
    v.cache_tokens = r.getCacheTokens();
    v.cache_tokens_left = r.getCacheTokensLeft();
    v.step_s_per_block = r.getStepSPerBlock();
    v.sessions = r.getSessions();
    return v;
  });
}

caf::expected<span_open> decode_span_open(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanOpen>(body, "span.open", [](wire::SpanOpen::Reader r) {
    return span_open{text(r.getSessionId(), "session id"), r.getMaxLength(), r.getFirst(), r.getLast()};
  });
}

caf::expected<span_step> decode_span_step(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanStep>(body, "span.step", [](wire::SpanStep::Reader r) {
    return span_step{text(r.getSessionId(), "session id"), r.getStart(), r.getStepId(), r.getCompressOutput()};
  });
}

caf::expected<std::string> decode_span_close(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanClose>(body, "span.close",
                                 [](wire::SpanClose::Reader r) { return text(r.getSessionId(), "session id"); });
}

caf::expected<span_batch> decode_span_batch(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanBatch>(body, "span.forward/backward", [](wire::SpanBatch::Reader r) {
    return span_batch{r.getBatch(), r.getSeq(), r.getWithPrompts()};
  });
}

}  // namespace corolla
