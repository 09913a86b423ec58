// A LoRA adapter (model/lora.hpp) training on a device: the device code path
// of the frozen weights' backward (input gradients only, by products with the
// weights), of the adapter's terms beside them (the fused epilogues skipped
// for the adapted products) and of its gradients gives the cpu's losses
// exactly in f32, and tracks them with bf16 compute, whose copies of the
// factors follow each update; beside nf4 weights (QLoRA) too. A server's sessions with adapters (the terms
// beside the unmerged weights, model/lora_factors.hpp) give the cpu engine's
// outputs, and so do its stateless forward and backward, also with a
// client's own adapter carried by the request (its gradients too).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/random_lora.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;

TEST_CASE("emulated device: a LoRA adapter trains to the cpu's losses, and with bf16 compute close to them") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::temp_dir_guard dir("emulated-lora");
    testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch, 64));
    lora_config c;
    c.rank = 4;
    c.targets = {"all-linear"};
    train_options opts;
    opts.batch = 2;
    opts.seq = 16;
    opts.steps = 6;
    opts.optimizer.adamw.lr = 2e-2f;
    const auto run = [&](Backend& be, dtype compute, weight_format base = weight_format::f32) {
      transformer m = base == weight_format::f32 ? transformer::load(dir.path(), be)
                                                 : transformer::load_inference(dir.path(), be, base);
      m.set_compute_dtype(compute);
      lora_adapter a = lora_adapter::init(m.config(), c, 8, be);
      const int vocab = m.config().vocab_size;
      // A repeated phrase: something an adapter of a few steps can learn.
      const std::vector<std::int32_t> phrase = some_ids(8, vocab, 17);
      std::vector<std::int32_t> tokens;
      for (int i = 0; i < 40; ++i) tokens.insert(tokens.end(), phrase.begin(), phrase.end());
      token_dataset d = token_dataset::from_tokens(tokens, vocab);
      train_options o = opts;
      o.adapter = &a;
      return trainer(m, d, o).run().losses;
    };
    const std::vector<float> cpu = run(cpu_backend(), dtype::f32);
    REQUIRE(cpu.back() < 0.5f * cpu.front());  // the adapter's updates matter
    emulated_device_backend dev;
    CHECK(run(dev, dtype::f32) == cpu);
    const std::vector<float> bf16 = run(dev, dtype::bf16);
    REQUIRE(bf16.size() == cpu.size());
    CHECK(bf16.back() < 0.5f * bf16.front());  // the factors' bf16 copies followed the updates
    for (std::size_t s = 0; s < cpu.size(); ++s) {
      CAPTURE(s);
      // bf16's rounding, as the mixed-precision tests allow; factors whose
      // copies missed the updates would stay at the base's loss.
      CHECK(std::abs(bf16[s] - cpu[s]) <= 5e-2f * std::max(1.0f, std::abs(cpu[s])));
    }
    // Beside nf4 weights (QLoRA): each block widened on the device for its
    // turn, the cpu's losses exactly; not the f32 base's.
    const std::vector<float> nf4 = run(cpu_backend(), dtype::f32, weight_format::nf4);
    CHECK(nf4.back() < 0.5f * nf4.front());
    CHECK(nf4.front() != cpu.front());
    CHECK(run(dev, dtype::f32, weight_format::nf4) == nf4);
  }
}

namespace {

/// Every output equal (the emulated device's arithmetic is the cpu's).
bool same_output(const span_expected<Tensor>& a, const span_expected<Tensor>& b) {
  if (!a) FAIL(a.error().message);
  if (!b) FAIL(b.error().message);
  return a->shape() == b->shape() && a->to_vector() == b->to_vector();
}

}  // namespace

TEST_CASE("emulated device: a server's sessions with adapters, batched with base sessions, give the cpu's outputs") {
  for (const weight_format f : {weight_format::f32, weight_format::bf16}) {
    CAPTURE(weight_format_name(f));
    testing::tiny_model_options o = testing::tiny_options_for(architecture::llama, 64);
    o.layers = 3;
    testing::temp_dir_guard dir("emulated-lora-span");
    testing::write_tiny_model(dir.path(), o);
    const model_config cfg = load_config(dir.path());
    const checkpoint ck = checkpoint::open(dir.path());
    const lora_adapter a = testing::random_lora(cfg, 5, 0.2f, 3);
    emulated_device_backend dev;
    span_engine_options opts;
    opts.weights = f;
    opts.keep_parameters = f == weight_format::f32;
    span_engine on_cpu = span_engine::load(ck, cfg, 1, 3, cpu_backend(), 256, opts);
    span_engine on_dev = span_engine::load(ck, cfg, 1, 3, dev, 256, opts);
    const std::int64_t D = cfg.hidden_size;
    for (span_engine* e : {&on_cpu, &on_dev}) {
      REQUIRE(e->add_adapter("a", a));
      REQUIRE(e->open_session("adapted", 32, -1, -1, {}, "a"));
      REQUIRE(e->open_session("base", 32));
    }
    const Tensor prompt = testing::random_tensor({5, D}, 1);
    const auto adapted = on_dev.inference_step("adapted", prompt, 0), base = on_dev.inference_step("base", prompt, 0);
    CHECK(same_output(adapted, on_cpu.inference_step("adapted", prompt, 0)));
    CHECK(same_output(base, on_cpu.inference_step("base", prompt, 0)));
    REQUIRE((adapted && base));
    CHECK(adapted->to_vector() != base->to_vector());  // the adapter's terms were added
    for (int t = 0; t < 3; ++t) {
      const Tensor x = testing::random_tensor({1, D}, 10 + static_cast<std::uint64_t>(t));
      const std::vector<decode_item> items = {{"adapted", x, 5 + t, 0}, {"base", x, 5 + t, 0}};
      auto got = on_dev.decode_batch(items), want = on_cpu.decode_batch(items);
      REQUIRE((got.size() == 2u && want.size() == 2u));
      CHECK(same_output(got[0], want[0]));
      CHECK(same_output(got[1], want[1]));
    }
    const Tensor x = testing::random_tensor({1, D}, 40);  // the single-row path alone
    CHECK(same_output(on_dev.inference_step("adapted", x, 8), on_cpu.inference_step("adapted", x, 8)));
    const Tensor h = testing::random_tensor({8, D}, 41);
    CHECK(same_output(on_dev.forward(h, 2, 4, {}, -1, -1, nullptr, "a"), on_cpu.forward(h, 2, 4, {}, -1, -1, nullptr, "a")));
  }
}

