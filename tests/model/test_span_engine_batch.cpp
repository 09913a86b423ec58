// tests/model/test_span_engine_batch.cpp — the span engine's batched
// decode: a batch of sessions at different lengths against single steps, one
// bad item failing only itself, and a (skipped) bench of decode steps/s
// batched and unbatched.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"
#include "tests/model/span_engine_test_util.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::code_of;
using corolla::testing::error_of;
using corolla::testing::gpt2_opts;
using corolla::testing::llama_opts;
using corolla::testing::max_rel_diff;
using corolla::testing::model_dir;
using corolla::testing::random_tensor;
using corolla::testing::same_values;

TEST_CASE("batched decode of five sessions at different lengths equals single steps") {
  testing::tiny_model_options mixtral = llama_opts();  // a mixture of experts routes the batch's rows together
  mixtral.family = "MixtralForCausalLM";
  for (const auto& o : {llama_opts(), gpt2_opts(), mixtral}) {
    CAPTURE(o.family);
    model_dir m(o);
    const std::int64_t D = m.cfg.hidden_size;
    span_engine e = m.engine(0, 2);
    const std::vector<std::int64_t> prompt_len = {3, 7, 16, 17, 30};  // across page ends
    std::vector<std::int64_t> len;
    for (std::size_t i = 0; i < prompt_len.size(); ++i) {
      const Tensor x = random_tensor({prompt_len[i], D}, i);
      for (const std::string prefix : {"batch", "single"}) {
        REQUIRE(e.open_session(prefix + std::to_string(i), 64));
        REQUIRE(e.inference_step(prefix + std::to_string(i), x, 0));
      }
      len.push_back(prompt_len[i]);
    }
    double worst = 0;
    for (int round = 0; round < 6; ++round) {
      std::vector<decode_item> items;
      for (std::size_t i = 0; i < len.size(); ++i) {
        decode_item it;
        it.session_id = "batch" + std::to_string(i);
        it.hidden = random_tensor({1, D}, 1000 + 10 * round + i);
        it.start_position = len[i];
        it.step_id = static_cast<std::uint64_t>(round + 1);
        // Round 3: session 2 rolls back two tokens (a rejected draft).
        if (round == 3 && i == 2) it.start_position -= 2;
        items.push_back(it);
      }
      auto results = e.decode_batch(items);
      REQUIRE(results.size() == items.size());
      for (std::size_t i = 0; i < items.size(); ++i) {
        auto single = e.inference_step("single" + std::to_string(i), items[i].hidden,
                                       items[i].start_position);
        REQUIRE(single);
        REQUIRE(results[i]);
        worst = std::max(worst, max_rel_diff(*results[i], *single));
        len[i] = items[i].start_position + 1;
        CHECK(*e.session_length("batch" + std::to_string(i)) == len[i]);
      }
    }
    INFO("largest relative difference batched vs single: " << worst);
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("one bad item in a decode batch fails only itself") {
  model_dir m(llama_opts());
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 2, 48);  // three pages
  span_engine ref = m.engine(0, 2);
  for (const std::string id : {"a", "b", "c", "d"}) {
    REQUIRE(e.open_session(id, 64));
    REQUIRE(ref.open_session(id, 64));
  }
  // "d" takes two pages, "a" one: the pool is full; "b" and "c" have none.
  REQUIRE(e.inference_step("d", random_tensor({17, D}, 1), 0));
  REQUIRE(e.inference_step("a", random_tensor({2, D}, 2), 0, 5));
  REQUIRE(ref.inference_step("a", random_tensor({2, D}, 2), 0));

  const Tensor xa = random_tensor({1, D}, 3);
  std::vector<decode_item> items = {
      {"a", xa, 2, 6},
      {"nope", random_tensor({1, D}, 4), 0, 1},
      {"b", random_tensor({1, 8}, 4), 0, 1},
      {"c", random_tensor({1, D}, 4), 0, 1},  // needs a page: the pool is full
      {"a", xa, 2, 6},                        // the same session twice
      {"d", random_tensor({1, D}, 4), 30, 1},
  };
  auto r = e.decode_batch(items);
  REQUIRE(r.size() == 6);
  REQUIRE(r[0]);
  CHECK(same_values(*r[0], *ref.inference_step("a", xa, 2)));
  CHECK(error_of(r[1]) == "unknown session 'nope'");
  CHECK(code_of(r[2]) == span_errc::invalid_argument);
  CHECK(code_of(r[3]) == span_errc::cache_full);
  CHECK(error_of(r[4]) == "session 'a' appears more than once in one decode batch");
  CHECK(error_of(r[5]) == "step starts at position 30 but the session holds 17 tokens");
  CHECK(*e.session_length("c") == 0);
  CHECK(*e.session_length("d") == 17);
  // A retried item in a batch returns the stored output.
  std::vector<decode_item> retry = {{"a", random_tensor({1, D}, 9), 2, 6}};
  auto again = e.decode_batch(retry);
  REQUIRE(again[0]);
  CHECK(same_values(*again[0], *r[0]));
  CHECK(e.decode_batch({}).empty());
}

TEST_CASE("device-resident steps (prepare_steps, run_prepared) equal decode_batch, fail per step, and cut caches back on failure") {
  // The in-process batcher's path (actors/decode_batcher.cpp): the rows are
  // the caller's, filled in and read out by its callbacks.
  model_dir m(llama_opts());
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 2, 48);  // three pages
  span_engine ref = m.engine(0, 2);
  Backend& be = cpu_backend();
  for (const std::string id : {"a", "b", "c", "d"}) {
    REQUIRE(e.open_session(id, 64));
    REQUIRE(ref.open_session(id, 64));
  }
  const Tensor pa = random_tensor({2, D}, 2), pb = random_tensor({3, D}, 5);
  REQUIRE(e.inference_step("d", random_tensor({17, D}, 1), 0));  // "d" two pages, "a" one: the pool is full
  REQUIRE(e.inference_step("a", pa, 0));
  REQUIRE(ref.inference_step("a", pa, 0));
  REQUIRE(ref.inference_step("b", pb, 0));

  // "a" decodes a row, "c" needs a page (full), "a" again, "nope", "b" has
  // no rows, "d" starts past its length.
  std::vector<batch_step> steps = {{"a", 2, 1}, {"c", 0, 1}, {"a", 2, 1}, {"nope", 0, 1}, {"b", 0, 0}, {"d", 30, 1}};
  const auto prepared = e.prepare_steps(steps);
  REQUIRE(prepared.size() == steps.size());
  CHECK(prepared[0]);
  CHECK(code_of(prepared[1]) == span_errc::cache_full);
  CHECK(error_of(prepared[2]) == "session 'a' appears more than once in one batch");
  CHECK(error_of(prepared[3]) == "unknown session 'nope'");
  CHECK(code_of(prepared[4]) == span_errc::invalid_argument);
  CHECK(error_of(prepared[5]) == "step starts at position 30 but the session holds 17 tokens");

  const Tensor xa = random_tensor({1, D}, 3);
  Tensor out = Tensor::empty({1, D});
  std::unique_ptr<step_recording> rec;
  const std::vector<batch_step> one = {steps[0]};
  REQUIRE(e.run_prepared(one, rec, [&](Tensor& x) { be.copy(xa, x); }, [&](const Tensor& x) { be.copy(x, out); }));
  CHECK(same_values(out, *ref.inference_step("a", xa, 2)));
  CHECK(*e.session_length("a") == 3);

  // Two sessions together (the batch path) equal single steps; "a" rolls
  // back one token, "b" runs a prompt of 3 in the same batch.
  REQUIRE(e.close_session("d"));
  REQUIRE(e.open_session("b2", 64));
  const Tensor xa2 = random_tensor({1, D}, 7);
  const std::vector<batch_step> two = {{"a", 2, 1}, {"b2", 0, 3}};
  for (const auto& r : e.prepare_steps(two)) REQUIRE(r);
  Tensor both = Tensor::empty({4, D});
  REQUIRE(e.run_prepared(
      two, rec,
      [&](Tensor& x) {
        Tensor first = x.slice(0, 1), rest = x.slice(1, 4);
        be.copy(xa2, first);
        be.copy(pb, rest);
      },
      [&](const Tensor& x) { be.copy(x, both); }));
  CHECK(max_rel_diff(both.slice(0, 1), *ref.inference_step("a", xa2, 2)) < 1e-4);
  CHECK(max_rel_diff(both.slice(1, 4), *ref.inference_step("b", pb, 0)) < 1e-4);
  CHECK(*e.session_length("a") == 3);
  CHECK(*e.session_length("b2") == 3);

  // A failure inside the step: both caches cut back to their starts, the
  // error returned, the sessions usable.
  const std::vector<batch_step> grow = {{"a", 3, 1}, {"b2", 3, 1}};
  for (const auto& r : e.prepare_steps(grow)) REQUIRE(r);
  auto failed = e.run_prepared(
      grow, rec, [&](Tensor&) { throw std::runtime_error("the device fell over"); }, [&](const Tensor&) {});
  CHECK(code_of(failed) == span_errc::internal);
  CHECK(error_of(failed) == "span computation failed: the device fell over");
  CHECK(*e.session_length("a") == 3);
  CHECK(*e.session_length("b2") == 3);
  CHECK(e.run_prepared({}, rec, [](Tensor&) {}, [](const Tensor&) {}));
}

