// Training numerics against an independent float64 reference: a tiny GPT-2
// written by the test fixture is trained by corolla (transformer::load +
// trainer/adamw_optimizer + token_dataset over an llm.c shard) and by the
// float64 GPT-2 + AdamW in gpt2_reference.hpp on the same batches; every
// step's loss must agree within 2e-4, also when the gradients accumulate
// over micro-batches; accumulation against the whole batch at once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpt2_reference.hpp"
#include "kernels/backend.hpp"
#include "model/error.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

namespace {

using namespace corolla;
using namespace corolla::testing;

constexpr int vocab = 64;
constexpr int batch = 2;
constexpr int seq = 8;
constexpr int steps = 20;
// Large enough that decoupled weight decay moves the losses by several times
// the 2e-4 tolerance (checked below), so the comparison can see it.
constexpr double lr = 2e-3;
constexpr double weight_decay = 0.2;

tiny_model_options tiny_gpt2() {
  tiny_model_options o;
  o.arch = architecture::gpt2;
  o.vocab = vocab;
  o.hidden = 32;
  o.layers = 2;
  o.heads = 4;
  o.intermediate = 48;
  o.max_positions = 32;
  o.init_std = 0.05f;
  o.seed = 7;
  return o;
}

// 300 tokens: 18 batches of 2 x 8 fit, so the 20 steps also cross the
// wrap-around to the start of the data.
std::vector<std::uint16_t> random_tokens(std::size_t n, int v, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> t(n);
  for (auto& x : t) x = static_cast<std::uint16_t>(rng() % static_cast<std::uint32_t>(v));
  return t;
}

std::vector<std::int32_t> window(const std::vector<std::uint16_t>& t, std::size_t begin,
                                 std::size_t n) {
  return {t.begin() + static_cast<std::ptrdiff_t>(begin),
          t.begin() + static_cast<std::ptrdiff_t>(begin + n)};
}

ref::gpt2_model load_reference(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  const nlohmann::json cfg = nlohmann::json::parse(in);
  return ref::from_hf(read_all_f32(dir), cfg.at("n_head").get<int>(),
                      cfg.value("layer_norm_epsilon", 1e-5));
}

// The reference's per-step losses on the sequential batches.
std::vector<double> reference_losses(ref::gpt2_model m, const std::vector<std::int32_t>& tokens,
                                     double wd) {
  ref::adamw opt;
  opt.lr = lr;
  opt.weight_decay = wd;
  ref::batcher batches{&tokens};
  std::vector<std::int32_t> ids, targets;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    batches.next(batch, seq, ids, targets);
    ref::gpt2_model grads = m.zeros_like();
    losses.push_back(ref::forward_backward(m, ids, targets, batch, seq, grads));
    opt.step(m, grads);
  }
  return losses;
}

}  // namespace

