// Prompt tuning (model/prompt_tuning.hpp) over local blocks: the prompts'
// gradient against finite differences of the loss (deep and shallow), the
// loss falls as the prompts train, and bad batches are clear errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "model/config.hpp"
#include "model/error.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/lora.hpp"
#include "model/prompt_tuning.hpp"
#include "model/safetensors.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"
#include "tests/model/tuning_model.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {

TEST_CASE("prompt gradients match finite differences of the loss, deep and shallow") {
  for (architecture arch : {architecture::llama, architecture::gpt2})
    for (bool deep : {true, false}) {
      CAPTURE(deep);
      CAPTURE(static_cast<int>(arch));
      testing::tuning_model m(arch);
      prompt_tuning_options o;
      o.prompt_len = 3;
      o.deep = deep;
      o.init_std = 0.5f;
      prompt_tuner tuner(*m.h, *m.runner, o);
      const int B = 2, T = 5;
      const auto ids = testing::tuning_ids(B * T, m.cfg.vocab_size, 3);
      auto targets = testing::tuning_ids(B * T, m.cfg.vocab_size, 4);
      targets[2] = -1;  // an ignored row
      tuner.gradients(ids, targets, B, T);
      const Tensor grads = tuner.prompt_gradients().clone();
      if (deep) {
        testing::check_direction("deep prompts", tuner.prompts(), grads,
                                 [&] { return static_cast<double>(tuner.loss(ids, targets, B, T)); }, 17);
      } else {
        // Only prompt 0 trains: the gradient is zero beyond it, and the
        // direction check moves prompt 0 alone.
        for (float g : grads.slice(1, m.cfg.n_layers).to_vector()) CHECK(g == 0.0f);
        testing::check_direction("prompt 0", tuner.prompts().slice(0, 1), grads.slice(0, 1),
                                 [&] { return static_cast<double>(tuner.loss(ids, targets, B, T)); }, 18);
      }
    }
}

TEST_CASE("a frozen head's backward gives the input gradient of the full backward and forms no parameter gradient") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    testing::tuning_model m(arch);
    const checkpoint ck = checkpoint::open(m.dir.path());
    head full = head::load(ck, m.cfg, cpu_backend()), frozen = head::load(ck, m.cfg, cpu_backend());
    const std::int64_t N = 6;
    const Tensor x = testing::random_tensor({N, m.cfg.hidden_size}, 21);
    const auto t = testing::tuning_ids(static_cast<std::size_t>(N), m.cfg.vocab_size, 22);
    const Tensor targets = Tensor::from_i32(t, {N});
    head_activations a, b;
    Tensor dx_full = Tensor::empty({N, m.cfg.hidden_size}), dx_frozen = Tensor::empty({N, m.cfg.hidden_size});
    const float l_full = full.loss(x, targets, &dx_full, 1.0f, a);
    const float l_frozen = frozen.loss(x, targets, &dx_frozen, 1.0f, b, /*param_grads=*/false);
    CHECK(l_frozen == l_full);
    CHECK(testing::max_rel_diff(dx_frozen, dx_full) < 1e-6);
    CHECK(full.has_grads());
    CHECK_FALSE(frozen.has_grads());
  }
}

TEST_CASE("prompt tuning lowers the loss on what it trains on, the shallow kind leaves later prompts at zero") {
  testing::tuning_model m(architecture::llama);
  for (bool deep : {true, false}) {
    CAPTURE(deep);
    prompt_tuning_options o;
    o.prompt_len = 4;
    o.deep = deep;
    o.optimizer.lr = 0.05f;
    prompt_tuner tuner(*m.h, *m.runner, o);
    const int B = 2, T = 8;
    const auto ids = testing::tuning_ids(B * T, m.cfg.vocab_size, 5);
    const auto targets = testing::tuning_ids(B * T, m.cfg.vocab_size, 6);
    const float before = tuner.loss(ids, targets, B, T);
    float first = 0;
    for (int s = 0; s < 30; ++s) {
      const float l = tuner.step(ids, targets, B, T);
      if (s == 0) first = l;
    }
    const float after = tuner.loss(ids, targets, B, T);
    MESSAGE(std::string(deep ? "deep" : "shallow") << ": loss " << before << " -> " << after);
    CHECK(first == doctest::Approx(before).epsilon(1e-6));  // step() reports the loss before its update
    CHECK(after < 0.9f * before);
    CHECK(tuner.steps() == 30);
    if (!deep)
      for (float p : tuner.prompts().slice(1, m.cfg.n_layers).to_vector()) CHECK(p == 0.0f);
  }
  // The prompts save as safetensors and read back.
  prompt_tuner tuner(*m.h, *m.runner, {});
  const auto file = m.dir.path() / "prompts.safetensors";
  tuner.save(file);
  const auto st = safetensors_file::open(file);
  const Tensor saved = st->view("deep_prompts");
  CHECK(saved.shape() == shape_t{m.cfg.n_layers, 16, m.cfg.hidden_size});
  CHECK(saved.to_vector() == tuner.prompts().to_vector());
}