// ---- decode throughput: batched vs one session at a time ------------------------------

namespace {

double steps_per_second(const std::function<void()>& one_round, int rounds, int steps_per_round) {
  one_round();  // warm-up: workspaces, pages
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) one_round();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rounds * steps_per_round / s;
}

}  // namespace

TEST_CASE("bench: decode steps/s of 1 and 8 sessions, batched and unbatched" * doctest::skip()) {
  testing::tiny_model_options o;
  o.arch = architecture::llama;
  o.hidden = 512;
  o.heads = 8;
  o.kv_heads = 4;
  o.intermediate = 1408;
  o.layers = 4;
  o.max_positions = 512;
  const model_config cfg = testing::tiny_config(o);
  Backend& be = cpu_backend();
  transformer model = transformer::init(cfg, 1, be);  // GPT-2 initialisation
  std::vector<param_set> params = model.blocks();
  span_engine e(stage(cfg, 0, params, be), 16 * 512);
  const std::int64_t D = cfg.hidden_size;
  const int prompt = 64, rounds = 30;
  std::ostringstream report;
  report << std::fixed << std::setprecision(1);
  for (int sessions : {1, 8}) {
    std::vector<std::string> ids;
    std::vector<std::int64_t> len;
    for (int i = 0; i < sessions; ++i) {
      ids.push_back(std::to_string(sessions) + "-" + std::to_string(i));
      REQUIRE(e.open_session(ids.back(), 512));
      REQUIRE(e.inference_step(ids.back(), random_tensor({prompt, D}, i, 0.1f), 0));
      len.push_back(prompt);
    }
    const Tensor row = random_tensor({1, D}, 7, 0.1f);
    // Unbatched rounds run first, then batched ones at ~30 positions later:
    // the attention's share of the work is small at these lengths.
    auto unbatched = [&] {
      for (int i = 0; i < sessions; ++i) {
        REQUIRE(e.inference_step(ids[static_cast<std::size_t>(i)], row, len[i]));
        ++len[static_cast<std::size_t>(i)];
      }
    };
    auto batched = [&] {
      std::vector<decode_item> items;
      for (int i = 0; i < sessions; ++i)
        items.push_back({ids[static_cast<std::size_t>(i)], row, len[static_cast<std::size_t>(i)], 0});
      for (auto& r : e.decode_batch(items)) REQUIRE(r);
      for (auto& l : len) ++l;
    };
    const double u = steps_per_second(unbatched, rounds, sessions);
    const double b = steps_per_second(batched, rounds, sessions);
    report << sessions << " session(s): unbatched " << u << " steps/s, batched " << b
           << " steps/s (x" << std::setprecision(2) << b / u << std::setprecision(1) << ")\n";
    for (const auto& id : ids) REQUIRE(e.close_session(id));
  }
  MESSAGE("decode, dim 512, 4 layers, GQA 8/4, context ~64-130, " << cpu_threads()
                                                                  << " threads:\n"
                                                                  << report.str());
}
