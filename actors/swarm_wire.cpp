#include "actors/swarm_wire.hpp"

#include <algorithm>

#include "actors/capnp_body.hpp"
#include "actors/errors.hpp"
#include "net/server_record.hpp"
#include "net/wire.capnp.h"

namespace corolla {

using capnp_body::decode;
using capnp_body::flat;
using capnp_body::text;

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
  r.setDraining(v.draining);
  r.setAwaitingPushes(v.awaiting_pushes);
  r.setWeights(v.weights);
  r.setSharedTokens(v.shared_tokens);
  auto names = r.initAdapters(static_cast<unsigned>(std::min(v.adapters.size(), max_span_adapters)));
  for (unsigned i = 0; i < names.size(); ++i) names.set(i, v.adapters[i]);
  auto digests = r.initAdapterDigests(static_cast<unsigned>(std::min(v.adapter_digests.size(), max_span_adapters)));
  for (unsigned i = 0; i < digests.size(); ++i) digests.set(i, v.adapter_digests[i]);
  auto rtts = r.initRtts(static_cast<unsigned>(std::min(v.rtt_ms.size(), net::max_rtt_entries)));
  unsigned i = 0;
  for (const auto& [node, ms] : v.rtt_ms) {
    if (i == rtts.size()) break;
    rtts[i].setNode(node);
    rtts[i++].setMs(ms);
  }
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_open& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanOpen>();
  r.setSessionId(v.session_id);
  r.setMaxLength(v.max_length);
  r.setFirst(v.first);
  r.setLast(v.last);
  r.setDeepPrompts(v.deep_prompts);
  r.setShareFrom(v.share_from);
  r.setShareTokens(v.share_tokens);
  r.setAdapter(v.adapter);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_step& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanStep>();
  r.setSessionId(v.session_id);
  r.setStart(v.start);
  r.setStepId(v.step_id);
  r.setCompressOutput(v.compress_output);
  r.setAwaitPush(v.await_push);
  r.setPushFrom(v.push_from);
  r.setWaitMs(v.wait_ms);
  if (!v.push_to.node.empty()) {
    auto t = r.initPushTo();
    t.setNode(v.push_to.node);
    t.setEndpoint(v.push_to.endpoint);
    t.setPublicKey(v.push_to.public_key);
    t.setSessionId(v.push_to.session_id);
  }
  r.setTrail(v.trail);
  if (!v.upstream_problem.empty()) r.setUpstreamProblem(v.upstream_problem);
  if (!v.owner.empty()) r.setOwner(v.owner);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_step_done& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanStepDone>();
  r.setPushed(v.pushed);
  r.setPushProblem(v.push_problem);
  return flat(b);
}

std::vector<std::uint8_t> encode_close_body(const std::string& session_id, bool keep) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanClose>();
  r.setSessionId(session_id);
  r.setKeep(keep);
  return flat(b);
}

std::vector<std::uint8_t> encode_body(const span_batch& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::SpanBatch>();
  r.setBatch(v.batch);
  r.setSeq(v.seq);
  r.setWithPrompts(v.with_prompts);
  r.setFirst(v.first);
  r.setLast(v.last);
  r.setWithMargins(v.with_margins);
  r.setAdapter(v.adapter);
  if (v.lora) {
    r.setLoraRank(v.lora->rank);
    r.setLoraAlpha(v.lora->alpha);
    r.setLoraRslora(v.lora->rslora);
    auto targets = r.initLoraTargets(static_cast<unsigned>(v.lora->targets.size()));
    for (unsigned i = 0; i < targets.size(); ++i) targets.set(i, v.lora->targets[i]);
  }
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
    v.draining = r.getDraining();
    v.awaiting_pushes = r.getAwaitingPushes();
    v.weights = text(r.getWeights(), "weights");
    v.shared_tokens = r.getSharedTokens();
    if (v.shared_tokens < 0) throw std::invalid_argument("shared tokens " + std::to_string(v.shared_tokens));
    if (r.getAdapters().size() > max_span_adapters)
      throw std::invalid_argument(std::to_string(r.getAdapters().size()) + " adapters (at most " +
                                  std::to_string(max_span_adapters) + ")");
    for (auto name : r.getAdapters()) v.adapters.push_back(text(name, "adapter name"));
    for (auto d : r.getAdapterDigests()) v.adapter_digests.push_back(text(d, "adapter digest"));
    if (v.adapter_digests.size() != v.adapters.size())
      throw std::invalid_argument(std::to_string(v.adapters.size()) + " adapters with " +
                                  std::to_string(v.adapter_digests.size()) + " digests");
    if (r.getRtts().size() > net::max_rtt_entries)
      throw std::invalid_argument(std::to_string(r.getRtts().size()) + " RTT entries (at most " +
                                  std::to_string(net::max_rtt_entries) + ")");
    for (auto e : r.getRtts()) {
      const double ms = e.getMs();
      if (!(ms >= 0) || ms > 1e7) throw std::invalid_argument("an RTT of " + std::to_string(ms) + " ms");
      v.rtt_ms[text(e.getNode(), "RTT node id")] = ms;
    }
    return v;
  });
}

