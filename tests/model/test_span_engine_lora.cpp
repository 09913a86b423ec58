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
#include "tests/support/random_lora.hpp"

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
  return std::make_shared<lora_adapter>(testing::random_lora(cfg, seed));
}

/// An engine over [first, last) whose weights have `a` merged as they load.
span_engine merged_engine(model_dir& m, const std::shared_ptr<lora_adapter>& a, int first, int last,
                          const span_engine_options& opts = {}) {
  checkpoint ck = checkpoint::open(m.dir.path());
  ck.set_patch(a);
  return span_engine::load(ck, m.cfg, first, last, cpu_backend(), 4096, opts);
}

/// An f32 engine over [first, last) computing what a server of weights `f`
/// computes with `a` (null: none): its linear weights are the base's stored
/// as `f` and widened back, with `a` merged into them. A session of such a
/// server with the adapter must equal it up to rounding.
span_engine served_reference(model_dir& m, weight_format f, const lora_adapter* a, int first, int last) {
  if (f == weight_format::f32) {
    checkpoint ck = checkpoint::open(m.dir.path());
    if (a) ck.set_patch(std::make_shared<lora_adapter>(*a));
    return span_engine::load(ck, m.cfg, first, last, cpu_backend(), 4096);
  }
  span_engine_options lean;
  lean.weights = f;
  lean.keep_parameters = false;
  span_engine served = m.engine(first, last, 64, lean);
  stage s = stage::load(m.ck, m.cfg, first, last, cpu_backend());
  for (int i = 0; i < last - first; ++i) {
    const block_tensors wide = served.blocks().frozen_weights(i);
    block_tensors p = block_tensors::of(m.cfg, s.params()[static_cast<std::size_t>(i)]);
    for (Tensor block_tensors::*role : {&block_tensors::q_w, &block_tensors::k_w, &block_tensors::v_w,
                                        &block_tensors::o_w, &block_tensors::gate_w, &block_tensors::up_w,
                                        &block_tensors::down_w})
      if ((p.*role).defined()) (p.*role).copy_from(wide.*role);
    if (a) a->merge(cpu_backend(), first + i, s.params()[static_cast<std::size_t>(i)]);
  }
  return span_engine(std::move(s), 4096);
}

testing::tiny_model_options family(const std::string& name, int layers) {
  testing::tiny_model_options o = llama_opts(layers);
  o.family = name;
  return o;
}

}  // namespace