TEST_CASE("bad prompt-tuning batches are clear errors") {
  testing::tuning_model m(architecture::llama);
  prompt_tuning_options o;
  o.prompt_len = 0;
  CHECK_THROWS_WITH_AS(prompt_tuner(*m.h, *m.runner, o), doctest::Contains("prompt length 0"), model_error);
  o.prompt_len = 4;
  prompt_tuner tuner(*m.h, *m.runner, o);
  const auto ids = testing::tuning_ids(10, m.cfg.vocab_size, 1);
  CHECK_THROWS_WITH_AS(tuner.step(ids, ids, 2, 4), doctest::Contains("needs 8 ids"), model_error);
  const auto long_ids = testing::tuning_ids(30, m.cfg.vocab_size, 1);
  CHECK_THROWS_WITH_AS(tuner.step(long_ids, long_ids, 1, 30), doctest::Contains("beyond the model's context"),
                       model_error);
  auto bad = testing::tuning_ids(8, m.cfg.vocab_size, 1);
  bad[3] = m.cfg.vocab_size;  // outside the embedding table
  CHECK_THROWS(tuner.step(bad, bad, 2, 4));
  CHECK(tuner.steps() == 0);
}

TEST_CASE("a deep-prompts file holding NaN or inf is refused at load, naming the file and the element") {
  testing::tuning_model m(architecture::llama);
  const auto file = m.dir.path() / "bad-prompts.safetensors";
  Tensor prompts = testing::random_tensor({m.cfg.n_layers, 2, m.cfg.hidden_size}, 3, 0.5f);
  write_safetensors(file, {{"deep_prompts", prompts}});
  CHECK(load_deep_prompts(file, m.cfg).to_vector() == prompts.to_vector());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    prompts.data<float>()[5] = bad;
    write_safetensors(file, {{"deep_prompts", prompts}});
    const std::string named = file.string() + ": deep_prompts holds a non-finite value";
    CHECK_THROWS_WITH_AS(load_deep_prompts(file, m.cfg), doctest::Contains(named.c_str()), model_error);
    CHECK_THROWS_WITH_AS(load_deep_prompts(file, m.cfg), doctest::Contains("at element 5)"), model_error);
  }
}

TEST_CASE("generation after deep prompts equals greedy decoding by full forwards through the prompt-tuning path") {
  for (architecture arch : {architecture::llama, architecture::gpt2}) {
    CAPTURE(static_cast<int>(arch));
    testing::tuning_model m(arch);
    constexpr std::int64_t P = 4;
    const std::int64_t D = m.cfg.hidden_size;
    const Tensor prompts = testing::random_tensor({m.cfg.n_layers, P, D}, 7, 0.5f);
    const std::vector<std::int32_t> prompt = testing::tuning_ids(5, m.cfg.vocab_size, 3);
    constexpr int new_tokens = 8;

    // Reference: the whole sequence (P prefix rows, then the tokens at
    // positions P..) through the span engine's forward with the prompts,
    // as prompt tuning runs it, and the head on the last row, per token.
    auto last_logits = [&](const std::vector<std::int32_t>& ids, const Tensor& deep) {
      const auto T = static_cast<std::int64_t>(ids.size()), S = P + T;
      Tensor x = Tensor::zeros({S, D});
      std::vector<std::int32_t> pos(static_cast<std::size_t>(T));
      for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(P + t);
      Tensor rows = x.slice(P, S);
      m.h->embed(Tensor::from_i32(ids, {T}), Tensor::from_i32(pos, {T}), rows);
      auto out = m.blocks->forward(x, 1, static_cast<int>(S), deep);
      REQUIRE(out);
      Tensor logits = Tensor::empty({1, m.cfg.vocab_size});
      m.h->logits(out.value().slice(S - 1, S), logits, nullptr);
      return logits.to_vector();
    };
    std::vector<std::int32_t> seq = prompt, expected;
    for (int k = 0; k < new_tokens; ++k) {
      const auto v = last_logits(seq, prompts);
      const auto best = static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
      expected.push_back(best);
      seq.push_back(best);
    }

    transformer model = transformer::load(m.dir.path(), cpu_backend());
    generator gen(model);
    gen.set_deep_prompts(prompts);
    CHECK(gen.prefix_length() == P);
    generation_params p;
    p.max_new_tokens = new_tokens;
    p.ignore_eos = true;
    CHECK(gen.generate(prompt, p).tokens == expected);
    // The prompts matter: the first step's logits move with them (greedy
    // tokens of a tiny random model may not).
    CHECK(testing::max_abs_diff(last_logits(prompt, prompts), last_logits(prompt, Tensor::zeros(prompts.shape()))) > 1e-3);
    // Removing them is plain generation again.
    gen.set_deep_prompts(Tensor());
    CHECK(gen.prefix_length() == 0);
    CHECK(gen.generate(prompt, p).tokens == generator(model).generate(prompt, p).tokens);
    // The context left for tokens shrinks by P.
    gen.set_deep_prompts(prompts);
    const std::vector<std::int32_t> full(static_cast<std::size_t>(m.cfg.max_positions - P + 1), 1);
    CHECK_THROWS_WITH_AS(gen.generate(full, p), doctest::Contains("exceeds the model context"), model_error);
    CHECK_THROWS_WITH_AS(gen.set_deep_prompts(Tensor::zeros({m.cfg.n_layers + 1, P, D})),
                         doctest::Contains("deep prompts must be f32"), model_error);
  }
}

