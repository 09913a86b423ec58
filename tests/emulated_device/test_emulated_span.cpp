// A swarm server's span engine with its blocks and KV pages on the emulated
// device (emulated_device.hpp) against the same engine on the cpu: every
// output must be equal, since the arithmetic is the CPU's. Covers what
// `corolla serve --device cuda` runs: prefill and decode steps, rollback,
// replay into a fresh session (failover), batched decode, sessions over
// part of the span, and the stateless forward and backward with deep
// prompts (fine-tuning clients), with f32 and bf16 KV caches; and servers
// holding only bf16, int8 or nf4 weights (keep_parameters = false).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/profiling_backend.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::random_tensor;

namespace {

bool same(const span_expected<Tensor>& a, const span_expected<Tensor>& b) {
  // Not REQUIRE_MESSAGE(a, a.error()...): doctest builds the message of a
  // passing assertion too under -s, and error() of a value throws.
  if (!a) FAIL(a.error().message);
  if (!b) FAIL(b.error().message);
  return a->dev().kind == device_kind::cpu && b->dev().kind == device_kind::cpu && a->shape() == b->shape() &&
         a->to_vector() == b->to_vector();
}

/// Session `s` of the batched-decode part ("b0", "b1", ...). Appended, not
/// "b" + to_string: GCC 12 warns falsely (-Wrestrict) on that.
std::string batch_session(int s) {
  std::string id = "b";
  id += std::to_string(s);
  return id;
}

/// The span engine of the model `base` (made 3 blocks deep) with a KV cache
/// of `kv` elements, on the emulated device and on the cpu: every output
/// equal.
void check_span_on_device(const testing::tiny_model_options& base, dtype kv) {
  testing::tiny_model_options o = base;
  o.layers = 3;
  testing::temp_dir_guard dir("emulated-span");
  testing::write_tiny_model(dir.path(), o);
  const model_config cfg = load_config(dir.path());
  const checkpoint ck = checkpoint::open(dir.path());
  emulated_device_backend dev;
  span_engine_options opts;
  opts.page_tokens = 8;
  opts.kv_dtype = kv;
  span_engine on_cpu = span_engine::load(ck, cfg, 0, 3, cpu_backend(), 512, opts);
  span_engine on_dev = span_engine::load(ck, cfg, 0, 3, dev, 512, opts);
  CHECK(on_dev.pool().bytes_per_token() == on_cpu.pool().bytes_per_token());
  const std::int64_t D = cfg.hidden_size;

  // Sessions: a prefill across page ends, decode steps, a rollback, and
  // a replay of the stored inputs into a fresh session.
  for (span_engine* e : {&on_cpu, &on_dev}) {
    REQUIRE(e->open_session("a", 40));
    REQUIRE(e->open_session("part", 40, 1, 3));  // blocks 1..2 of the span
  }
  const Tensor prompt = random_tensor({11, D}, 1);
  CHECK(same(on_dev.inference_step("a", prompt, 0), on_cpu.inference_step("a", prompt, 0)));
  CHECK(same(on_dev.inference_step("part", prompt, 0), on_cpu.inference_step("part", prompt, 0)));
  std::vector<Tensor> inputs{prompt};
  for (int t = 0; t < 6; ++t) {
    const Tensor x = random_tensor({1, D}, 10 + static_cast<std::uint64_t>(t));
    inputs.push_back(x);
    CHECK(same(on_dev.inference_step("a", x, 11 + t), on_cpu.inference_step("a", x, 11 + t)));
  }
  const Tensor redo = random_tensor({2, D}, 30);  // back to position 14: a rejected draft
  CHECK(same(on_dev.inference_step("a", redo, 14), on_cpu.inference_step("a", redo, 14)));
  REQUIRE(on_dev.open_session("replay", 40));
  std::int64_t pos = 0;
  for (std::size_t i = 0; i < 4; ++i) {  // the prompt and the steps kept before the rollback
    REQUIRE(on_dev.inference_step("replay", inputs[i], pos));
    pos += inputs[i].dim(0);
  }
  const Tensor next = random_tensor({1, D}, 40);
  CHECK(same(on_dev.inference_step("replay", redo, 14), on_cpu.inference_step("a", redo, 14)));
  CHECK(same(on_dev.inference_step("replay", next, 16), on_cpu.inference_step("a", next, 16)));

  // Batched decode over sessions of different lengths.
  for (span_engine* e : {&on_cpu, &on_dev})
    for (int s = 0; s < 3; ++s) {
      REQUIRE(e->open_session(batch_session(s), 40));
      REQUIRE(e->inference_step(batch_session(s), random_tensor({3 + 7 * s, D}, 50 + s), 0));
    }
  // A batch of decode steps runs as a recorded step (a step graph on CUDA)
  // after the first of its size: repeatable, nothing read back inside.
  const auto recorded = dev.stats().recorded_steps.load(), failed = dev.stats().failed_steps.load();
  for (int round = 0; round < 3; ++round) {
    std::vector<decode_item> items;
    for (int s = 0; s < 3; ++s)
      items.push_back({batch_session(s), random_tensor({1, D}, 60 + 3 * round + s), 3 + 7 * s + round, 0});
    const auto got = on_dev.decode_batch(items);
    const auto want = on_cpu.decode_batch(items);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(same(got[i], want[i]));
  }
  CHECK(dev.stats().failed_steps.load() == failed);
  CHECK(dev.stats().recorded_steps.load() - recorded == (cfg.is_moe() ? 0 : 2));
  // The device's "replay" went where the cpu's "a" did; its "a" stopped a token short.
  REQUIRE(on_dev.close_session("a"));
  CHECK(on_dev.cache_bytes_used() == on_cpu.cache_bytes_used());

  // Stateless forward and backward with deep prompts.
  const int B = 2, T = 6;
  const Tensor x = random_tensor({B * T, D}, 70);
  const Tensor prompts = random_tensor({3, 2, D}, 71, 0.5f);
  const Tensor dy = random_tensor({B * T, D}, 72);
  CHECK(same(on_dev.forward(x, B, T, prompts), on_cpu.forward(x, B, T, prompts)));
  const auto g_dev = on_dev.backward(x, dy, B, T, prompts);
  const auto g_cpu = on_cpu.backward(x, dy, B, T, prompts);
  if (!g_dev) FAIL(g_dev.error().message);
  REQUIRE(g_cpu);
  CHECK(g_dev->grad_input.dev().kind == device_kind::cpu);
  CHECK(g_dev->grad_input.to_vector() == g_cpu->grad_input.to_vector());
  CHECK(g_dev->grad_prompts.to_vector() == g_cpu->grad_prompts.to_vector());
}

}  // namespace