TEST_CASE("a session with an adapter computes the merged model's outputs, beside base sessions in one decode batch") {
  // Llama (GQA), GPT-2 (c_attn's q, k, v share A), Qwen3 (q and k normed
  // per head after the adapted products), Mixtral (attention adapted, the
  // experts not).
  for (const auto& o : {llama_opts(3), gpt2_opts(3), family("Qwen3ForCausalLM", 3), family("MixtralForCausalLM", 3)}) {
    for (const weight_format f : {weight_format::f32, weight_format::int8, weight_format::bf16}) {
      CAPTURE(o.family);
      CAPTURE(o.arch == architecture::gpt2);
      CAPTURE(std::string(weight_format_name(f)));
      // (The reference widens the dense weights only: a mixture's experts
      // in f32.)
      if (o.family == "MixtralForCausalLM" && f != weight_format::f32) continue;
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
      CHECK(e.adapter_digests() == std::vector<std::string>{a->digest(), other->digest()});
      CHECK(a->digest() != other->digest());
      CHECK(a->digest() == lora_adapter(*a).digest());
      CHECK(a->digest().size() == 16u);
      // What the served weights compute with each adapter merged, and
      // without one; the base in f32 tells that the adapter changes things.
      span_engine ref_a = served_reference(m, f, a.get(), 1, 3), ref_other = served_reference(m, f, other.get(), 1, 3);
      span_engine ref_base = served_reference(m, f, nullptr, 1, 3), base32 = m.engine(1, 3);

      REQUIRE(e.open_session("with-a", 64, -1, -1, {}, "a"));
      REQUIRE(e.open_session("with-other", 64, -1, -1, {}, "other"));
      REQUIRE(e.open_session("plain", 64));
      for (span_engine* r : {&ref_a, &ref_other, &ref_base, &base32}) REQUIRE(r->open_session("s", 64));
      for (const auto& s : e.sessions()) CHECK(s.adapter == (s.id == "with-a" ? "a" : s.id == "with-other" ? "other" : ""));
      const auto ref_step = [](span_engine& r, const Tensor& x, std::int64_t at) {
        auto out = r.inference_step("s", x, at);
        REQUIRE(out);
        return *out;
      };

      // A prefill each, the adapter's effect seen once.
      const Tensor prompt = random_tensor({7, D}, 5);
      auto pa = e.inference_step("with-a", prompt, 0), po = e.inference_step("with-other", prompt, 0),
           pp = e.inference_step("plain", prompt, 0);
      REQUIRE((pa && po && pp));
      const Tensor want_a = ref_step(ref_a, prompt, 0);
      CHECK(max_rel_diff(*pa, want_a) < 1e-4);
      CHECK(max_rel_diff(*po, ref_step(ref_other, prompt, 0)) < 1e-4);
      CHECK(max_rel_diff(*pp, ref_step(ref_base, prompt, 0)) < 1e-4);
      CHECK(max_rel_diff(want_a, ref_step(base32, prompt, 0)) > 0.5);  // the adapter changes the outputs

      // Decode rounds with all three in one batch, then a batch of several
      // rows each (the adapted session's rows in the middle of the batch).
      for (int round = 0; round < 3; ++round) {
        const Tensor x = random_tensor({1, D}, 100 + round);
        const std::vector<decode_item> items = {{"with-a", x, 7 + round, 0}, {"plain", x, 7 + round, 0},
                                                {"with-other", x, 7 + round, 0}};
        auto out = e.decode_batch(items);
        REQUIRE(out.size() == 3u);
        REQUIRE((out[0] && out[1] && out[2]));
        CHECK(max_rel_diff(*out[0], ref_step(ref_a, x, 7 + round)) < 1e-4);
        CHECK(max_rel_diff(*out[1], ref_step(ref_base, x, 7 + round)) < 1e-4);
        CHECK(max_rel_diff(*out[2], ref_step(ref_other, x, 7 + round)) < 1e-4);
      }
      const Tensor x3 = random_tensor({3, D}, 200), x2 = random_tensor({2, D}, 201), x1 = random_tensor({1, D}, 202);
      const std::vector<decode_item> items = {{"plain", x3, 10, 0}, {"with-a", x2, 10, 0}, {"with-other", x1, 10, 0}};
      auto out = e.decode_batch(items);
      REQUIRE(out.size() == 3u);
      REQUIRE((out[0] && out[1] && out[2]));
      CHECK(max_rel_diff(*out[0], ref_step(ref_base, x3, 10)) < 1e-4);
      CHECK(max_rel_diff(*out[1], ref_step(ref_a, x2, 10)) < 1e-4);
      CHECK(max_rel_diff(*out[2], ref_step(ref_other, x1, 10)) < 1e-4);
      // One session alone (the single-row path: stacked q/k/v and gate/up
      // products in inference formats) with its adapter.
      const Tensor x = random_tensor({1, D}, 500);
      auto one = e.inference_step("with-a", x, 12);
      REQUIRE(one);
      CHECK(max_rel_diff(*one, ref_step(ref_a, x, 12)) < 1e-4);
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
  // (Qwen3: q and k normed per head after the adapted products.)
  for (const auto& o : {llama_opts(2), gpt2_opts(2), family("Qwen3ForCausalLM", 2)}) {
    for (const bool keep : {true, false}) {
      CAPTURE(o.arch == architecture::llama);
      CAPTURE(o.family);
      CAPTURE(keep);
      model_dir m(o);
      const std::int64_t D = m.cfg.hidden_size;
      auto a = random_adapter(m.cfg, 31);
      span_engine_options opts;
      opts.weights = keep ? weight_format::f32 : weight_format::bf16;
      opts.keep_parameters = keep;
      span_engine e = m.engine(0, 2, 4096, opts);
      REQUIRE(e.add_adapter("a", *a));
      // What the request computes: the served weights (bf16 widened back
      // on the inference-only server) with the adapter merged.
      span_engine ref = served_reference(m, opts.weights, a.get(), 0, 2), base32 = m.engine(0, 2);
      const int B = 2, T = 6;
      const Tensor h = random_tensor({B * T, D}, 3), g = random_tensor({B * T, D}, 4);
      const Tensor prompts = random_tensor({2, 2, D}, 6, 0.1f);
      auto f = e.forward(h, B, T, prompts, -1, -1, nullptr, "a"), fr = ref.forward(h, B, T, prompts),
           fb = base32.forward(h, B, T, prompts), plain = e.forward(h, B, T, prompts);
      REQUIRE((f && fr && fb && plain));
      CHECK(max_rel_diff(*f, *fr) < 1e-4);
      CHECK(max_rel_diff(*fr, *fb) > 0.5);  // the adapter changes the outputs
      auto gr = e.backward(h, g, B, T, prompts, -1, -1, "a"), gm = ref.backward(h, g, B, T, prompts);
      REQUIRE((gr && gm));
      // (The terms beside the weights round otherwise than the merged
      // weights: normwise, as f32 backward passes through attention agree.)
      CHECK(testing::relative_error(gr->grad_input.to_vector(), gm->grad_input.to_vector()) < 1e-5);
      CHECK(testing::relative_error(gr->grad_prompts.to_vector(), gm->grad_prompts.to_vector()) < 1e-5);
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
}

TEST_CASE("device-resident batches (the in-process batcher's) take adapted sessions beside base ones") {
  // prepare_steps / run_prepared, as actors/decode_batcher.cpp runs them:
  // one session alone (the single-sequence path) and three together, of
  // two adapters and none, prompts and decode steps in one batch, each
  // equal to the merged model's own steps.
  for (const weight_format f : {weight_format::f32, weight_format::bf16}) {
    CAPTURE(std::string(weight_format_name(f)));
    model_dir m(llama_opts(2));
    const std::int64_t D = m.cfg.hidden_size;
    auto a = random_adapter(m.cfg, 5), b = random_adapter(m.cfg, 6);
    span_engine_options opts;
    opts.weights = f;
    span_engine e = m.engine(0, 2, 4096, opts);
    REQUIRE(e.add_adapter("a", *a));
    REQUIRE(e.add_adapter("b", *b));
    span_engine ref_a = served_reference(m, f, a.get(), 0, 2), ref_b = served_reference(m, f, b.get(), 0, 2),
                ref_base = served_reference(m, f, nullptr, 0, 2);
    REQUIRE(e.open_session("sa", 64, -1, -1, {}, "a"));
    REQUIRE(e.open_session("sb", 64, -1, -1, {}, "b"));
    REQUIRE(e.open_session("base", 64));
    for (span_engine* r : {&ref_a, &ref_b, &ref_base}) REQUIRE(r->open_session("s", 64));
    Backend& be = cpu_backend();
    std::unique_ptr<step_recording> rec;

    // "sa" alone: a prompt of 3.
    const Tensor pa = random_tensor({3, D}, 21);
    const std::vector<batch_step> alone = {{"sa", 0, 3}};
    for (const auto& r : e.prepare_steps(alone)) REQUIRE(r);
    Tensor out_a = Tensor::empty({3, D});
    REQUIRE(e.run_prepared(alone, rec, [&](Tensor& x) { be.copy(pa, x); }, [&](const Tensor& x) { be.copy(x, out_a); }));
    const Tensor want_a = *ref_a.inference_step("s", pa, 0);
    CHECK(max_rel_diff(out_a, want_a) < 1e-4);
    CHECK(max_rel_diff(out_a, *ref_base.inference_step("s", pa, 0)) > 1e-2);  // the adapter tells
    REQUIRE(ref_base.close_session("s"));
    REQUIRE(ref_base.open_session("s", 64));

    // Together: "sa" decodes a row, "sb" a prompt of 2, "base" a prompt of 4.
    const Tensor xa = random_tensor({1, D}, 22), pb = random_tensor({2, D}, 23), pc = random_tensor({4, D}, 24);
    const std::vector<batch_step> three = {{"sa", 3, 1}, {"sb", 0, 2}, {"base", 0, 4}};
    for (const auto& r : e.prepare_steps(three)) REQUIRE(r);
    Tensor out = Tensor::empty({7, D});
    REQUIRE(e.run_prepared(
        three, rec,
        [&](Tensor& x) {
          Tensor r0 = x.slice(0, 1), r1 = x.slice(1, 3), r2 = x.slice(3, 7);
          be.copy(xa, r0);
          be.copy(pb, r1);
          be.copy(pc, r2);
        },
        [&](const Tensor& x) { be.copy(x, out); }));
    CHECK(max_rel_diff(out.slice(0, 1), *ref_a.inference_step("s", xa, 3)) < 1e-4);
    CHECK(max_rel_diff(out.slice(1, 3), *ref_b.inference_step("s", pb, 0)) < 1e-4);
    CHECK(max_rel_diff(out.slice(3, 7), *ref_base.inference_step("s", pc, 0)) < 1e-4);
    CHECK(*e.session_length("sa") == 4);
    CHECK(*e.session_length("sb") == 2);
  }
}