TEST_CASE("GPT-2 training losses over 20 steps equal a float64 AdamW reference within 2e-4") {
  temp_dir_guard tmp("train-ref");
  const auto model_dir = tmp / "gpt2";
  write_tiny_model(model_dir, tiny_gpt2());
  const auto tokens16 = random_tokens(300, vocab, 11);
  write_llmc_shard(tmp / "data.bin", tokens16);
  const std::vector<std::int32_t> tokens(tokens16.begin(), tokens16.end());

  // The data layer must hand out exactly the batches the reference takes.
  {
    token_dataset data = token_dataset::open(tmp / "data.bin", nullptr, vocab);
    REQUIRE(data.size() == static_cast<std::int64_t>(tokens.size()));
    ref::batcher expected{&tokens};
    std::vector<std::int32_t> ids, targets, want_ids, want_targets;
    for (int s = 0; s < steps; ++s) {
      data.next_batch(batch, seq, ids, targets);
      expected.next(batch, seq, want_ids, want_targets);
      INFO("batch " << s);
      REQUIRE(ids == want_ids);
      REQUIRE(targets == want_targets);
    }
  }

  const ref::gpt2_model reference = load_reference(model_dir);
  const std::vector<double> want = reference_losses(reference, tokens, weight_decay);
  // The comparison can only catch what moves the losses by more than the
  // tolerance: weight decay alone does (by ~1e-3 at step 20 here).
  const std::vector<double> without_decay = reference_losses(reference, tokens, 0.0);
  const double decay_effect = std::abs(without_decay.back() - want.back());
  MESSAGE("weight decay moves the step-20 reference loss by " << decay_effect);
  CHECK(decay_effect > 4e-4);

  Backend& be = cpu_backend();
  transformer model = transformer::load(model_dir, be);
  token_dataset data = token_dataset::open(tmp / "data.bin", nullptr, vocab);
  train_options opts;
  opts.batch = batch;
  opts.seq = seq;
  opts.steps = steps;
  opts.optimizer.adamw.lr = static_cast<float>(lr);
  opts.optimizer.adamw.weight_decay = static_cast<float>(weight_decay);
  trainer train(model, data, opts);
  std::vector<int> logged;
  const train_summary got = train.run([&](const step_report& r) { logged.push_back(r.step); });

  REQUIRE(got.losses.size() == static_cast<std::size_t>(steps));
  CHECK(logged.size() == static_cast<std::size_t>(steps));
  CHECK(logged.front() == 1);
  CHECK(logged.back() == steps);
  CHECK(got.tokens == static_cast<std::int64_t>(steps) * batch * seq);
  CHECK(got.tokens_per_second > 0.0);
  // Step 1 is the untouched initial model: a pure forward comparison.
  CHECK(std::abs(got.losses[0] - want[0]) < 1e-5);
  double worst = 0.0;
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s + 1 << ": corolla " << got.losses[s] << ", reference " << want[s]);
    CHECK(std::abs(got.losses[s] - want[s]) < 2e-4);
    worst = std::max(worst, std::abs(got.losses[s] - want[s]));
  }
  MESSAGE("largest per-step loss difference to the float64 reference: " << worst);
  // Training must have moved the model (losses are not all the same).
  CHECK(want.back() < want.front() - 0.05);

  // The same run accumulating gradients one sequence at a time.
  transformer accumulated = transformer::load(model_dir, be);
  token_dataset data1 = token_dataset::open(tmp / "data.bin", nullptr, vocab);
  opts.micro_batch = 1;
  const train_summary acc = trainer(accumulated, data1, opts).run();
  REQUIRE(acc.losses.size() == static_cast<std::size_t>(steps));
  CHECK(acc.tokens == got.tokens);
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s + 1 << ": micro-batches of 1 " << acc.losses[s] << ", reference " << want[s]);
    CHECK(std::abs(acc.losses[s] - want[s]) < 2e-4);
  }
}

TEST_CASE("training a Llama model on a repeated pattern drives the loss down") {
  temp_dir_guard tmp("train-llama");
  tiny_model_options o;  // 2-layer GQA Llama
  o.init_std = 0.1f;
  write_tiny_model(tmp / "llama", o);
  std::vector<std::uint16_t> tokens;
  for (int i = 0; i < 64; ++i)
    for (std::uint16_t t : {3, 17, 5, 42, 9, 23, 31, 8}) tokens.push_back(t);
  write_raw_u16(tmp / "pattern.bin", tokens);

  transformer model = transformer::load(tmp / "llama", cpu_backend());
  token_dataset data = token_dataset::open(tmp / "pattern.bin", nullptr, o.vocab);
  train_options opts;
  opts.batch = 4;
  opts.seq = 16;
  opts.steps = 40;
  opts.optimizer.adamw.lr = 1e-2f;
  opts.log_every = 10;
  trainer train(model, data, opts);
  std::vector<int> logged;
  const train_summary s = train.run([&](const step_report& r) { logged.push_back(r.step); });
  CHECK(logged == std::vector<int>{1, 10, 20, 30, 40});
  REQUIRE(s.losses.size() == 40u);
  for (float l : s.losses) REQUIRE(std::isfinite(l));
  MESSAGE("llama pattern loss: step 1 " << s.losses.front() << ", step 40 " << s.losses.back());
  CHECK(s.losses.back() < 0.25f * s.losses.front());
  // After training, the model predicts the pattern's next token.
  CHECK(model.forward_loss(window(tokens, 0, 16), window(tokens, 1, 16), 1, 16) < 0.5f);
}

