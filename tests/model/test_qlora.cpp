// LoRA over inference weights (QLoRA: model/lora.hpp's lora_tuning on a
// transformer::load_inference model): each step equals f32 LoRA over a
// model whose weights are the inference weights widened back (the values
// the quantised model computes with), the inference weights stay as
// loaded, and what would train them is refused.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/block.hpp"
#include "model/error.hpp"
#include "model/lora.hpp"
#include "model/moe.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/pattern_tokens.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using namespace corolla::testing;
namespace fs = std::filesystem;

namespace {

/// `model`'s linear weights replaced by those of format `f` widened back
/// to f32: the weights a model loaded with load_inference(f) computes with.
void round_trip_linear_weights(transformer& model, weight_format f) {
  Backend& be = model.backend();
  for (param_set& p : model.blocks()) {
    block_tensors w = block_tensors::of(model.config(), p);
    block_tensors wide;
    widen_block_weights(be, model.config(), inference_weights(be, w, f), wide);
    for (Tensor block_tensors::*role : {&block_tensors::q_w, &block_tensors::k_w, &block_tensors::v_w,
                                        &block_tensors::o_w, &block_tensors::gate_w, &block_tensors::up_w,
                                        &block_tensors::down_w})
      if ((w.*role).defined()) be.copy(wide.*role, w.*role);
    // A mixture of experts' experts, widened whole here (experts = true).
    for (std::size_t e = 0; e < w.experts.size(); ++e)
      for (Tensor expert_tensors::*role : {&expert_tensors::gate_w, &expert_tensors::up_w, &expert_tensors::down_w})
        be.copy(wide.experts[e].*role, w.experts[e].*role);
  }
}

}  // namespace

TEST_CASE("qlora: an adapter trained beside inference weights steps as f32 LoRA over the widened weights, and the weights stay as loaded") {
  temp_dir_guard tmp("qlora");
  write_pattern(tmp / "pattern.bin");
  tiny_model_options gpt2 = tiny_options_for(architecture::gpt2), qwen3, mixtral;
  qwen3.family = "Qwen3ForCausalLM";      // per-head q/k norms, frozen
  mixtral.family = "MixtralForCausalLM";  // experts widened one at a time in the backward too
  struct run_case {
    tiny_model_options o;
    weight_format f;
  };
  for (const run_case& rc : {run_case{tiny_model_options{}, weight_format::nf4}, run_case{gpt2, weight_format::int8},
                             run_case{qwen3, weight_format::nf4}, run_case{mixtral, weight_format::bf16}}) {
    CAPTURE(rc.o.family);
    CAPTURE(weight_format_name(rc.f));
    tiny_model_options o = rc.o;
    o.init_std = 0.1f;
    const fs::path dir = tmp / (o.family + weight_format_name(rc.f));
    write_tiny_model(dir, o);
    transformer quantised = transformer::load_inference(dir, cpu_backend(), rc.f);
    transformer reference = transformer::load(dir, cpu_backend());
    round_trip_linear_weights(reference, rc.f);
    const auto ids = pattern_ids(16, 0), targets = pattern_ids(16, 1);
    const float loaded_loss = quantised.forward_loss(ids, targets, 1, 16);
    CHECK(loaded_loss == doctest::Approx(reference.forward_loss(ids, targets, 1, 16)).epsilon(1e-5));

    lora_config c;
    c.rank = 4;
    c.alpha = 8.0f;
    c.targets = {"all-linear"};
    lora_adapter on_quantised = lora_adapter::init(quantised.config(), c, 3, cpu_backend());
    lora_adapter on_reference = lora_adapter::init(reference.config(), c, 3, cpu_backend());
    token_dataset data_q = token_dataset::open(tmp / "pattern.bin", nullptr, o.vocab);
    token_dataset data_r = token_dataset::open(tmp / "pattern.bin", nullptr, o.vocab);
    train_options opts;
    opts.batch = 2;
    opts.seq = 16;
    opts.steps = 6;
    opts.optimizer.adamw.lr = 1e-2f;
    std::vector<float> losses_q, losses_r;
    {
      train_options oq = opts;
      oq.adapter = &on_quantised;
      trainer tq(quantised, data_q, oq);
      losses_q = tq.run().losses;
      CHECK(quantised.gradient_values() == 0);  // no gradient buffer, nor parameters to make one of
    }
    {
      train_options orf = opts;
      orf.adapter = &on_reference;
      trainer tr(reference, data_r, orf);
      losses_r = tr.run().losses;
    }
    REQUIRE(losses_q.size() == losses_r.size());
    for (std::size_t s = 0; s < losses_q.size(); ++s) {
      CAPTURE(s);
      CHECK(losses_q[s] == doctest::Approx(losses_r[s]).epsilon(1e-5));
    }
    // It learns (a mixture of experts' adapter holds its attention only: slower).
    CHECK(losses_q.back() < (o.family == mixtral.family ? 0.99f : 0.8f) * losses_q.front());
    for (int l = 0; l < quantised.config().n_layers; ++l)
      CHECK(max_rel_diff(on_quantised.block(l).flat(), on_reference.block(l).flat()) < 1e-4);
    // The trainer gone, the inference weights are as loaded (nothing merged
    // into them): the loss without the adapter is the loaded one, bit for bit.
    CHECK(quantised.forward_loss(ids, targets, 1, 16) == loaded_loss);
  }
}

TEST_CASE("qlora: inference weights train nothing of their own, and compute in f32") {
  temp_dir_guard tmp("qlora-refusals");
  write_tiny_model(tmp / "m", tiny_model_options{});
  transformer model = transformer::load_inference(tmp / "m", cpu_backend(), weight_format::int8);
  const auto ids = pattern_ids(16, 0), targets = pattern_ids(16, 1);
  CHECK_THROWS_AS(model.forward_backward(ids, targets, 1, 16), tensor_error);
  CHECK_THROWS_AS(model.groups(), tensor_error);
  CHECK_THROWS_AS(model.set_trained_weights(std::set<std::string>{"q.weight"}), tensor_error);
  model.set_compute_dtype(dtype::f32);  // what it computes in already
  CHECK_THROWS_AS(model.set_compute_dtype(dtype::bf16), tensor_error);
  // With nothing of its own trained the backward runs: input gradients only.
  model.set_trained_weights(std::set<std::string>{});
  CHECK(std::isfinite(model.forward_backward(ids, targets, 1, 16)));
  CHECK(model.gradient_values() == 0);
  model.set_trained_weights(std::nullopt);
  try {
    model.forward_backward(ids, targets, 1, 16);
    FAIL("forward_backward trained inference weights");
  } catch (const tensor_error& e) {
    CHECK(std::string(e.what()).find("lora_tuning") != std::string::npos);
  }
}
