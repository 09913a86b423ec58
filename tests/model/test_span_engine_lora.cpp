// tests/model/test_span_engine_lora.cpp — a server's per-session LoRA
// adapters (span_engine::add_adapter, model/lora_factors.hpp): a session
// with an adapter computes what the adapter merged into the weights
// computes, beside sessions of the base model in the same decode batch, with
// f32 and with quantised weights; stateless forward and backward with an
// adapter equal the merged model's; what cannot mix does not.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/lora.hpp"
#include "model/span_engine.hpp"
#include "tests/model/span_engine_test_util.hpp"
#include "tests/support/numeric_checks.hpp"

using namespace corolla;
using corolla::testing::code_of;
using corolla::testing::error_of;
using corolla::testing::gpt2_opts;
using corolla::testing::llama_opts;
using corolla::testing::max_rel_diff;
using corolla::testing::model_dir;
using corolla::testing::random_tensor;

namespace {

/// An adapter of every linear module with B drawn N(0, 0.2): its terms move
/// the outputs well past rounding.
std::shared_ptr<lora_adapter> random_adapter(const model_config& cfg, std::uint64_t seed) {
  lora_config c;
  c.rank = 4;
  c.alpha = 8.0f;
  c.targets = {"all-linear"};
  auto a = std::make_shared<lora_adapter>(lora_adapter::init(cfg, c, seed, cpu_backend()));
  for (int l = 0; l < a->n_layers(); ++l)
    for (const lora_module& m : a->modules()) {
      Tensor B = a->block(l).get(m.path + ".lora_B");
      B.copy_from(random_tensor(B.shape(), seed++, 0.2f));
    }
  return a;
}

/// An engine over [first, last) whose weights have `a` merged as they load.
span_engine merged_engine(model_dir& m, const std::shared_ptr<lora_adapter>& a, int first, int last,
                          const span_engine_options& opts = {}) {
  checkpoint ck = checkpoint::open(m.dir.path());
  ck.set_patch(a);
  return span_engine::load(ck, m.cfg, first, last, cpu_backend(), 4096, opts);
}

}  // namespace

