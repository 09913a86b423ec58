// tests/model/test_inference_only.cpp — servers that hold their inference
// weights only (stage::load_inference, span_engine_options::keep_parameters
// = false, `serve --weights` without --keep-f32-weights): decode equals the
// stage that kept its f32 parameters, fine-tuning requests compute with the
// served weights widened (exactly the backward of an f32 model holding
// those widened weights), training is refused, and the memory accounting
// counts no f32 linear weights.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/block_ops.hpp"
#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "tests/model/span_engine_test_util.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::gpt2_opts;
using corolla::testing::llama_opts;
using corolla::testing::max_rel_diff;
using corolla::testing::model_dir;
using corolla::testing::random_tensor;
using corolla::testing::same_values;

namespace {

testing::tiny_model_options mixtral_opts() {
  testing::tiny_model_options o = llama_opts();
  o.family = "MixtralForCausalLM";
  o.experts = 4;
  o.experts_per_token = 2;
  return o;
}

span_engine_options weights_of(weight_format f, bool keep) {
  span_engine_options o;
  o.weights = f;
  o.keep_parameters = keep;
  return o;
}

/// Copies the linear weights of `from` (f32 block_tensors) into the same
/// roles of `to` (views of a param_set).
void copy_linear(Backend& be, const block_tensors& from, block_tensors& to) {
  for (Tensor block_tensors::*role : {&block_tensors::q_w, &block_tensors::k_w, &block_tensors::v_w,
                                      &block_tensors::o_w, &block_tensors::gate_w, &block_tensors::up_w,
                                      &block_tensors::down_w})
    if ((from.*role).defined()) be.copy(from.*role, to.*role);
  for (std::size_t e = 0; e < from.experts.size(); ++e)
    for (Tensor expert_tensors::*role : {&expert_tensors::gate_w, &expert_tensors::up_w, &expert_tensors::down_w})
      be.copy(from.experts[e].*role, to.experts[e].*role);
}

}  // namespace

TEST_CASE("an inference-only span decodes exactly as one that kept its f32 parameters") {
  for (const auto& o : {llama_opts(), gpt2_opts(), mixtral_opts()}) {
    model_dir m(o);
    for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      CAPTURE(o.family);
      const std::string format = weight_format_name(f);
      CAPTURE(format);
      span_engine kept = m.engine(0, 2, 256, weights_of(f, true));
      span_engine lean = m.engine(0, 2, 256, weights_of(f, false));
      CHECK_FALSE(kept.blocks().inference_only());
      CHECK(lean.blocks().inference_only());
      CHECK(lean.blocks().params().empty());
      CHECK(lean.blocks().size() == 2);
      CHECK(lean.blocks().inference_format() == f);
      REQUIRE(kept.open_session("s", 16));
      REQUIRE(lean.open_session("s", 16));
      // A prefill of 5 rows, then two decode steps.
      Tensor x = random_tensor({5, m.cfg.hidden_size}, 3);
      for (std::int64_t start : {0, 5, 6}) {
        auto a = kept.inference_step("s", x, start);
        auto b = lean.inference_step("s", x, start);
        REQUIRE(a);
        REQUIRE(b);
        CHECK(same_values(*a, *b));
        x = x.slice(0, 1).clone();
      }
    }
  }
}

TEST_CASE("an inference-only span's fine-tuning backward is that of its served weights widened") {
  for (const auto& o : {llama_opts(), gpt2_opts(), mixtral_opts()}) {
    model_dir m(o);
    Backend& be = cpu_backend();
    for (weight_format f : {weight_format::int8, weight_format::nf4}) {
      CAPTURE(o.family);
      const std::string format = weight_format_name(f);
      CAPTURE(format);
      span_engine lean = m.engine(0, 2, 64, weights_of(f, false));
      // The reference: an f32 stage whose parameters are the served weights
      // widened (quantised, then dequantised).
      stage widened = stage::load(m.ck, m.cfg, 0, 2, be);
      for (auto& p : widened.params()) {
        block_tensors views = block_tensors::of(m.cfg, p);
        block_tensors wide;
        widen_block_weights(be, m.cfg, inference_weights(be, views, f), wide);
        copy_linear(be, wide, views);
      }
      span_engine ref(std::move(widened), 64);
      span_engine exact = m.engine(0, 2, 64);  // the f32 weights themselves
      const int B = 2, T = 4;
      const std::int64_t D = m.cfg.hidden_size;
      const Tensor x = random_tensor({B * T, D}, 5);
      const Tensor r = random_tensor({B * T, D}, 6);
      const Tensor prompts = random_tensor({2, 2, D}, 7, 0.5f);
      auto got = lean.backward(x, r, B, T, prompts);
      auto want = ref.backward(x, r, B, T, prompts);
      auto f32 = exact.backward(x, r, B, T, prompts);
      REQUIRE(got);
      REQUIRE(want);
      REQUIRE(f32);
      CHECK(same_values(got->grad_input, want->grad_input));
      CHECK(same_values(got->grad_prompts, want->grad_prompts));
      // And near the f32 weights' gradients (the quantisation's error only).
      const double err = testing::relative_error(got->grad_input.to_vector(), f32->grad_input.to_vector());
      MESSAGE(o.family << " " << format << ": input gradient " << err << " from the f32 weights'");
      CHECK(err < (f == weight_format::int8 ? 0.2 : 1.0));  // tiny random models amplify 4-bit error
      auto fwd = lean.forward(x, B, T, prompts);
      auto fwd_ref = ref.forward(x, B, T, prompts);
      REQUIRE(fwd);
      REQUIRE(fwd_ref);
      CHECK(same_values(*fwd, *fwd_ref));
    }
  }
}

