// A client's own LoRA adapter carried by stateless requests (span_engine's
// `carried`, model/prompt_tuning.hpp's adapter): its gradients against
// finite differences of the loss, tuning it through local blocks equals a
// single process's LoRA training (lora_tuning), a request over some of the
// blocks answers those blocks' part, and what does not fit is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/config.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/optimizer.hpp"
#include "model/prompt_tuning.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"
#include "tests/model/tuning_model.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
namespace {

double largest(const Tensor& t) {
  double m = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, static_cast<double>(std::abs(t.data<float>()[i])));
  return m;
}

lora_config config_of(int rank, std::vector<std::string> targets) {
  lora_config c;
  c.rank = rank;
  c.alpha = 2.0f * static_cast<float>(rank);
  c.targets = std::move(targets);
  return c;
}

/// An adapter whose B is not zero (a fresh one's is: dA would be zero).
lora_adapter trained_looking(const model_config& cfg, const lora_config& c, std::uint64_t seed) {
  lora_adapter a = lora_adapter::init(cfg, c, seed, cpu_backend());
  for (int i = 0; i < a.n_layers(); ++i) {
    const Tensor noise = testing::random_tensor(a.block(i).flat().shape(), seed + 100 + static_cast<std::uint64_t>(i), 0.3f);
    a.block(i).flat().copy_from(noise);
  }
  return a;
}

}  // namespace

TEST_CASE("a carried adapter's gradients match finite differences of the loss") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::tuning_model m(arch);
    lora_adapter a = trained_looking(m.cfg, config_of(2, {"all-linear"}), 5);
    prompt_tuning_options o;
    o.prompt_len = 0;  // the adapter alone
    prompt_tuner tuner(*m.h, *m.runner, o, &a);
    const int B = 2, T = 5;
    const auto ids = testing::tuning_ids(B * T, m.cfg.vocab_size, 3);
    auto targets = testing::tuning_ids(B * T, m.cfg.vocab_size, 4);
    targets[2] = -1;  // an ignored row
    tuner.gradients(ids, targets, B, T);
    std::vector<param_group> groups = a.groups();
    for (int i = 0; i < a.n_layers(); ++i) {
      CAPTURE(i);
      const Tensor grad = groups[static_cast<std::size_t>(i)].grads->flat().clone();
      CHECK(largest(grad) > 0);
      testing::check_direction("block's adapter", a.block(i).flat(), grad,
                               [&] { return static_cast<double>(tuner.loss(ids, targets, B, T)); },
                               31 + static_cast<std::uint64_t>(i));
    }
  }
}

TEST_CASE("tuning an adapter through local blocks equals single-process LoRA training") {
  struct kind {
    architecture arch;
    std::vector<std::string> targets;
    bool with_prompts;
  };
  for (const kind& k : {kind{architecture::llama, {"all-linear"}, false}, kind{architecture::gpt2, {}, false},
                        kind{architecture::llama, {}, true}}) {
    CAPTURE(static_cast<int>(k.arch));
    CAPTURE(k.with_prompts);
    testing::tuning_model m(k.arch);
    const lora_config c = config_of(4, k.targets);
    const int B = 2, T = 6, steps = 6;
    const float lr = 2e-2f;
    std::vector<std::vector<std::int32_t>> ids, targets;
    // Two batches in turn: the loss on them falls as the adapter learns.
    for (int s = 0; s < steps; ++s) {
      ids.push_back(testing::tuning_ids(B * T, m.cfg.vocab_size, 10 + static_cast<std::uint64_t>(s % 2)));
      targets.push_back(testing::tuning_ids(B * T, m.cfg.vocab_size, 50 + static_cast<std::uint64_t>(s % 2)));
    }

    // The client's way: the adapter on the host, the blocks behind a runner
    // that carries it with each request.
    lora_adapter mine = lora_adapter::init(m.cfg, c, 9, cpu_backend());
    prompt_tuning_options o;
    o.prompt_len = k.with_prompts ? 2 : 0;
    o.optimizer.lr = lr;
    prompt_tuner tuner(*m.h, *m.runner, o, &mine);
    std::vector<float> got;
    for (int s = 0; s < steps; ++s) got.push_back(tuner.step(ids[s], targets[s], B, T));

    if (k.with_prompts) {
      // Prompts change the model's input: the runs differ, and both train.
      CHECK(tuner.prompts().defined());
      const lora_adapter fresh = lora_adapter::init(m.cfg, c, 9, cpu_backend());
      for (int i = 0; i < m.cfg.n_layers; ++i) CHECK(testing::max_rel_diff(mine.block(i).flat(), fresh.block(i).flat()) > 1e-3);
      CHECK(got[steps - 2] < got[0]);  // the same batch, four updates later
      continue;
    }
    // One process: the model's forward and backward with the adapter's
    // terms (lora_tuning), AdamW over the adapter's groups.
    transformer model = transformer::load(m.dir.path(), cpu_backend());
    lora_adapter ref = lora_adapter::init(m.cfg, c, 9, cpu_backend());
    std::vector<float> want;
    {
      lora_tuning tuning(model, ref);
      optimizer_settings settings;
      settings.adamw.lr = lr;
      adamw_optimizer opt(tuning.groups(), settings, cpu_backend());
      for (int s = 0; s < steps; ++s) {
        tuning.zero_grads();
        want.push_back(model.forward_backward(ids[s], targets[s], B, T));
        opt.step();
        tuning.refresh();
      }
    }
    REQUIRE(got.size() == want.size());
    for (int s = 0; s < steps; ++s) CHECK(got[s] == doctest::Approx(want[s]).epsilon(1e-5));
    CHECK(got[steps - 2] < got[0]);  // the same batch, four updates later
    for (int i = 0; i < m.cfg.n_layers; ++i)
      CHECK(testing::max_rel_diff(mine.block(i).flat(), ref.block(i).flat()) < 1e-4);
  }
}

