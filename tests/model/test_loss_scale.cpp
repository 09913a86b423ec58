// Dynamic loss scaling (model/loss_scale.hpp) on the cpu: the scaler's
// rule, the optimiser's unscaling step, and a trainer whose f32 run is
// unchanged by a scale that never overflows. The f16 runs that need it are
// in tests/emulated_device/test_emulated_loss_scale.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"
#include "model/loss_scale.hpp"
#include "model/optimizer.hpp"
#include "model/params.hpp"
#include "model/token_data.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/tiny_model.hpp"

namespace {

using namespace corolla;

loss_scaling dynamic_scaling(float init, int interval) {
  loss_scaling s;
  s.dynamic = true;
  s.init_scale = init;
  s.growth_interval = interval;
  return s;
}

param_set layout() { return param_set({{"q.weight", {6, 5}}, {"q.bias", {6}}, {"norm.weight", {5}}}); }

void fill_random(param_set& ps, std::mt19937& rng, float std_dev) {
  std::normal_distribution<float> nd(0.0f, std_dev);
  float* base = ps.flat().data<float>();
  for (const auto& e : ps.entries())
    for (std::int64_t i = 0; i < e.numel; ++i) base[e.offset + i] = nd(rng);
}

}  // namespace

TEST_CASE("the loss scaler halves on overflow, doubles after its interval of finite steps, and stops at its floor") {
  loss_scaler s(dynamic_scaling(1024.0f, 3));
  CHECK(s.dynamic());
  CHECK(s.scale() == 1024.0f);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024.0f);
  s.update(false);  // third finite step in a row
  CHECK(s.scale() == 2048.0f);
  CHECK(s.state().good_steps == 0);
  s.update(false);
  s.update(true);  // an overflow resets the run of finite steps
  CHECK(s.scale() == 1024.0f);
  CHECK(s.state().good_steps == 0);
  CHECK(s.state().skipped == 1);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024.0f);

  loss_scaling tight = dynamic_scaling(4.0f, 10);
  tight.min_scale = 2.0f;
  loss_scaler floor(tight);
  floor.update(true);
  CHECK(floor.scale() == 2.0f);
  try {
    floor.update(true);
    FAIL("no error below the floor");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("gradients are not finite even at loss scale 2") != std::string::npos);
  }

  loss_scaler off;
  CHECK_FALSE(off.dynamic());
  CHECK(off.scale() == 1.0f);
  off.update(true);  // nothing to do without scaling
  CHECK(off.scale() == 1.0f);
  CHECK(off.state().skipped == 0);
}

TEST_CASE("the loss scaler refuses bad settings and states, and --loss-scale parses three words") {
  CHECK_THROWS_AS(loss_scaler(dynamic_scaling(1000.0f, 10)), std::invalid_argument);  // not a power of two
  CHECK_THROWS_AS(loss_scaler(dynamic_scaling(-2.0f, 10)), std::invalid_argument);
  CHECK_THROWS_AS(loss_scaler(dynamic_scaling(1024.0f, 0)), std::invalid_argument);
  loss_scaler s(dynamic_scaling(1024.0f, 10));
  CHECK_THROWS_AS(s.set_state({3.0, 0, 0}), std::invalid_argument);
  CHECK_THROWS_AS(s.set_state({8.0, -1, 0}), std::invalid_argument);
  s.set_state({8.0, 4, 7});
  CHECK(s.state() == loss_scale_state{8.0, 4, 7});
  loss_scaler off;  // takes only the skipped count: a run resumed without scaling
  off.set_state({8.0, 2, 3});
  CHECK(off.state() == loss_scale_state{1.0, 0, 3});
  CHECK_THROWS_AS(off.set_state({1.0, 0, -1}), std::invalid_argument);

  CHECK(parse_loss_scaling("auto", true).dynamic);
  CHECK_FALSE(parse_loss_scaling("auto", false).dynamic);
  CHECK(parse_loss_scaling("dynamic", false).dynamic);
  CHECK_FALSE(parse_loss_scaling("off", true).dynamic);
  CHECK_THROWS_WITH_AS(parse_loss_scaling("65536", true), "--loss-scale must be auto, dynamic or off, got '65536'",
                       std::invalid_argument);
  CHECK(std::string(loss_scaling_name(parse_loss_scaling("dynamic", false))) == "dynamic");
}