TEST_CASE("a tuner's saved state goes on as if it had never stopped, and another tuner's is refused unchanged") {
  testing::tuning_model m(architecture::llama);
  lora_config c;
  c.rank = 2;
  c.targets = {"all-linear"};
  prompt_tuning_options o;
  o.prompt_len = 2;
  o.optimizer.lr = 0.03f;
  const int B = 2, T = 5, steps = 6;
  const auto ids = testing::tuning_ids(B * T, m.cfg.vocab_size, 3), targets = testing::tuning_ids(B * T, m.cfg.vocab_size, 4);
  // The uninterrupted run.
  lora_adapter a = lora_adapter::init(m.cfg, c, 1, cpu_backend());
  prompt_tuner straight(*m.h, *m.runner, o, &a);
  std::vector<float> want;
  for (int s = 0; s < steps; ++s) want.push_back(straight.step(ids, targets, B, T));
  // Three steps, the state saved; a fresh tuner (another adapter draw,
  // other prompts) restores it and takes the other three.
  const auto file = m.dir.path() / "state.safetensors";
  {
    lora_adapter first = lora_adapter::init(m.cfg, c, 1, cpu_backend());
    prompt_tuner t(*m.h, *m.runner, o, &first);
    for (int s = 0; s < 3; ++s) CHECK(t.step(ids, targets, B, T) == want[static_cast<std::size_t>(s)]);
    t.save_state(file, {{"mine", "yes"}});
  }
  lora_adapter second = lora_adapter::init(m.cfg, c, 99, cpu_backend());
  prompt_tuning_options other_seed = o;
  other_seed.seed = 5;
  prompt_tuner resumed(*m.h, *m.runner, other_seed, &second);
  const auto meta = resumed.load_state(file);
  CHECK(meta.at("mine") == "yes");
  CHECK(resumed.steps() == 3);
  for (int s = 3; s < steps; ++s) CHECK(resumed.step(ids, targets, B, T) == want[static_cast<std::size_t>(s)]);
  CHECK(testing::max_rel_diff(resumed.prompts(), straight.prompts()) == 0);
  for (int i = 0; i < m.cfg.n_layers; ++i) CHECK(testing::max_rel_diff(second.block(i).flat(), a.block(i).flat()) == 0);

  // Another prompt length, or no adapter: refused, nothing changed.
  prompt_tuning_options longer = o;
  longer.prompt_len = 3;
  lora_adapter third = lora_adapter::init(m.cfg, c, 1, cpu_backend());
  prompt_tuner other(*m.h, *m.runner, longer, &third);
  const Tensor other_before = other.prompts().clone(), third_before = third.block(0).flat().clone();
  CHECK_THROWS_WITH_AS(other.load_state(file), doctest::Contains("'prompts' is f32 [3, 2, 16], this run's is f32 [3, 3, 16]"),
                       model_error);
  CHECK(testing::max_rel_diff(other.prompts(), other_before) == 0);
  CHECK(testing::max_rel_diff(third.block(0).flat(), third_before) == 0);
  CHECK(other.steps() == 0);
  prompt_tuner prompts_only(*m.h, *m.runner, o);
  const Tensor only_before = prompts_only.prompts().clone();
  CHECK_THROWS_WITH_AS(prompts_only.load_state(file), doctest::Contains("written by a tuner of other things"), model_error);
  CHECK(testing::max_rel_diff(prompts_only.prompts(), only_before) == 0);  // its prompts match the file's names
  CHECK(prompts_only.steps() == 0);

  // A state that diverged says so, and a file holding one is refused.
  CHECK(resumed.state_is_finite());
  resumed.prompts().data<float>()[5] = NAN;
  CHECK_FALSE(resumed.state_is_finite());
  const auto bad = m.dir.path() / "nan.safetensors";
  resumed.save_state(bad, {});
  prompt_tuner again(*m.h, *m.runner, o, &third);
  CHECK_THROWS_WITH_AS(again.load_state(bad), doctest::Contains("'prompts' holds a value that is not finite"),
                       model_error);
}

}  // namespace corolla