TEST_CASE("a frozen mixture-of-experts block widens only the experts rows are routed to, one at a time") {
  testing::tiny_model_options o = mixtral_opts();
  o.experts = 8;  // top-2 of 8: a single row reaches 2 of them
  model_dir m(o);
  Backend& be = cpu_backend();
  const std::int64_t D = m.cfg.hidden_size, F = m.cfg.intermediate_size;
  const std::int64_t attention = 4 * (block_ops::q_width(m.cfg) * D * 2 + block_ops::kv_width(m.cfg) * D * 2);  // q, o; k, v
  const std::int64_t expert = 4 * 3 * F * D;
  for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
    const std::string format = weight_format_name(f);
    CAPTURE(format);
    stage s = stage::load_inference(m.ck, m.cfg, 0, 2, be, f);
    const block_tensors& w = s.frozen_weights(0);
    CHECK(w.format == weight_format::f32);
    REQUIRE(w.experts.size() == 8u);
    for (const expert_tensors& e : w.experts) CHECK(e.format == f);  // still as served
    CHECK(s.frozen_scratch_bytes() == attention);
    // One row: its two experts are widened in turn into one expert's scratch.
    const Tensor x = random_tensor({1, D}, 3);
    const std::vector<std::int32_t> at0 = {0};
    const Tensor pos = Tensor::from_i32(at0, {1});
    Tensor y = Tensor::empty({1, D});
    block_activations a;
    block_forward(be, m.cfg, w, x, pos, 1, 1, y, a);
    int used = 0;
    for (int e = 0; e < 8; ++e) used += a.moe.route.offsets[e + 1] > a.moe.route.offsets[e] ? 1 : 0;
    CHECK(used == 2);
    CHECK(s.frozen_scratch_bytes() == attention + expert);
    // The same output as the block with every expert widened beforehand.
    stage f32 = stage::load(m.ck, m.cfg, 0, 2, be);
    block_tensors all;
    widen_block_weights(be, m.cfg, inference_weights(be, block_tensors::of(m.cfg, f32.params()[0]), f), all);
    Tensor y_all = Tensor::empty({1, D});
    block_activations a_all;
    block_forward(be, m.cfg, all, x, pos, 1, 1, y_all, a_all);
    CHECK(same_values(y, y_all));
    s.release_frozen_weights();
    CHECK(s.frozen_scratch_bytes() == 0);
  }
}

TEST_CASE("an inference-only stage trains none of its weights and refuses other weight formats") {
  model_dir m(llama_opts());
  Backend& be = cpu_backend();
  stage s = stage::load_inference(m.ck, m.cfg, 0, 2, be, weight_format::int8);
  CHECK(s.inference_only());
  CHECK(s.size() == 2);
  const std::int64_t D = m.cfg.hidden_size;
  Tensor x = random_tensor({4, D}, 1), y = Tensor::empty({4, D}), dx = Tensor::empty({4, D});
  // The training forward runs over its weights widened a block at a time
  // (an adapter trains beside them: test_qlora.cpp) ...
  stage_activations acts;
  s.forward(x, 1, 4, y, &acts);
  CHECK(std::isfinite(y.to_vector()[0]));
  // ... but a backward that would train them is refused.
  CHECK_THROWS_AS(s.backward(acts, y, dx), tensor_error);
  CHECK_THROWS_AS(s.grads(), tensor_error);
  CHECK_THROWS_AS(s.set_trained_weights(std::set<std::string>{"q.weight"}), tensor_error);
  s.set_compute_dtype(dtype::f32);  // widened weights are f32
  CHECK_THROWS_AS(s.set_compute_dtype(dtype::bf16), tensor_error);
  CHECK_THROWS_AS(s.use_inference_weights(weight_format::bf16), tensor_error);
  s.use_inference_weights(weight_format::int8);  // its own format: nothing to do
  CHECK_THROWS_AS(stage::load_inference(m.ck, m.cfg, 0, 2, be, weight_format::f32), tensor_error);
  try {
    s.backward(acts, y, dx);
    FAIL("a backward trained inference weights");
  } catch (const tensor_error& e) {
    CHECK(std::string(e.what()).find("inference weights only") != std::string::npos);
  }
  // Nothing of its own trained, the backward forms the input gradient only.
  s.set_trained_weights(std::set<std::string>{});
  s.backward(acts, y, dx);
  CHECK_FALSE(s.has_grads());
}

TEST_CASE("served block bytes without the f32 parameters count the inference weights, norms and router") {
  for (const auto& o : {llama_opts(), gpt2_opts(), mixtral_opts()}) {
    const model_config cfg = testing::tiny_config(o);
    CAPTURE(o.family);
    std::int64_t small = 0, linear = 0;  // f32 bytes of the norms, biases and router; linear parameters
    for (const auto& [name, shape] : block_layout(cfg)) {
      std::int64_t n = 1;
      for (std::int64_t d : shape) n *= d;
      if (shape.size() == 2 && name != "router.weight")
        linear += n;
      else
        small += 4 * n;
    }
    CHECK(served_block_bytes(cfg, weight_format::f32, false) == served_block_bytes(cfg, weight_format::f32));
    CHECK(served_block_bytes(cfg, weight_format::f32) == small + 4 * linear);
    for (weight_format f : {weight_format::bf16, weight_format::int8, weight_format::nf4}) {
      const std::int64_t lean = served_block_bytes(cfg, f, false), kept = served_block_bytes(cfg, f);
      CHECK(kept - lean == 4 * linear);
      CHECK(lean > small);
      CHECK(lean < 4 * linear);
    }
  }
}