TEST_CASE("an unscaling optimiser step on scaled gradients equals a plain step, clipped or not") {
  for (const float clip : {0.0f, 0.5f}) {
    CAPTURE(clip);
    std::mt19937 rng(5);
    param_set p1 = layout();
    fill_random(p1, rng, 1.0f);
    param_set g1 = p1.like(), p2 = p1.like(), g2 = p1.like();
    p2.flat().copy_from(p1.flat());
    optimizer_settings s;
    s.adamw.lr = 1e-2f;
    s.adamw.weight_decay = 0.1f;
    s.max_grad_norm = clip;
    adamw_optimizer plain({{&p1, &g1}}, s, cpu_backend());
    adamw_optimizer scaled({{&p2, &g2}}, s, cpu_backend());
    constexpr float scale = 4096.0f;
    for (int t = 0; t < 3; ++t) {
      fill_random(g1, rng, 0.4f);
      g2.flat().copy_from(g1.flat());
      cpu_backend().scale(g2.flat(), scale);  // exact: a power of two
      const double want = plain.step();
      const double got = scaled.step_unscaling(scale);
      if (clip > 0.0f) CHECK(got == want);
      CHECK(got > 0.0);
      CHECK(p2.flat().to_vector() == p1.flat().to_vector());
      CHECK(scaled.steps() == plain.steps());
    }
  }
}

TEST_CASE("an unscaling step on overflowed gradients changes nothing and says so") {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    std::mt19937 rng(9);
    param_set p = layout();
    fill_random(p, rng, 1.0f);
    param_set g = p.like();
    adamw_optimizer opt({{&p, &g}}, optimizer_settings{}, cpu_backend());
    fill_random(g, rng, 0.4f);
    opt.step_unscaling(8.0f);
    const auto params = p.flat().to_vector(), m = opt.m(0).flat().to_vector(), v = opt.v(0).flat().to_vector();
    fill_random(g, rng, 0.4f);
    g.flat().data<float>()[7] = bad;
    const double norm = opt.step_unscaling(8.0f);
    CHECK(overflowed(norm));
    CHECK(opt.steps() == 1);
    CHECK(p.flat().to_vector() == params);
    CHECK(opt.m(0).flat().to_vector() == m);
    CHECK(opt.v(0).flat().to_vector() == v);
  }
  CHECK(grad_coefficient(10.0, 4.0f, 0.0f) == 0.25);
  CHECK(grad_coefficient(10.0, 4.0f, 1.0f) == doctest::Approx(0.25 / (2.5 + 1e-6)));
  CHECK(grad_coefficient(2.0, 4.0f, 1.0f) == 0.25);  // unscaled norm 0.5: no clipping
}

TEST_CASE("training in f32 with a loss scale that never overflows equals training without one, bit for bit") {
  testing::temp_dir_guard dir("loss-scale-f32");
  testing::write_tiny_model(dir.path(), testing::tiny_options_for(architecture::llama, 64));
  for (const float clip : {0.0f, 1.0f}) {
    CAPTURE(clip);
    train_options o;
    o.batch = 2;
    o.seq = 12;
    o.steps = 5;
    o.optimizer.adamw.lr = 5e-3f;
    o.optimizer.max_grad_norm = clip;
    transformer plain_model = transformer::load(dir.path(), cpu_backend());
    const int vocab = plain_model.config().vocab_size;
    const auto tokens = testing::some_ids(300, vocab, 3);
    token_dataset d1 = token_dataset::from_tokens(tokens, vocab);
    const train_summary plain = trainer(plain_model, d1, o).run();

    o.optimizer.loss_scale = dynamic_scaling(65536.0f, 2);  // grows to 2^18 within the run
    transformer scaled_model = transformer::load(dir.path(), cpu_backend());
    token_dataset d2 = token_dataset::from_tokens(tokens, vocab);
    trainer t(scaled_model, d2, o);
    std::vector<float> losses;
    std::vector<float> scales;
    while (t.steps_done() < o.steps) {
      const step_report r = t.step();
      CHECK_FALSE(r.skipped);
      CHECK(r.grad_norm > 0.0);
      losses.push_back(r.loss);
      scales.push_back(r.loss_scale);
    }
    CHECK(losses == plain.losses);
    CHECK(scales == std::vector<float>{65536.0f, 65536.0f, 131072.0f, 131072.0f, 262144.0f});
    CHECK(t.scaler().scale() == 262144.0f);
    for (std::size_t g = 0; g < plain_model.groups().size(); ++g)
      CHECK(scaled_model.groups()[g].params->flat().to_vector() == plain_model.groups()[g].params->flat().to_vector());
  }
}