TEST_CASE("a session with an adapter computes the merged model's outputs, beside base sessions in one decode batch") {
  for (const auto& o : {llama_opts(3), gpt2_opts(3)}) {
    for (const weight_format f : {weight_format::f32, weight_format::int8}) {
      CAPTURE(o.arch == architecture::llama);
      CAPTURE(std::string(weight_format_name(f)));
      model_dir m(o);
      const std::int64_t D = m.cfg.hidden_size;
      auto a = random_adapter(m.cfg, 11), other = random_adapter(m.cfg, 99);
      span_engine_options opts;
      opts.weights = f;
      // The served span [1, 3): the adapter's blocks 1 and 2.
      span_engine e = m.engine(1, 3, 4096, opts);
      REQUIRE(e.add_adapter("a", *a));
      REQUIRE(e.add_adapter("other", *other));
      CHECK(e.adapters() == std::vector<std::string>{"a", "other"});
      // References in f32: the adapters merged, and the base model; and the
      // base model in the served format (what a session without an adapter
      // must compute).
      span_engine merged = merged_engine(m, a, 1, 3), merged_other = merged_engine(m, other, 1, 3);
      span_engine base32 = m.engine(1, 3), base = m.engine(1, 3, 4096, opts);

      REQUIRE(e.open_session("with-a", 64, -1, -1, {}, "a"));
      REQUIRE(e.open_session("with-other", 64, -1, -1, {}, "other"));
      REQUIRE(e.open_session("plain", 64));
      for (span_engine* r : {&merged, &merged_other, &base32, &base}) REQUIRE(r->open_session("s", 64));
      for (const auto& s : e.sessions()) CHECK(s.adapter == (s.id == "with-a" ? "a" : s.id == "with-other" ? "other" : ""));

      // An adapted output against the merged model's: equal up to rounding
      // in f32. With int8 weights the session quantises W and adds the
      // terms exactly, the reference merges in f32: they differ by int8's
      // noise (large in a tiny random model), which must stay a small part
      // of what the adapter changes.
      const auto check_adapted = [&](const Tensor& got, const Tensor& want, const Tensor& base_out) {
        const double err = max_rel_diff(got, want), effect = max_rel_diff(want, base_out);
        CHECK(effect > 1.0);  // the adapter changes the outputs
        if (f == weight_format::f32)
          CHECK(err < 1e-4);
        else
          CHECK(err < 0.1 * effect);
      };
      // A prefill each, then decode rounds with all three in one batch.
      const auto step = [&](const Tensor& x, std::int64_t at) {
        auto ma = merged.inference_step("s", x, at), mo = merged_other.inference_step("s", x, at);
        auto b32 = base32.inference_step("s", x, at), b = base.inference_step("s", x, at);
        REQUIRE((ma && mo && b32 && b));
        return std::vector<Tensor>{*ma, *mo, *b32, *b};
      };
      const Tensor prompt = random_tensor({7, D}, 5);
      auto pa = e.inference_step("with-a", prompt, 0), po = e.inference_step("with-other", prompt, 0),
           pp = e.inference_step("plain", prompt, 0);
      REQUIRE((pa && po && pp));
      std::vector<Tensor> ref = step(prompt, 0);
      check_adapted(*pa, ref[0], ref[2]);
      check_adapted(*po, ref[1], ref[2]);
      CHECK(max_rel_diff(*pp, ref[3]) < 1e-4);
      for (int round = 0; round < 4; ++round) {
        const Tensor x = random_tensor({1, D}, 100 + round);
        std::vector<decode_item> items(3);
        const char* ids[] = {"with-a", "plain", "with-other"};
        for (int i = 0; i < 3; ++i) items[i] = {ids[i], x, 7 + round, 0};
        auto out = e.decode_batch(items);
        REQUIRE(out.size() == 3u);
        REQUIRE((out[0] && out[1] && out[2]));
        ref = step(x, 7 + round);
        check_adapted(*out[0], ref[0], ref[2]);
        CHECK(max_rel_diff(*out[1], ref[3]) < 1e-4);
        check_adapted(*out[2], ref[1], ref[2]);
      }
      // One session alone (the single-row path) with its adapter.
      const Tensor x = random_tensor({1, D}, 500);
      auto one = e.inference_step("with-a", x, 11);
      REQUIRE(one);
      ref = step(x, 11);
      check_adapted(*one, ref[0], ref[2]);
    }
  }
}

TEST_CASE("a session with an adapter over part of the span, and after a rollback, equals the merged model") {
  model_dir m(llama_opts(3));
  const std::int64_t D = m.cfg.hidden_size;
  auto a = random_adapter(m.cfg, 21);
  span_engine e = m.engine(0, 3);
  REQUIRE(e.add_adapter("a", *a));
  span_engine merged = merged_engine(m, a, 1, 2);
  REQUIRE(e.open_session("part", 32, 1, 2, {}, "a"));
  REQUIRE(merged.open_session("s", 32));
  const Tensor x = random_tensor({5, D}, 8);
  auto got = e.inference_step("part", x, 0), want = merged.inference_step("s", x, 0);
  REQUIRE((got && want));
  CHECK(max_rel_diff(*got, *want) < 1e-4);
  // A rollback to position 2 and a new step from there.
  const Tensor y = random_tensor({3, D}, 9);
  got = e.inference_step("part", y, 2);
  want = merged.inference_step("s", y, 2);
  REQUIRE((got && want));
  CHECK(max_rel_diff(*got, *want) < 1e-4);
}

