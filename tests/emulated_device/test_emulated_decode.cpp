// Decode with bf16 inference weights on the emulated device, which answers
// Backend::linear_fused and linear_rope_store_kv as the CUDA backend does
// (f32 rows with a bf16 weight): the model's fused decode path (the
// residual add, GELU and SwiGLU as the product's epilogue, and a step's
// q/k/v product with RoPE and the cache append, model/block_cached.cpp)
// runs here and must generate what the cpu generates through the unfused
// ops. The emulated device's
// fused ops are the two ops with the cpu's arithmetic, so this checks the
// model's wiring (which product, which residual, which slices of a stacked
// weight); tests/cuda_emulated/linear_bf16.cpp checks the CUDA kernel.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/profiling_backend.hpp"
#include "model/generator.hpp"
#include "model/transformer.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;

TEST_CASE("emulated device: bf16-weight decode through the fused products generates the cpu's tokens") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::temp_dir_guard dir("emulated-fused-decode");
    testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch, 96));
    emulated_device_backend dev;
    profiling_backend counted(dev);  // records a fused op only when the backend ran it fused
    transformer on_cpu = transformer::load(dir.path(), cpu_backend());
    transformer on_dev = transformer::load(dir.path(), counted);
    const int vocab = on_cpu.config().vocab_size;
    generation_params p;
    p.max_new_tokens = 24;
    p.ignore_eos = true;
    generator g_cpu(on_cpu, 0, weight_format::bf16), g_dev(on_dev, 0, weight_format::bf16);
    for (std::uint64_t seed : {5, 6, 7}) {
      const auto prompt = some_ids(12, vocab, seed);
      counted.reset();
      counted.enable(true);
      const auto got = g_dev.generate(prompt, p).tokens;
      counted.enable(false);
      CHECK(got == g_cpu.generate(prompt, p).tokens);
    }
    // The fused path was taken: per layer, on every decode step (one row)
    // and on the prefill's single pass (12 rows, within the 16 the fused
    // GEMV takes), the last residual add, and GELU and the attention
    // output's residual add (GPT-2); SwiGLU (Llama) needs the stacked
    // gate/up weight of one-row steps.
    // The q/k/v product stores RoPE'd keys and values itself on every
    // one-row step (stacked weight), for both (GPT-2: biases, no rotation).
    long long add = 0, gelu = 0, swiglu = 0, qkv = 0, separate_stores = 0;
    for (const auto& t : counted.totals()) {
      if (t.op == "linear + add (fused)") add = t.calls;
      if (t.op == "linear + gelu (fused)") gelu = t.calls;
      if (t.op == "linear + swiglu (fused)") swiglu = t.calls;
      if (t.op == "linear + rope + kv store (fused)") qkv = t.calls;
      if (t.op == "rope_store_kv") separate_stores = t.calls;
    }
    const long long layers = on_cpu.config().n_layers;
    const long long steps = p.max_new_tokens - 1, passes = steps + 1;
    CHECK(qkv == layers * steps);
    CHECK(separate_stores == 0);
    if (arch == architecture::llama) {
      CHECK(swiglu == layers * steps);
      CHECK(add == layers * passes);
      CHECK(gelu == 0);
    } else {
      CHECK(gelu == layers * passes);
      CHECK(add == 2 * layers * passes);
      CHECK(swiglu == 0);
    }
  }
}