TEST_CASE("emulated device: a span engine on a device returns the cpu engine's outputs") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    check_span_on_device(testing::tiny_options_for(arch), dtype::f32);
  }
}

TEST_CASE("emulated device: with a bf16 KV cache too (rows converted as they are stored on the device)") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    check_span_on_device(testing::tiny_options_for(arch), dtype::bf16);
  }
}

TEST_CASE("emulated device: a mixture-of-experts span engine on a device returns the cpu engine's outputs") {
  // The experts' rows routed on the host from the device's router logits,
  // in every path a server runs (prefill, decode, batched decode, and the
  // frozen-weight backward of fine-tuning clients).
  for (const char* family : {"MixtralForCausalLM", "Qwen3MoeForCausalLM"}) {
    CAPTURE(family);
    testing::tiny_model_options o = testing::tiny_options_for(architecture::llama);
    o.family = family;
    if (o.family == "Qwen3MoeForCausalLM") {
      o.experts = 6;
      o.experts_per_token = 3;
      o.norm_topk_prob = false;
    }
    check_span_on_device(o, family == std::string("MixtralForCausalLM") ? dtype::f32 : dtype::bf16);
  }
}

namespace {

/// An inference-only span engine (keep_parameters = false: stage::
/// load_inference) of the model `base` (2 blocks deep) with `f` weights,
/// on the emulated device and on the cpu: the weights converted and the
/// norms, biases and router copied out of each block's parameters on the
/// device (own_shared_views), prefill and decode through the served
/// weights, and the fine-tuning forward and backward through weights
/// widened on the device (widen_block_weights, dequantize_rows) all equal
/// the cpu's.
void check_inference_only_span_on_device(const testing::tiny_model_options& base, weight_format f) {
  testing::tiny_model_options o = base;
  o.layers = 2;
  testing::temp_dir_guard dir("emulated-lean-span");
  testing::write_tiny_model(dir.path(), o);
  const model_config cfg = load_config(dir.path());
  const checkpoint ck = checkpoint::open(dir.path());
  emulated_device_backend emulated;
  profiling_backend dev(emulated);  // counts the widening's dequantize ops
  span_engine_options opts;
  opts.page_tokens = 8;
  opts.weights = f;
  opts.keep_parameters = false;
  span_engine on_cpu = span_engine::load(ck, cfg, 0, 2, cpu_backend(), 64, opts);
  span_engine on_dev = span_engine::load(ck, cfg, 0, 2, dev, 64, opts);
  REQUIRE(on_dev.blocks().inference_only());
  CHECK(on_dev.blocks().params().empty());
  CHECK(on_dev.blocks().inference_format() == f);
  const std::int64_t D = cfg.hidden_size;

  // A prefill across a page end, decode steps, a rollback.
  for (span_engine* e : {&on_cpu, &on_dev}) REQUIRE(e->open_session("s", 32));
  const Tensor prompt = random_tensor({9, D}, 1);
  CHECK(same(on_dev.inference_step("s", prompt, 0), on_cpu.inference_step("s", prompt, 0)));
  for (int t = 0; t < 3; ++t) {
    const Tensor x = random_tensor({1, D}, 10 + static_cast<std::uint64_t>(t));
    CHECK(same(on_dev.inference_step("s", x, 9 + t), on_cpu.inference_step("s", x, 9 + t)));
  }
  const Tensor redo = random_tensor({2, D}, 20);  // back to position 10
  CHECK(same(on_dev.inference_step("s", redo, 10), on_cpu.inference_step("s", redo, 10)));

  // Batched decode over two sessions.
  for (span_engine* e : {&on_cpu, &on_dev})
    for (int s = 0; s < 2; ++s) {
      REQUIRE(e->open_session(batch_session(s), 32));
      REQUIRE(e->inference_step(batch_session(s), random_tensor({2 + 5 * s, D}, 30 + s), 0));
    }
  std::vector<decode_item> items;
  for (int s = 0; s < 2; ++s) items.push_back({batch_session(s), random_tensor({1, D}, 40 + s), 2 + 5 * s, 0});
  dev.reset();
  dev.enable(true);
  const auto got = on_dev.decode_batch(items);
  dev.enable(false);
  const auto want = on_cpu.decode_batch(items);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(same(got[i], want[i]));
  // The batch's rows cross the bus once each way, not once per session
  // (a mixture of experts also copies each block's router logits down).
  long long copies = -1;
  for (const auto& t : dev.totals())
    if (t.op == "copy") copies = t.calls;
  if (!cfg.is_moe()) CHECK(copies == 2);

  // Stateless forward and backward with deep prompts: every block widened
  // on the device, one at a time.
  const int B = 2, T = 4;
  const Tensor x = random_tensor({B * T, D}, 50);
  const Tensor prompts = random_tensor({2, 2, D}, 51, 0.5f);
  const Tensor dy = random_tensor({B * T, D}, 52);
  CHECK(same(on_dev.forward(x, B, T, prompts), on_cpu.forward(x, B, T, prompts)));
  dev.reset();
  dev.enable(true);
  const auto g_dev = on_dev.backward(x, dy, B, T, prompts);
  dev.enable(false);
  const auto g_cpu = on_cpu.backward(x, dy, B, T, prompts);
  if (!g_dev) FAIL(g_dev.error().message);
  if (f != weight_format::bf16) {  // the linear weights dequantised on the device, one block at a time
    const std::string op = f == weight_format::int8 ? "dequantize_int8" : "dequantize_nf4";
    long long calls = 0;
    for (const auto& t : dev.totals())
      if (t.op == op) calls = t.calls;
    // The forward again, then the backward: each of the 2 blocks widened twice.
    const long long blocks = 2 * 2;
    if (cfg.is_moe()) {
      // q, k, v, o per block, and gate, up and down of each expert some row
      // is routed to (at least k of the E), not of every expert.
      CHECK(calls >= blocks * (4 + 3LL * cfg.experts_per_token));
      CHECK(calls <= blocks * (4 + 3LL * cfg.n_experts));
      CHECK((calls - blocks * 4) % 3 == 0);
    } else {
      CHECK(calls == blocks * (cfg.arch == architecture::llama ? 7 : 6));
    }
  }
  if (!g_cpu) FAIL(g_cpu.error().message);
  CHECK(g_dev->grad_input.dev().kind == device_kind::cpu);
  CHECK(g_dev->grad_input.to_vector() == g_cpu->grad_input.to_vector());
  CHECK(g_dev->grad_prompts.to_vector() == g_cpu->grad_prompts.to_vector());
}

}  // namespace

TEST_CASE("emulated device: an inference-only span engine (f32 parameters dropped) returns the cpu engine's outputs") {
  testing::tiny_model_options mixtral = testing::tiny_options_for(architecture::llama);  // 4 experts, 2 a token
  mixtral.family = "MixtralForCausalLM";
  const testing::tiny_model_options llama = testing::tiny_options_for(architecture::llama);
  const testing::tiny_model_options gpt2 = testing::tiny_options_for(architecture::gpt2);  // its biases owned too
  for (const auto& o : {llama, mixtral, gpt2}) {
    for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      CAPTURE(static_cast<int>(o.arch));
      CAPTURE(o.family);
      const std::string format = weight_format_name(f);
      CAPTURE(format);
      check_inference_only_span_on_device(o, f);
    }
  }
}