TEST_CASE("gradient accumulation over micro-batches trains as the whole batch at once, clipped and loss-scaled") {
  temp_dir_guard tmp("train-micro");
  tiny_model_options o;  // 2-layer GQA Llama
  o.init_std = 0.1f;
  write_tiny_model(tmp / "llama", o);
  write_llmc_shard(tmp / "data.bin", random_tokens(600, o.vocab, 5));
  const auto flat_params = [](transformer& model) {
    std::vector<float> params;
    for (const param_group& g : model.groups()) {
      const std::vector<float> v = g.params->flat().to_vector();
      params.insert(params.end(), v.begin(), v.end());
    }
    return params;
  };
  struct run {
    std::vector<float> losses;
    std::vector<double> grad_norms;  // of the accumulated gradients, before clipping
    std::vector<float> params;       // after the last step
  };
  const auto train_with = [&](int micro_batch, bool scaled) {
    transformer model = transformer::load(tmp / "llama", cpu_backend());
    token_dataset data = token_dataset::open(tmp / "data.bin", nullptr, o.vocab);
    train_options opts;
    opts.batch = 4;
    opts.micro_batch = micro_batch;
    opts.seq = 12;
    opts.steps = 6;
    opts.optimizer.adamw.lr = 3e-3f;
    opts.optimizer.max_grad_norm = 0.5f;
    if (scaled) opts.optimizer.loss_scale = loss_scaling{.dynamic = true, .init_scale = 1024.0f};
    trainer t(model, data, opts);
    run r;
    for (int i = 0; i < opts.steps; ++i) {
      const step_report s = t.step();
      REQUIRE_FALSE(s.skipped);
      r.losses.push_back(s.loss);
      r.grad_norms.push_back(s.grad_norm);
    }
    r.params = flat_params(model);
    return r;
  };
  const run whole = train_with(0, false);
  const std::vector<float> start = [&] {
    transformer initial = transformer::load(tmp / "llama", cpu_backend());
    return flat_params(initial);
  }();
  float moved = 0.0f;
  for (std::size_t i = 0; i < start.size(); ++i) moved = std::max(moved, std::abs(start[i] - whole.params[i]));
  MESSAGE("largest parameter change over 6 steps: " << moved);
  CHECK(moved > 1e-2f);
  for (const auto& [micro, scaled] : {std::pair{2, false}, std::pair{1, false}, std::pair{2, true}}) {
    const std::string what = "micro-batches of " + std::to_string(micro) + (scaled ? ", loss-scaled" : "");
    CAPTURE(what);
    const run r = train_with(micro, scaled);
    REQUIRE(r.losses.size() == whole.losses.size());
    for (std::size_t i = 0; i < r.losses.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(std::abs(r.losses[i] - whole.losses[i]) < 2e-5);
      // Adam hardly sees a gradient's scale; the norm does (each
      // micro-batch's share is 1/k of the batch mean's gradient).
      CHECK(r.grad_norms[i] == doctest::Approx(whole.grad_norms[i]).epsilon(1e-4));
    }
    REQUIRE(r.params.size() == whole.params.size());
    float worst = 0.0f;
    for (std::size_t i = 0; i < r.params.size(); ++i) worst = std::max(worst, std::abs(r.params[i] - whole.params[i]));
    MESSAGE(what << ": largest parameter difference " << worst << " after 6 steps");
    CHECK(worst < 0.02f * moved);
  }
}

TEST_CASE("trainer rejects a zero batch, an uneven micro-batch, a sequence beyond the context, too little data and ids outside the vocabulary") {
  temp_dir_guard tmp("train-bad");
  tiny_model_options o = tiny_gpt2();
  write_tiny_model(tmp / "gpt2", o);
  write_llmc_shard(tmp / "data.bin", random_tokens(100, vocab, 3));
  transformer model = transformer::load(tmp / "gpt2", cpu_backend());
  token_dataset data = token_dataset::open(tmp / "data.bin", nullptr, vocab);
  auto options = [](int b, int t) {
    train_options opts;
    opts.batch = b;
    opts.seq = t;
    opts.steps = 1;
    return opts;
  };
  CHECK_THROWS_WITH_AS(trainer(model, data, options(0, 8)), doctest::Contains("batch size"),
                       model_error);
  CHECK_THROWS_WITH_AS(trainer(model, data, options(1, o.max_positions + 1)),
                       doctest::Contains("longer than the model's context of 32"), model_error);
  CHECK_THROWS_WITH_AS(trainer(model, data, options(4, 32)), doctest::Contains("100 tokens"),
                       model_error);
  CHECK_NOTHROW(trainer(model, data, options(3, 32)));  // 97 tokens: fits
  train_options uneven = options(3, 8);
  uneven.micro_batch = 2;
  CHECK_THROWS_WITH_AS(trainer(model, data, uneven),
                       doctest::Contains("a micro-batch of 2 sequences does not divide the batch of 3"), model_error);
  uneven.micro_batch = -1;
  CHECK_THROWS_WITH_AS(trainer(model, data, uneven), doctest::Contains("must not be negative"), model_error);
  uneven.micro_batch = 3;
  CHECK_NOTHROW(trainer(model, data, uneven));
  token_dataset unchecked = token_dataset::from_tokens({1, 2, 3, vocab, 4, 5, 6, 7, 8, 9}, 0);
  CHECK_THROWS_WITH_AS(trainer(model, unchecked, options(1, 4)),
                       doctest::Contains("token id 64 at position 3"), model_error);
}