TEST_CASE("emulated device: linear_fused takes CUDA's operands, leaves others to the caller, refuses malformed ones") {
  emulated_device_backend dev;
  auto on_dev = [&](shape_t shape, dtype t) {
    Tensor d = dev.empty(shape, t);
    Tensor h = Tensor::empty(shape, dtype::f32);
    float* p = h.data<float>();
    for (std::int64_t i = 0; i < h.numel(); ++i) p[i] = 0.01f * static_cast<float>(i % 17);
    dev.copy(h, d);
    return d;
  };
  const Tensor x = on_dev({1, 16}, dtype::f32), w = on_dev({8, 16}, dtype::bf16), w32 = on_dev({8, 16}, dtype::f32);
  const Tensor bias4 = on_dev({4}, dtype::f32), res = on_dev({1, 8}, dtype::f32);
  Tensor y8 = dev.empty({1, 8}), y4 = dev.empty({1, 4});
  // not its operands: false, nothing done
  CHECK_FALSE(dev.linear_fused(x, w32, nullptr, linear_epilogue::gelu, nullptr, y8));
  const Tensor many = on_dev({17, 16}, dtype::f32);
  Tensor y17 = dev.empty({17, 8});
  CHECK_FALSE(dev.linear_fused(many, w, nullptr, linear_epilogue::gelu, nullptr, y17));
  // its operands: done
  CHECK(dev.linear_fused(x, w, nullptr, linear_epilogue::swiglu, nullptr, y4));
  CHECK(dev.linear_fused(x, w, nullptr, linear_epilogue::add, &res, y8));
  // malformed: one clear error each
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const tensor_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of([&] { dev.linear_fused(x, w, &bias4, linear_epilogue::swiglu, nullptr, y4); }) ==
        "linear_fused (swiglu): swiglu takes no bias");
  CHECK(error_of([&] { dev.linear_fused(x, w, nullptr, linear_epilogue::gelu, &res, y8); }) ==
        "linear_fused (gelu): a residual is given with the add epilogue, and only then");
  CHECK(error_of([&] { dev.linear_fused(x, w, nullptr, linear_epilogue::add, nullptr, y8); }) ==
        "linear_fused (add): a residual is given with the add epilogue, and only then");
  CHECK(error_of([&] { dev.linear_fused(x, w, nullptr, linear_epilogue::gelu, nullptr, y4); }).find(
            "linear_fused (gelu)") == 0);

  // linear_rope_store_kv: one q and one kv head of 2 (weight rows 2 + 2 * 2 = 6)
  const Tensor w6 = on_dev({6, 16}, dtype::bf16), pos = Tensor::from_i32(std::vector<std::int32_t>{3}, {1});
  Tensor q = dev.empty({1, 2}), k_row = dev.empty({1, 2}), v_row = dev.empty({1, 2});
  auto store = [&](const Tensor& xs, const Tensor& ws, Tensor& qs, void* k_out) {
    return dev.linear_rope_store_kv(xs, ws, nullptr, pos, 1, 1, 2, 10000.0, true, qs, k_out, v_row.raw(),
                                    dtype::f32);
  };
  CHECK_FALSE(store(x, on_dev({6, 16}, dtype::f32), q, k_row.raw()));  // an f32 weight
  CHECK_FALSE(store(on_dev({2, 16}, dtype::f32), w6, q, k_row.raw()));  // two rows
  CHECK_FALSE(store(on_dev({1, 12}, dtype::f32), on_dev({6, 12}, dtype::bf16), q, k_row.raw()));  // in % 8 != 0
  CHECK(store(x, w6, q, k_row.raw()));
  CHECK(error_of([&] { store(x, w, q, k_row.raw()); }).find("linear_rope_store_kv w") == 0);  // 8 rows, not 6
  CHECK(error_of([&] { store(x, w6, y8, k_row.raw()); }).find("linear_rope_store_kv q") == 0);
  CHECK(error_of([&] { store(x, w6, q, nullptr); }) == "linear_rope_store_kv: no destination rows");
}

TEST_CASE("emulated device: int8- and nf4-weight decode (quantised on the device) generates the cpu's tokens") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    for (weight_format f : {weight_format::int8, weight_format::nf4}) {
      CAPTURE(static_cast<int>(arch));
      CAPTURE(weight_format_name(f));
      testing::temp_dir_guard dir("emulated-q8-decode");
      testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch, 96));
      emulated_device_backend dev;
      transformer on_cpu = transformer::load(dir.path(), cpu_backend());
      transformer on_dev = transformer::load(dir.path(), dev);
      generation_params p;
      p.max_new_tokens = 16;
      p.ignore_eos = true;
      generator g_cpu(on_cpu, 0, f), g_dev(on_dev, 0, f);
      const auto prompt = some_ids(12, on_cpu.config().vocab_size, 9);
      CHECK(g_dev.generate(prompt, p).tokens == g_cpu.generate(prompt, p).tokens);
    }
  }
}

TEST_CASE("emulated device: bf16-, int8- and nf4-weight decode of mixture-of-experts models generates the cpu's tokens") {
  // Each expert's weights converted (quantised) on the device, the router
  // kept f32; prefill and one-row decode steps route through the same experts.
  for (const char* family : {"MixtralForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"}) {
    CAPTURE(family);
    testing::tiny_model_options o = testing::tiny_options_for(architecture::llama, 96);
    o.family = family;
    testing::temp_dir_guard dir("emulated-moe-decode");
    testing::write_tiny_model(dir.path(), o);
    emulated_device_backend dev;
    transformer on_cpu = transformer::load(dir.path(), cpu_backend());
    transformer on_dev = transformer::load(dir.path(), dev);
    for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      CAPTURE(weight_format_name(f));
      generation_params p;
      p.max_new_tokens = 16;
      p.ignore_eos = true;
      generator g_cpu(on_cpu, 0, f), g_dev(on_dev, 0, f);
      const auto prompt = some_ids(12, on_cpu.config().vocab_size, 9);
      CHECK(g_dev.generate(prompt, p).tokens == g_cpu.generate(prompt, p).tokens);
    }
  }
}