caf::expected<span_open> decode_span_open(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanOpen>(body, "span.open", [](wire::SpanOpen::Reader r) {
    span_open v{text(r.getSessionId(), "session id"), r.getMaxLength(), r.getFirst(), r.getLast(),
                r.getDeepPrompts(), text(r.getShareFrom(), "shared session id"), r.getShareTokens(),
                text(r.getAdapter(), "adapter name")};
    if (v.share_tokens < 0 || (v.share_tokens > 0 && v.share_from.empty()))
      throw std::invalid_argument("shareTokens " + std::to_string(v.share_tokens) + " without a session to share from");
    return v;
  });
}

caf::expected<span_step> decode_span_step(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanStep>(body, "span.step", [](wire::SpanStep::Reader r) {
    span_step v{.session_id = text(r.getSessionId(), "session id"),
                .start = r.getStart(),
                .step_id = r.getStepId(),
                .compress_output = r.getCompressOutput()};
    v.await_push = r.getAwaitPush();
    v.push_from = text(r.getPushFrom(), "push source");
    v.wait_ms = r.getWaitMs();
    if (r.hasPushTo()) {
      auto t = r.getPushTo();
      v.push_to = {text(t.getNode(), "push target node"), text(t.getEndpoint(), "push target endpoint"),
                   text(t.getPublicKey(), "push target key"), text(t.getSessionId(), "push target session")};
      if (v.push_to.node.empty()) throw std::invalid_argument("push target without a node id");
    }
    if (v.await_push && v.push_from.empty()) throw std::invalid_argument("awaitPush without pushFrom");
    v.trail = r.getTrail();
    v.upstream_problem = text(r.getUpstreamProblem(), "upstream problem", 4096);
    v.owner = text(r.getOwner(), "step owner");
    return v;
  });
}

caf::expected<span_step_done> decode_span_step_done(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanStepDone>(body, "span.step answer", [](wire::SpanStepDone::Reader r) {
    return span_step_done{r.getPushed(), text(r.getPushProblem(), "push problem", 4096)};
  });
}

caf::expected<span_close> decode_span_close(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanClose>(body, "span.close", [](wire::SpanClose::Reader r) {
    return span_close{text(r.getSessionId(), "session id"), r.getKeep()};
  });
}

caf::expected<span_batch> decode_span_batch(const std::vector<std::uint8_t>& body) {
  return decode<wire::SpanBatch>(body, "span.forward/backward", [](wire::SpanBatch::Reader r) {
    span_batch v{r.getBatch(), r.getSeq(), r.getWithPrompts(), r.getFirst(), r.getLast(), r.getWithMargins(),
                 text(r.getAdapter(), "adapter name")};
    if (r.getLoraRank() != 0) {
      if (r.getLoraTargets().size() > max_carried_lora_targets)
        throw std::invalid_argument(std::to_string(r.getLoraTargets().size()) + " LoRA targets (at most " +
                                    std::to_string(max_carried_lora_targets) + ")");
      lora_config c;
      c.rank = r.getLoraRank();
      c.alpha = r.getLoraAlpha();
      c.rslora = r.getLoraRslora();
      for (auto t : r.getLoraTargets()) c.targets.push_back(text(t, "LoRA target"));
      v.lora = std::move(c);
    }
    return v;
  });
}

}  // namespace corolla