TEST_CASE("a stateless request over some blocks carries and answers those blocks' part of the adapter") {
  testing::tuning_model m(architecture::llama);
  lora_adapter a = trained_looking(m.cfg, config_of(3, {"q_proj", "down_proj"}), 7);
  const int B = 2, T = 4;
  const Tensor x = testing::random_tensor({B * T, m.cfg.hidden_size}, 3, 1.0f);
  const Tensor dy = testing::random_tensor({B * T, m.cfg.hidden_size}, 4, 1.0f);
  const lora_span_values all{a.config(), a.span_values(0, 3)};
  auto whole = m.blocks->backward(x, dy, B, T, Tensor(), -1, -1, "", &all);
  REQUIRE(whole);
  const std::int64_t per_block = a.block_numel();
  REQUIRE(whole.value().grad_lora.numel() == 3 * per_block);

  // Blocks [0, 1) then [1, 3) as two hops: the same output and gradients.
  const lora_span_values first{a.config(), a.span_values(0, 1)}, rest{a.config(), a.span_values(1, 2)};
  auto h1 = m.blocks->forward(x, B, T, Tensor(), 0, 1, nullptr, "", &first);
  REQUIRE(h1);
  auto out_whole = m.blocks->forward(x, B, T, Tensor(), -1, -1, nullptr, "", &all);
  auto out_rest = m.blocks->forward(h1.value(), B, T, Tensor(), 1, 3, nullptr, "", &rest);
  REQUIRE(out_whole);
  REQUIRE(out_rest);
  CHECK(testing::max_rel_diff(out_rest.value(), out_whole.value()) < 1e-5);
  // Without the adapter the output differs: the terms were applied.
  auto plain = m.blocks->forward(x, B, T);
  REQUIRE(plain);
  CHECK(testing::max_rel_diff(plain.value(), out_whole.value()) > 1e-3);

  auto g_rest = m.blocks->backward(h1.value(), dy, B, T, Tensor(), 1, 3, "", &rest);
  REQUIRE(g_rest);
  auto g_first = m.blocks->backward(x, g_rest.value().grad_input, B, T, Tensor(), 0, 1, "", &first);
  REQUIRE(g_first);
  CHECK(testing::max_rel_diff(g_first.value().grad_input, whole.value().grad_input) < 1e-4);
  REQUIRE(g_first.value().grad_lora.numel() == per_block);
  REQUIRE(g_rest.value().grad_lora.numel() == 2 * per_block);
  CHECK(testing::max_rel_diff(g_first.value().grad_lora, whole.value().grad_lora.slice(0, per_block)) < 1e-4);
  CHECK(testing::max_rel_diff(g_rest.value().grad_lora, whole.value().grad_lora.slice(per_block, 3 * per_block)) < 1e-4);
  // The answer lays the gradients out as the adapter's values are laid out.
  lora_adapter back = lora_adapter::zeros(m.cfg, a.config());
  back.set_span_values(0, 3, whole.value().grad_lora, /*grads=*/true);
  CHECK(testing::max_rel_diff(back.span_values(0, 3, true), whole.value().grad_lora) == 0);
  CHECK(back.span_values(0, 3).numel() == 3 * per_block);
  CHECK(largest(back.span_values(1, 1, true)) > 0);
}

TEST_CASE("a carried adapter that does not fit its blocks is refused with what is wrong") {
  testing::tuning_model m(architecture::llama);
  lora_adapter a = trained_looking(m.cfg, config_of(2, {}), 7);
  const int B = 1, T = 3;
  const Tensor x = testing::random_tensor({B * T, m.cfg.hidden_size}, 3, 1.0f);
  const auto refused = [&](const lora_span_values& v, const std::string& held, const std::string& says) {
    auto r = m.blocks->forward(x, B, T, Tensor(), 0, 2, nullptr, held, &v);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == span_errc::invalid_argument);
    CHECK_MESSAGE(r.error().message.find(says) != std::string::npos, r.error().message);
  };
  const std::int64_t per_block = a.block_numel();
  const std::string two_blocks = "needs f32 [" + std::to_string(2 * per_block) + "] on the host";
  // Values for one block where two are asked, none, another dtype or shape.
  refused({a.config(), a.span_values(0, 1)}, "", two_blocks + ", got f32 [" + std::to_string(per_block) + "]");
  refused({a.config(), Tensor()}, "", two_blocks + ", got none");
  refused({a.config(), a.span_values(0, 2).to(dtype::bf16)}, "", two_blocks + ", got bf16");
  refused({a.config(), a.span_values(0, 2).view({2, per_block})}, "", two_blocks + ", got f32 [2, ");
  // A rank above the servers' limit, a bad alpha, a module the model lacks.
  lora_config big = a.config();
  big.rank = max_carried_lora_rank + 1;
  refused({big, {}}, "", "at most 128");
  lora_config bad = a.config();
  bad.alpha = -1.0f;
  refused({bad, a.span_values(0, 2)}, "", "alpha");
  lora_config gpt = a.config();
  gpt.targets = {"c_attn"};
  refused({gpt, a.span_values(0, 2)}, "", "names no module");
  // A held adapter's name beside it.
  refused({a.config(), a.span_values(0, 2)}, "held", "not both");
  // Without the adapter the same request goes through, and with it too.
  CHECK(m.blocks->forward(x, B, T, Tensor(), 0, 2));
  const lora_span_values fits{a.config(), a.span_values(0, 2)};
  CHECK(m.blocks->forward(x, B, T, Tensor(), 0, 2, nullptr, "", &fits));
}

}  // namespace corolla