TEST_CASE("emulated device: decode steps run as recorded steps (repeatable, nothing read back) and generate the cpu's tokens") {
  // The CUDA backend's step graphs capture every decode step after a
  // generator's first; here each such step runs twice, and a host read
  // inside it would fail it (kernels/cuda/step_graph.cpp,
  // emulated_device.hpp). Long enough to cross KV pages (16 tokens each).
  for (architecture arch : {architecture::llama, architecture::gpt2})
    for (weight_format f : {weight_format::f32, weight_format::bf16, weight_format::int8}) {
      CAPTURE(static_cast<int>(arch));
      CAPTURE(weight_format_name(f));
      testing::temp_dir_guard dir("emulated-recorded-decode");
      testing::write_tiny_model(dir.path(), testing::tiny_options_for(arch, 96));
      emulated_device_backend dev;
      transformer on_cpu = transformer::load(dir.path(), cpu_backend());
      transformer on_dev = transformer::load(dir.path(), dev);
      generation_params p;
      p.max_new_tokens = 30;
      p.ignore_eos = true;
      const dtype kv = f == weight_format::bf16 ? dtype::bf16 : dtype::f32;
      generator g_cpu(on_cpu, 0, f, kv), g_dev(on_dev, 0, f, kv);
      const auto prompt = some_ids(9, on_cpu.config().vocab_size, 21);
      CHECK(g_dev.generate(prompt, p).tokens == g_cpu.generate(prompt, p).tokens);
      // 29 decode steps: the first as it comes, 28 recorded, none failed.
      CHECK(dev.stats().recorded_steps.load() == p.max_new_tokens - 2);
      CHECK(dev.stats().failed_steps.load() == 0);
      // The recording lives with the generator: every step of the next
      // generation is recorded, and so is the one-row last piece of a
      // prompt of 9 in pieces of 4 (the same ops as a decode step).
      p.prefill_chunk = 4;
      CHECK(g_dev.generate(prompt, p).tokens == g_cpu.generate(prompt, p).tokens);
      CHECK(dev.stats().recorded_steps.load() == 2 * p.max_new_tokens - 2);
      CHECK(dev.stats().failed_steps.load() == 0);
    }
}

TEST_CASE("emulated device: a recorded step that reads back runs again as it comes, and a real error still throws") {
  emulated_device_backend dev;
  std::unique_ptr<step_recording> rec;
  Tensor d = dev.empty({4});
  Tensor h = Tensor::empty({4});
  int runs = 0;
  auto read_back = [&] {
    ++runs;
    d.zero();
    dev.copy(d, h);  // a copy to the host: no graph can make it now
  };
  dev.run_step(rec, read_back);  // the first step of a recording runs as it comes
  CHECK(runs == 1);
  CHECK(rec != nullptr);
  dev.run_step(rec, read_back);
  CHECK(runs == 3);  // the failed recording, then as it comes
  CHECK(dev.stats().failed_steps.load() == 1);
  CHECK(dev.stats().recorded_steps.load() == 0);
  CHECK(h.data<float>()[0] == 0.0f);
  // Nothing read back: recorded (run twice).
  dev.run_step(rec, [&] {
    ++runs;
    dev.scale(d, 2.0f);
  });
  CHECK(runs == 5);
  CHECK(dev.stats().recorded_steps.load() == 1);
  // A real error leaves run_step as it would have left the ops, and is not
  // counted against the recording.
  Tensor wrong = dev.empty({3});
  CHECK_THROWS_AS(dev.run_step(rec, [&] { dev.add(d, wrong, d); }), tensor_error);
  CHECK(dev.stats().failed_steps.load() == 1);
  // The tensor layer's memory hooks (CUDA's legacy stream, outside a graph)
  // fail a recorded step too.
  dev.run_step(rec, [&] { d.zero(); });
  CHECK(dev.stats().failed_steps.load() == 2);
  dev.run_step(rec, [&] { (void)d.clone(); });
  CHECK(dev.stats().failed_steps.load() == 3);
  CHECK(dev.stats().recorded_steps.load() == 1);
}
