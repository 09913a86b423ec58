// The local API's engines on the emulated device. The decode batcher
// (actors/decode_batcher.hpp): the rows are embedded into the span engine's
// rows on the device, run through the blocks in place, the LM head runs
// over the gathered last rows and only the logits come down; batches of
// decode steps run as recorded steps (twice each here, with no host read
// inside: what a CUDA graph needs). A generator per request
// (api/completion_engine.hpp, --batching off): the generators take turns on
// the device, a token at a time. Either way concurrent generations must get
// the cpu generator's tokens.
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/decode_batcher.hpp"
#include "api/completion_engine.hpp"
#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/lora.hpp"
#include "model/transformer.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/batcher_start.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;

TEST_CASE("emulated device: concurrent generations through the decode batcher generate the cpu's tokens") {
  testing::temp_dir_guard dir("emulated-batcher");
  testing::write_tiny_model(dir.path(), testing::tiny_options_for(architecture::llama, 96));
  emulated_device_backend dev;
  transformer on_cpu = transformer::load(dir.path(), cpu_backend());
  transformer on_dev = transformer::load(dir.path(), dev);
  const int vocab = on_cpu.config().vocab_size;
  generation_params p;
  p.max_new_tokens = 16;
  p.ignore_eos = true;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::vector<std::int32_t>> want;
  generator g(on_cpu, 0, weight_format::bf16);
  for (std::uint64_t seed : {1, 2, 3, 4}) {
    prompts.push_back(some_ids(3 + static_cast<int>(seed) * 2, vocab, seed));
    want.push_back(g.generate(prompts.back(), p).tokens);
  }
  caf::actor_system_config config;
  caf::actor_system system{config};
  span_engine_options o;
  o.weights = weight_format::bf16;
  o.cache_allocation = kv_allocation::lazy;
  head h(on_dev.config(), on_dev.head(), dev);
  h.use_inference_weights(weight_format::bf16);
  swarm::gathering_policy patient;
  patient.wait_fraction = 1e6;
  patient.max_wait = std::chrono::seconds(5);
  decode_batcher b(system, span_engine(on_dev.decoding_stage(), 4 * 96, o), std::move(h), {patient});
  std::vector<std::future<std::vector<std::int32_t>>> runs;
  // All four decode together (max_batch below), however late a thread starts.
  const token_callback hold = testing::hold_until_opened(b, prompts.size());
  for (const auto& prompt : prompts)
    runs.push_back(
        std::async(std::launch::async, [&b, &prompt, &p, hold] { return b.generate(prompt, p, hold).result.tokens; }));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    CHECK(runs[i].get() == want[i]);
  }
  const decode_batcher_stats s = b.stats();
  CHECK(s.steps == 4 * 16);
  CHECK(s.max_batch == 4);
  CHECK(s.step_errors == 0);
  // Batches of decode steps ran as recorded steps, none failed (a host read
  // inside would have).
  CHECK(dev.stats().recorded_steps.load() > 0);
  CHECK(dev.stats().failed_steps.load() == 0);
}

TEST_CASE("emulated device: the decode batcher's adapted generations beside base ones generate the cpu's merged tokens") {
  // Adapted sessions in the device-resident batches (their terms on their
  // own rows; such batches run unrecorded).
  testing::temp_dir_guard dir("emulated-batcher-lora");
  testing::write_tiny_model(dir.path(), testing::tiny_options_for(architecture::llama, 96));
  emulated_device_backend dev;
  transformer on_cpu = transformer::load(dir.path(), cpu_backend());
  auto adapter = std::make_shared<const lora_adapter>(testing::random_lora(on_cpu.config(), 9, 0.4f));
  transformer merged = transformer::load(dir.path(), cpu_backend(), {}, adapter);
  transformer on_dev = transformer::load(dir.path(), dev);
  const int vocab = on_cpu.config().vocab_size;
  generation_params p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::vector<std::int32_t>> want;
  const std::vector<std::string> which = {"a", "", "a", ""};
  generator base_gen(on_cpu), adapted_gen(merged);
  for (std::size_t i = 0; i < which.size(); ++i) {
    prompts.push_back(some_ids(4 + static_cast<int>(i) * 2, vocab, 20 + i));
    want.push_back((which[i].empty() ? base_gen : adapted_gen).generate(prompts.back(), p).tokens);
  }
  CHECK(want[0] != base_gen.generate(prompts[0], p).tokens);
  caf::actor_system_config config;
  caf::actor_system system{config};
  span_engine_options o;
  o.cache_allocation = kv_allocation::lazy;
  span_engine e(on_dev.decoding_stage(), 4 * 96, o);
  REQUIRE(e.add_adapter("a", *adapter));
  swarm::gathering_policy patient;
  patient.wait_fraction = 1e6;
  patient.max_wait = std::chrono::seconds(5);
  decode_batcher b(system, std::move(e), head(on_dev.config(), on_dev.head(), dev), {patient});
  CHECK(b.adapters() == std::vector<std::string>{"a"});
  std::vector<std::future<std::vector<std::int32_t>>> runs;
  const token_callback hold = testing::hold_until_opened(b, prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i)
    runs.push_back(std::async(std::launch::async, [&, i, hold] {
      return b.generate(prompts[i], p, hold, {}, which[i]).result.tokens;
    }));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    CHECK(runs[i].get() == want[i]);
  }
  const decode_batcher_stats s = b.stats();
  CHECK(s.max_batch == 4);
  CHECK(s.step_errors == 0);
  CHECK(dev.stats().failed_steps.load() == 0);
  // Alone, an adapted generation's decode steps run unrecorded (the terms'
  // scratch may grow), a base one's as recorded steps.
  const auto recorded = [&] { return dev.stats().recorded_steps.load(); };
  const auto before = recorded();
  CHECK(b.generate(prompts[0], p, {}, {}, "a").result.tokens == want[0]);
  CHECK(recorded() == before);
  CHECK(b.generate(prompts[1], p).result.tokens == want[1]);
  CHECK(recorded() > before);
}

TEST_CASE("emulated device: a generator per request takes turns on the device and generates the cpu's tokens") {
  testing::temp_dir_guard dir("emulated-per-request");
  testing::write_tiny_model(dir.path(), testing::tiny_options_for(architecture::gpt2, 96));
  emulated_device_backend dev;
  transformer on_cpu = transformer::load(dir.path(), cpu_backend());
  transformer on_dev = transformer::load(dir.path(), dev);
  generation_params p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  generator g(on_cpu);
  auto engine = api::make_local_engine(on_dev, 3, weight_format::f32, dtype::f32, api::local_decoding::per_request);
  CHECK_FALSE(engine->batching());
  std::vector<std::vector<std::int32_t>> prompts, want;
  for (std::uint64_t seed : {11, 12, 13}) {
    prompts.push_back(some_ids(5, on_cpu.config().vocab_size, seed));
    want.push_back(g.generate(prompts.back(), p).tokens);
  }
  std::vector<std::future<std::vector<std::int32_t>>> runs;
  std::atomic<int> streamed{0};
  for (const auto& prompt : prompts)
    runs.push_back(std::async(std::launch::async, [&, prompt] {
      return engine->generate(prompt, p, [&](std::int32_t) { ++streamed; }, {}).result.tokens;
    }));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    CHECK(runs[i].get() == want[i]);
  }
  CHECK(streamed == 3 * 12);
  CHECK(engine->busy() == 0);
}