TEST_CASE("stateless forward and backward with an adapter equal the merged model's, on inference-only weights too") {
  for (const auto& o : {llama_opts(2), gpt2_opts(2)}) {
    for (const bool keep : {true, false}) {
      CAPTURE(o.arch == architecture::llama);
      CAPTURE(keep);
      model_dir m(o);
      const std::int64_t D = m.cfg.hidden_size;
      auto a = random_adapter(m.cfg, 31);
      span_engine_options opts;
      opts.weights = keep ? weight_format::f32 : weight_format::bf16;
      opts.keep_parameters = keep;
      span_engine e = m.engine(0, 2, 4096, opts);
      REQUIRE(e.add_adapter("a", *a));
      span_engine merged = merged_engine(m, a, 0, 2), base32 = m.engine(0, 2);
      const int B = 2, T = 6;
      const Tensor h = random_tensor({B * T, D}, 3), g = random_tensor({B * T, D}, 4);
      const Tensor prompts = random_tensor({2, 2, D}, 6, 0.1f);
      // f32: equal up to rounding. bf16 weights only: the request widens W
      // and adds s B A in f32, the reference merges in f32: bf16's noise,
      // a small part of what the adapter changes.
      const auto check_adapted = [&](const Tensor& got, const Tensor& want, const Tensor& base_out) {
        const double err = max_rel_diff(got, want), effect = max_rel_diff(want, base_out);
        CHECK(effect > 0.5);
        if (keep)
          CHECK(err < 1e-4);
        else
          CHECK(err < 0.1 * effect);
      };
      auto f = e.forward(h, B, T, prompts, -1, -1, nullptr, "a"), fm = merged.forward(h, B, T, prompts),
           fb = base32.forward(h, B, T, prompts), plain = e.forward(h, B, T, prompts);
      REQUIRE((f && fm && fb && plain));
      check_adapted(*f, *fm, *fb);
      auto gr = e.backward(h, g, B, T, prompts, -1, -1, "a"), gm = merged.backward(h, g, B, T, prompts),
           gb = base32.backward(h, g, B, T, prompts);
      REQUIRE((gr && gm && gb));
      check_adapted(gr->grad_input, gm->grad_input, gb->grad_input);
      check_adapted(gr->grad_prompts, gm->grad_prompts, gb->grad_prompts);
      // Nothing of the request stays behind: the base model again.
      auto again = e.forward(h, B, T, prompts);
      REQUIRE(again);
      CHECK(max_rel_diff(*again, *plain) == 0.0);
      CHECK(e.blocks().frozen_scratch_bytes() == 0);
    }
  }
}

TEST_CASE("adapters a server does not hold, or that cannot mix, are clear errors") {
  model_dir m(llama_opts(2));
  const std::int64_t D = m.cfg.hidden_size;
  auto a = random_adapter(m.cfg, 41);
  span_engine e = m.engine(0, 2);
  CHECK(code_of(e.open_session("s", 16, -1, -1, {}, "a")) == span_errc::unknown_adapter);
  CHECK(error_of(e.open_session("s", 16, -1, -1, {}, "a")).find("holds no adapter 'a' (it holds none)") !=
        std::string::npos);
  REQUIRE(e.add_adapter("a", *a));
  CHECK(code_of(e.add_adapter("a", *a)) == span_errc::invalid_argument);
  CHECK(code_of(e.add_adapter("", *a)) == span_errc::invalid_argument);
  model_dir deeper(llama_opts(3));
  auto wrong = random_adapter(deeper.cfg, 42);
  CHECK(error_of(e.add_adapter("b", *wrong)).find("another model") != std::string::npos);
  CHECK(error_of(e.open_session("s", 16, -1, -1, {}, "b")).find("(it holds a)") != std::string::npos);
  CHECK(code_of(e.forward(random_tensor({4, D}, 1), 1, 4, {}, -1, -1, nullptr, "b")) == span_errc::unknown_adapter);
  CHECK(code_of(e.backward(random_tensor({4, D}, 1), random_tensor({4, D}, 2), 1, 4, {}, -1, -1, "b")) ==
        span_errc::unknown_adapter);

  // Caches of another adapter (or none) are not shared.
  REQUIRE(e.open_session("base", 16));
  REQUIRE(e.inference_step("base", random_tensor({4, D}, 3), 0));
  REQUIRE(e.open_session("adapted", 16, -1, -1, {}, "a"));
  CHECK(error_of(e.share_prefix("adapted", "base", 4)).find("adapters") != std::string::npos);
  REQUIRE(e.open_session("adapted-too", 16, -1, -1, {}, "a"));
  REQUIRE(e.inference_step("adapted", random_tensor({4, D}, 3), 0));
  auto shared = e.share_prefix("adapted-too", "adapted", 4);
  REQUIRE(shared);
  CHECK(*shared == 4);
  // A device-resident batch takes no adapter's session.
  const batch_step step{"adapted", 4, 1};
  auto prepared = e.prepare_steps(std::span<const batch_step>(&step, 1));
  REQUIRE(prepared.size() == 1u);
  CHECK(error_of(prepared[0]).find("an adapter") != std::string::npos);
}