TEST_CASE("emulated device: a server's stateless forward and backward with an adapter on every linear weight give the cpu's") {
  // 24 rows: enough that the device fuses its epilogues (the residual adds,
  // GPT-2's GELU and its backward), which the adapted products must skip.
  for (const architecture arch : {architecture::gpt2, architecture::llama}) {
    CAPTURE(static_cast<int>(arch));
    testing::tiny_model_options o = testing::tiny_options_for(arch, 64);
    o.layers = 2;
    testing::temp_dir_guard dir("emulated-lora-stateless");
    testing::write_tiny_model(dir.path(), o);
    const model_config cfg = load_config(dir.path());
    const checkpoint ck = checkpoint::open(dir.path());
    const lora_adapter a = testing::random_lora(cfg, 7, 0.2f, 3);
    emulated_device_backend dev;
    span_engine on_cpu = span_engine::load(ck, cfg, 0, 2, cpu_backend(), 256);
    span_engine on_dev = span_engine::load(ck, cfg, 0, 2, dev, 256);
    REQUIRE(on_cpu.add_adapter("a", a));
    REQUIRE(on_dev.add_adapter("a", a));
    const std::int64_t D = cfg.hidden_size;
    const Tensor h = testing::random_tensor({24, D}, 50), g = testing::random_tensor({24, D}, 51);
    CHECK(same_output(on_dev.forward(h, 3, 8, {}, -1, -1, nullptr, "a"), on_cpu.forward(h, 3, 8, {}, -1, -1, nullptr, "a")));
    const auto got = on_dev.backward(h, g, 3, 8, {}, -1, -1, "a"), want = on_cpu.backward(h, g, 3, 8, {}, -1, -1, "a"),
               base = on_cpu.backward(h, g, 3, 8);
    REQUIRE((got && want && base));
    CHECK(got->grad_input.to_vector() == want->grad_input.to_vector());
    CHECK(want->grad_input.to_vector() != base->grad_input.to_vector());  // the adapter's terms count
  }
}

TEST_CASE("emulated device: a client's carried adapter gives the cpu's outputs and gradients on a server") {
  // The server's per-request copy of the factors lives on the device, and
  // so do its gradients until they are answered (lora_adapter::of_span).
  for (const architecture arch : {architecture::gpt2, architecture::llama}) {
    CAPTURE(static_cast<int>(arch));
    testing::tiny_model_options o = testing::tiny_options_for(arch, 64);
    o.layers = 3;
    testing::temp_dir_guard dir("emulated-lora-carried");
    testing::write_tiny_model(dir.path(), o);
    const model_config cfg = load_config(dir.path());
    const checkpoint ck = checkpoint::open(dir.path());
    lora_adapter a = testing::random_lora(cfg, 9, 0.2f, 3);
    emulated_device_backend dev;
    span_engine on_cpu = span_engine::load(ck, cfg, 0, 3, cpu_backend(), 256);
    span_engine on_dev = span_engine::load(ck, cfg, 0, 3, dev, 256);
    // Blocks [1, 3) of the span: the factors of the adapter's blocks 1 and 2.
    const lora_span_values carried{a.config(), a.span_values(1, 2)};
    const std::int64_t D = cfg.hidden_size;
    const Tensor h = testing::random_tensor({24, D}, 52), g = testing::random_tensor({24, D}, 53);
    CHECK(same_output(on_dev.forward(h, 3, 8, {}, 1, 3, nullptr, "", &carried),
                      on_cpu.forward(h, 3, 8, {}, 1, 3, nullptr, "", &carried)));
    const auto got = on_dev.backward(h, g, 3, 8, {}, 1, 3, "", &carried),
               want = on_cpu.backward(h, g, 3, 8, {}, 1, 3, "", &carried);
    REQUIRE((got && want));
    CHECK(got->grad_input.to_vector() == want->grad_input.to_vector());
    REQUIRE(got->grad_lora.numel() == carried.values.numel());
    REQUIRE(want->grad_lora.numel() == carried.values.numel());
    CHECK(got->grad_lora.dev().kind == device_kind::cpu);
    CHECK(testing::max_rel_diff(got->grad_lora, want->grad_lora) < 1e-5);
  }
}
