// The swarm wire's adapter fields (actors/swarm_wire.hpp): span.info's
// adapters and their digests, span.open's and span.batch's adapter, each
// through an encode and a decode, and a client's carried adapter's config;
// digests that do not pair with the names and too many targets are refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actors/errors.hpp"
#include "actors/swarm_wire.hpp"

using namespace corolla;

TEST_CASE("swarm wire: adapters and their digests cross span.info, span.open and span.forward intact") {
  span_info i;
  i.model = "m";
  i.adapters = {"style", "user/repo"};
  i.adapter_digests = {"0123456789abcdef", "fedcba9876543210"};
  auto got = decode_span_info(encode_body(i));
  REQUIRE(got);
  CHECK(got->adapters == i.adapters);
  CHECK(got->adapter_digests == i.adapter_digests);

  span_info unpaired = i;
  unpaired.adapter_digests.pop_back();
  auto bad = decode_span_info(encode_body(unpaired));
  REQUIRE_FALSE(bad);
  CHECK(error_message(bad.error()).find("2 adapters with 1 digests") != std::string::npos);

  span_info many = i;
  many.adapters.assign(max_span_adapters + 1, "a");
  many.adapter_digests.assign(max_span_adapters + 1, "d");
  auto capped = decode_span_info(encode_body(many));  // the encoder writes at most max_span_adapters
  REQUIRE(capped);
  CHECK(capped->adapters.size() == max_span_adapters);

  span_open o{"s", 16};
  o.adapter = "style";
  auto open = decode_span_open(encode_body(o));
  REQUIRE(open);
  CHECK(open->adapter == "style");
  CHECK(decode_span_open(encode_body(span_open{"s", 16}))->adapter.empty());

  span_batch b{.batch = 1, .seq = 4, .adapter = "style"};
  auto batch = decode_span_batch(encode_body(b));
  REQUIRE(batch);
  CHECK(batch->adapter == "style");
}

TEST_CASE("swarm wire: a client's carried adapter's config crosses span.forward intact, and too many targets are refused") {
  CHECK_FALSE(decode_span_batch(encode_body(span_batch{.batch = 1, .seq = 4}))->lora);
  span_batch b{.batch = 2, .seq = 4};
  lora_config c;
  c.rank = 8;
  c.alpha = 12.5f;
  c.rslora = true;
  c.targets = {"self_attn.q_proj", "mlp.down_proj"};
  b.lora = c;
  auto got = decode_span_batch(encode_body(b));
  REQUIRE(got);
  REQUIRE(got->lora);
  CHECK(got->lora->rank == 8);
  CHECK(got->lora->alpha == 12.5f);
  CHECK(got->lora->rslora);
  CHECK(got->lora->targets == c.targets);

  b.lora->targets.assign(max_carried_lora_targets + 1, "q_proj");
  auto many = decode_span_batch(encode_body(b));
  REQUIRE_FALSE(many);
  CHECK(error_message(many.error()).find("9 LoRA targets (at most 8)") != std::string::npos);
}
