// tests/model/test_span_engine_sessions.cpp — the server's span engine and
// its sessions: remote equals local (a chain of engines and the client's head
// generate what local generation does, deep prompts included), rollback and
// replay (what failover does), a session over part of the span, retried
// steps, every validation error, the KV cache (bf16, full) and the
// accounting a server announces.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/span_engine.hpp"
#include "model/transformer.hpp"
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
using corolla::testing::same_values;
using corolla::testing::some_ids;

namespace {

/// Rows [begin, end) of several [n_i, D] tensors laid end to end.
Tensor concat(const std::vector<Tensor>& parts) {
  std::int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.dim(0);
  Tensor out = Tensor::empty({rows, parts.at(0).dim(1)});
  std::int64_t r = 0;
  for (const Tensor& t : parts) {
    Tensor dst = out.slice(r, r + t.dim(0));
    dst.copy_from(t);
    r += t.dim(0);
  }
  return out;
}

void check_chain_equals_local(const testing::tiny_model_options& o, int split) {
  model_dir m(o);
  const auto prompt = some_ids(7, m.cfg.vocab_size, 5);
  const int new_tokens = 24;

  transformer local = transformer::load(m.dir.path(), cpu_backend());
  generator gen(local);
  generation_params p;
  p.max_new_tokens = new_tokens;
  p.ignore_eos = true;
  const auto expected = gen.generate(prompt, p).tokens;

  // Two servers: [0, split) and [split, n). Only hidden states cross.
  span_engine first = m.engine(0, split), second = m.engine(split, m.cfg.n_layers);
  const std::int64_t max_len = static_cast<std::int64_t>(prompt.size()) + new_tokens;
  REQUIRE(first.open_session("s", max_len));
  REQUIRE(second.open_session("s", max_len));
  std::vector<std::int32_t> got;
  std::vector<std::int32_t> input = prompt;
  std::int64_t pos = 0;
  std::uint64_t step = 1;
  while (static_cast<int>(got.size()) < new_tokens) {
    auto h = first.inference_step("s", m.embed(input, pos), pos, step);
    REQUIRE(h);
    auto out = second.inference_step("s", *h, pos, step);
    REQUIRE(out);
    const std::int32_t token = m.next_token(*out);
    got.push_back(token);
    pos += static_cast<std::int64_t>(input.size());
    input = {token};
    ++step;
  }
  CHECK(got == expected);
  CHECK(*first.session_length("s") == max_len - 1);
}

}  // namespace

TEST_CASE("a chain of two span engines and the client's head generates as local generation") {
  SUBCASE("llama GQA") { check_chain_equals_local(llama_opts(3), 1); }
  SUBCASE("llama GQA, other split") { check_chain_equals_local(llama_opts(3), 2); }
  SUBCASE("gpt2") { check_chain_equals_local(gpt2_opts(3), 2); }
}

TEST_CASE("span engines with deep prompts generate what local generation after the same prompts does") {
  for (const auto& o : {llama_opts(3), gpt2_opts(3)}) {
    CAPTURE(static_cast<int>(o.arch));
    model_dir m(o);
    const std::int64_t P = 4, D = m.cfg.hidden_size;
    Tensor prompts = random_tensor({m.cfg.n_layers, P, D}, 21, 0.5f);
    const auto prompt = some_ids(6, m.cfg.vocab_size, 8);
    const int new_tokens = 16;
    transformer local = transformer::load(m.dir.path(), cpu_backend());
    generator gen(local);
    gen.set_deep_prompts(prompts);
    generation_params p;
    p.max_new_tokens = new_tokens;
    p.ignore_eos = true;
    const auto expected = gen.generate(prompt, p).tokens;

    // Blocks [0, 1) and [1, 3), each with its slice of the prompts. The
    // first step carries P zero rows, then the tokens at positions P..
    span_engine first = m.engine(0, 1), second = m.engine(1, m.cfg.n_layers);
    const std::int64_t max_len = P + static_cast<std::int64_t>(prompt.size()) + new_tokens;
    REQUIRE(first.open_session("s", max_len, -1, -1, prompts.slice(0, 1)));
    REQUIRE(second.open_session("s", max_len, -1, -1, prompts.slice(1, m.cfg.n_layers)));
    std::vector<std::int32_t> got;
    std::vector<std::int32_t> input = prompt;
    std::int64_t pos = 0;
    std::uint64_t step = 1;
    while (static_cast<int>(got.size()) < new_tokens) {
      Tensor x = m.embed(input, P + pos);
      if (pos == 0) x = concat({Tensor::zeros({P, D}), x});
      const std::int64_t at = pos == 0 ? 0 : P + pos;
      auto h = first.inference_step("s", x, at, step);
      REQUIRE(h);
      auto out = second.inference_step("s", *h, at, step);
      REQUIRE(out);
      got.push_back(m.next_token(*out));
      pos += static_cast<std::int64_t>(input.size());
      input = {got.back()};
      ++step;
    }
    CHECK(got == expected);
    // Without the prompts the output differs (the test can tell).
    generator plain(local);
    CHECK(plain.generate(prompt, p).tokens != expected);

    // Misshapen prompts are refused.
    span_engine third = m.engine(0, 1);
    CHECK(error_of(third.open_session("t", max_len, -1, -1, prompts)).find("deep prompts for 1 blocks must be f32") !=
          std::string::npos);
    CHECK(error_of(third.open_session("t", P, -1, -1, prompts.slice(0, 1))).find("leave no room") != std::string::npos);
  }
}

TEST_CASE("replaying a span's stored inputs into a new session reproduces its outputs") {
  for (const auto& o : {llama_opts(), gpt2_opts()}) {
    model_dir m(o);
    span_engine e = m.engine(0, 2, 256, {4, 8192});  // small pages: rollbacks cross pages
    REQUIRE(e.open_session("a", 64));
    // A prefill of 5 rows, then 10 decode steps: the client keeps every input.
    std::vector<Tensor> inputs, outputs;
    inputs.push_back(random_tensor({5, m.cfg.hidden_size}, 1));
    for (int i = 0; i < 10; ++i) inputs.push_back(random_tensor({1, m.cfg.hidden_size}, 10 + i));
    std::int64_t pos = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      auto out = e.inference_step("a", inputs[i], pos, i + 1);
      REQUIRE(out);
      outputs.push_back(*out);
      pos += inputs[i].dim(0);
    }
    const Tensor all_in = concat(inputs), all_out = concat(outputs);

    // Failover: a replacement server gets the stored inputs in one prefill.
    REQUIRE(e.open_session("replacement", 64));
    auto replay = e.inference_step("replacement", all_in, 0, 1);
    REQUIRE(replay);
    CHECK(max_rel_diff(*replay, all_out) < 1e-4);
    // ... and continues exactly as the original would have.
    const Tensor next = random_tensor({1, m.cfg.hidden_size}, 99);
    auto a = e.inference_step("a", next, 15, 100);
    auto b = e.inference_step("replacement", next, 15, 2);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(max_rel_diff(*b, *a) < 1e-4);

    // Re-running from a middle position (rollback) gives the same outputs
    // again and leaves the session at the end of the rerun.
    auto mid = e.inference_step("a", all_in.slice(8, 15), 8, 101);
    REQUIRE(mid);
    CHECK(max_rel_diff(*mid, all_out.slice(8, 15)) < 1e-4);
    CHECK(*e.session_length("a") == 15);
    // Rollback with other tokens (speculative decoding rejected a draft):
    // equal to a fresh session fed the kept prefix and the new tokens.
    const Tensor other = random_tensor({2, m.cfg.hidden_size}, 77);
    auto spec = e.inference_step("a", other, 6, 102);
    REQUIRE(spec);
    CHECK(*e.session_length("a") == 8);
    REQUIRE(e.open_session("fresh", 64));
    REQUIRE(e.inference_step("fresh", all_in.slice(0, 6), 0));
    auto fresh = e.inference_step("fresh", other, 6);
    REQUIRE(fresh);
    CHECK(max_rel_diff(*spec, *fresh) < 1e-4);
    // Rolling back to 0 is allowed too (Petals asserted here).
    REQUIRE(e.inference_step("a", all_in.slice(0, 1), 0, 103));
    CHECK(*e.session_length("a") == 1);
  }
}

TEST_CASE("a session over part of a server's span equals an engine holding just those blocks") {
  model_dir m(llama_opts(3));
  span_engine whole = m.engine(0, 3), part = m.engine(1, 3);
  REQUIRE(whole.open_session("sub", 32, 1, 3));
  REQUIRE(whole.open_session("full", 32));
  REQUIRE(part.open_session("ref", 32));
  std::int64_t pos = 0;
  for (int step = 0; step < 6; ++step) {
    const Tensor x = random_tensor({step == 0 ? 4 : 1, m.cfg.hidden_size}, 50 + static_cast<std::uint64_t>(step));
    auto got = whole.inference_step("sub", x, pos, static_cast<std::uint64_t>(step + 1));
    auto want = part.inference_step("ref", x, pos);
    REQUIRE(got);
    REQUIRE(want);
    CHECK(same_values(*got, *want));  // the same blocks, the same arithmetic
    pos += x.dim(0);
  }
  CHECK(*whole.session_length("sub") == pos);
  // In a decode batch with a full-span session, each still runs its own blocks.
  const Tensor a = random_tensor({1, m.cfg.hidden_size}, 70), b = random_tensor({1, m.cfg.hidden_size}, 71);
  REQUIRE(whole.inference_step("full", random_tensor({pos, m.cfg.hidden_size}, 72), 0));
  std::vector<decode_item> items{{"sub", a, pos, 0}, {"full", b, pos, 0}};
  auto results = whole.decode_batch(items);
  REQUIRE(results.size() == 2);
  REQUIRE(results[0]);
  REQUIRE(results[1]);
  auto want = part.inference_step("ref", a, pos);
  REQUIRE(want);
  CHECK(same_values(*results[0], *want));
  // Blocks outside the span are refused.
  CHECK(code_of(whole.open_session("bad", 32, 2, 4)) == span_errc::wrong_span);
  CHECK(code_of(whole.open_session("empty", 32, 2, 2)) == span_errc::invalid_argument);
}

TEST_CASE("rollback returns the KV pages past the new end to the pool") {
  model_dir m(llama_opts());
  span_engine e = m.engine(0, 2, 64, {4, 8192});
  REQUIRE(e.open_session("a", 64));
  REQUIRE(e.inference_step("a", random_tensor({30, m.cfg.hidden_size}, 1), 0));
  CHECK(e.cache_tokens_left() == 64 - 32);
  REQUIRE(e.inference_step("a", random_tensor({1, m.cfg.hidden_size}, 2), 5));
  CHECK(*e.session_length("a") == 6);
  CHECK(e.cache_tokens_left() == 64 - 8);
}

TEST_CASE("a server's bf16 KV cache holds twice the bytes' tokens and serves the f32 cache's outputs within rounding") {
  model_dir m(llama_opts());
  span_engine_options half;
  half.kv_dtype = dtype::bf16;
  span_engine f32 = m.engine(0, 2, 64), b16 = m.engine(0, 2, 64, half);
  CHECK(b16.pool().type() == dtype::bf16);
  CHECK(2 * b16.kv_bytes_per_token() == f32.kv_bytes_per_token());
  CHECK(b16.kv_bytes_per_token() == span_engine::kv_bytes_per_token(m.cfg, 2, dtype::bf16));
  CHECK(b16.cache_tokens() == f32.cache_tokens());  // the same tokens in half the bytes
  CHECK(2 * b16.pool().budget_bytes() == f32.pool().budget_bytes());
  for (span_engine* e : {&f32, &b16}) REQUIRE(e->open_session("s", 32));
  const std::int64_t D = m.cfg.hidden_size;
  // A prefill (appended rows), then decode steps (rows written by rope_store_kv).
  for (std::int64_t start : {0, 12, 13, 14}) {
    CAPTURE(start);
    const Tensor x = random_tensor({start == 0 ? 12 : 1, D}, static_cast<std::uint64_t>(start + 1));
    auto a = f32.inference_step("s", x, start);
    auto b = b16.inference_step("s", x, start);
    REQUIRE(a);
    REQUIRE(b);
    const auto want = a->to_vector(), got = b->to_vector();
    double magnitude = 0, diff = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      magnitude = std::max(magnitude, static_cast<double>(std::abs(want[i])));
      diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    }
    CHECK(diff <= 24 * 0x1p-9 * magnitude);
    if (start > 0) CHECK(diff > 0.0);  // the cached keys and values were bf16
  }
}

TEST_CASE("a retried step returns the stored output without recomputing") {
  model_dir m(llama_opts());
  span_engine e = m.engine(0, 2);
  REQUIRE(e.open_session("s", 32));
  const std::int64_t D = m.cfg.hidden_size;
  REQUIRE(e.inference_step("s", random_tensor({4, D}, 1), 0, 7));
  const Tensor x = random_tensor({1, D}, 2);
  auto first = e.inference_step("s", x, 4, 8);
  REQUIRE(first);
  // The retry carries other values on purpose: a recomputation would differ.
  auto retry = e.inference_step("s", random_tensor({1, D}, 3), 4, 8);
  REQUIRE(retry);
  CHECK(same_values(*retry, *first));
  CHECK(*e.session_length("s") == 5);
  // The returned tensor is the caller's: writing into it changes no retry.
  retry->zero();
  CHECK(same_values(*e.inference_step("s", x, 4, 8), *first));
  // Another step id at the same start is a rollback, computed afresh.
  auto other = e.inference_step("s", random_tensor({1, D}, 3), 4, 9);
  REQUIRE(other);
  CHECK_FALSE(same_values(*other, *first));
  // Step id 0 never counts as a retry.
  auto a = e.inference_step("s", x, 4, 0);
  auto b = e.inference_step("s", x, 4, 0);
  REQUIRE(a);
  CHECK(max_rel_diff(*a, *first) < 1e-6);
  CHECK(max_rel_diff(*b, *first) < 1e-6);
  // An old step id after a newer step is not a retry of the last step.
  auto old = e.inference_step("s", random_tensor({4, D}, 5), 0, 7);
  REQUIRE(old);
  CHECK(*e.session_length("s") == 4);
}

TEST_CASE("every invalid session request is a clear error and the session stays usable") {
  model_dir m(llama_opts());
  span_engine e = m.engine(0, 2);
  const std::int64_t D = m.cfg.hidden_size;  // 32; context 64
  REQUIRE(e.open_session("s", 40));

  CHECK(error_of(e.open_session("s", 10)) == "session 's' is already open");
  CHECK(code_of(e.open_session("s", 10)) == span_errc::duplicate_session);
  CHECK(error_of(e.open_session("", 10)) == "a session id must not be empty");
  CHECK(error_of(e.open_session("t", 0)) == "max length must be positive, got 0");
  CHECK(error_of(e.open_session("t", 65)) == "max length 65 exceeds the model context of 64");
  CHECK(error_of(e.close_session("nope")) == "unknown session 'nope'");
  CHECK(code_of(e.close_session("nope")) == span_errc::unknown_session);
  CHECK(error_of(e.session_length("nope")) == "unknown session 'nope'");

  auto step = [&](const Tensor& x, std::int64_t start, const std::string& id = "s") {
    return e.inference_step(id, x, start, 1);
  };
  CHECK(error_of(step(random_tensor({1, D}, 1), 0, "nope")) == "unknown session 'nope'");
  CHECK(error_of(step(random_tensor({1, 16}, 1), 0)) ==
        "hidden states must be [n, 32] (the model's hidden size is 32), got [1, 16]");
  CHECK(error_of(step(random_tensor({D}, 1), 0)) ==
        "hidden states must be [n, 32] (the model's hidden size is 32), got [32]");
  CHECK(error_of(step(Tensor::zeros({1, D}, dtype::i32), 0)) ==
        "hidden states must be f32, bf16 or f16, got i32");
  CHECK(error_of(step(Tensor::empty({0, D}), 0)) ==
        "hidden states have no rows: a request needs at least one token");
  CHECK(error_of(step(Tensor(), 0)) == "hidden states are missing");
  CHECK(code_of(step(Tensor::empty({0, D}), 0)) == span_errc::invalid_argument);
  CHECK(error_of(step(random_tensor({1, D}, 1), 3)) ==
        "step starts at position 3 but the session holds 0 tokens");
  CHECK(code_of(step(random_tensor({1, D}, 1), 3)) == span_errc::bad_position);
  CHECK(error_of(step(random_tensor({1, D}, 1), -1)) == "step starts at negative position -1");
  CHECK(error_of(step(random_tensor({41, D}, 1), 0)) ==
        "step covers positions 0..40 but session 's' was opened for 40 tokens");
  CHECK(e.cache_tokens_left() == e.cache_tokens());  // nothing taken by failed steps

  // The session still works, exactly like one that never saw the errors.
  REQUIRE(e.open_session("clean", 40));
  const Tensor x = random_tensor({3, D}, 4);
  auto a = e.inference_step("s", x, 0);
  auto b = e.inference_step("clean", x, 0);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(same_values(*a, *b));
  CHECK(error_of(step(random_tensor({1, D}, 1), 4)) ==
        "step starts at position 4 but the session holds 3 tokens");
  CHECK(error_of(step(random_tensor({38, D}, 1), 3)) ==
        "step covers positions 3..40 but session 's' was opened for 40 tokens");
  CHECK(*e.session_length("s") == 3);
  // bf16 hidden states are accepted (the wire's default) and converted.
  auto h16 = e.inference_step("s", random_tensor({1, D}, 6).to(dtype::bf16), 3);
  REQUIRE(h16);
  CHECK(h16->type() == dtype::f32);
  REQUIRE(e.close_session("s"));
  CHECK(error_of(step(random_tensor({1, D}, 1), 0)) == "unknown session 's'");
}

TEST_CASE("a full KV cache fails the step, keeps the session and spares the others") {
  model_dir m(llama_opts());
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 2, 32);  // two pages of 16 tokens
  span_engine ref = m.engine(0, 2);    // plenty of room: the expected outputs
  REQUIRE(e.open_session("a", 64));
  REQUIRE(ref.open_session("a", 64));
  const Tensor prefill = random_tensor({20, D}, 1);
  REQUIRE(e.inference_step("a", prefill, 0));
  REQUIRE(ref.inference_step("a", prefill, 0));
  CHECK(e.cache_tokens_left() == 0);

  // A new session cannot get a page.
  REQUIRE(e.open_session("b", 64));
  auto full = e.inference_step("b", random_tensor({1, D}, 2), 0);
  CHECK(code_of(full) == span_errc::cache_full);
  CHECK(error_of(full).rfind("KV cache full: need 1 more tokens (", 0) == 0);
  CHECK(*e.session_length("b") == 0);

  // "a" grows inside its pages, then hits the end of the budget.
  for (std::int64_t pos = 20; pos < 32; ++pos) {
    const Tensor x = random_tensor({1, D}, 100 + static_cast<std::uint64_t>(pos));
    auto got = e.inference_step("a", x, pos, static_cast<std::uint64_t>(pos));
    auto want = ref.inference_step("a", x, pos);
    REQUIRE(got);
    CHECK(same_values(*got, *want));
  }
  auto beyond = e.inference_step("a", random_tensor({1, D}, 3), 32, 32);
  CHECK(code_of(beyond) == span_errc::cache_full);
  CHECK(*e.session_length("a") == 32);
  // Nothing was half-appended: the retry of the last good step and the next
  // steps after a rollback match the reference.
  const Tensor last = random_tensor({1, D}, 131);
  CHECK(same_values(*e.inference_step("a", last, 31, 31), *ref.inference_step("a", last, 31)));
  const Tensor again = random_tensor({2, D}, 4);
  CHECK(same_values(*e.inference_step("a", again, 30, 40), *ref.inference_step("a", again, 30)));

  // Closing "a" frees its pages for "b".
  REQUIRE(e.close_session("a"));
  CHECK(e.cache_tokens_left() == 32);
  CHECK(e.inference_step("b", random_tensor({1, D}, 2), 0));
}

TEST_CASE("cache accounting follows the pages sessions hold") {
  model_dir m(llama_opts());  // 2 layers, 2 kv heads x 8 dims
  const std::size_t per_token = 2 * 2 * 2 * 8 * 4;
  CHECK(span_engine::kv_bytes_per_token(m.cfg, 2) == per_token);
  CHECK(span_engine::kv_bytes_per_token(m.cfg, 1) == per_token / 2);
  span_engine e = m.engine(0, 2, 100);  // rounded up to 7 pages of 16
  CHECK(e.kv_bytes_per_token() == per_token);
  CHECK(e.cache_tokens() == 112);
  CHECK(e.pool().budget_bytes() == 112 * per_token);
  CHECK(e.cache_tokens_left() == 112);
  REQUIRE(e.open_session("a", 64));
  REQUIRE(e.open_session("b", 64));
  CHECK(e.cache_tokens_left() == 112);  // opening takes nothing
  CHECK(e.session_count() == 2);
  REQUIRE(e.inference_step("a", random_tensor({17, m.cfg.hidden_size}, 1), 0));
  REQUIRE(e.inference_step("b", random_tensor({3, m.cfg.hidden_size}, 2), 0));
  CHECK(e.cache_tokens_left() == 112 - 48);
  CHECK(e.cache_bytes_used() == 48 * per_token);
  auto infos = e.sessions();
  std::sort(infos.begin(), infos.end(),
            [](const span_session_info& x, const span_session_info& y) { return x.id < y.id; });
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].id == "a");
  CHECK(infos[0].length == 17);
  CHECK(infos[0].held_tokens == 32);
  CHECK(infos[0].max_length == 64);
  CHECK(infos[1].length == 3);
  REQUIRE(e.close_session("a"));
  CHECK(e.cache_tokens_left() == 112 - 16);
  CHECK(e.session_count() == 1);
  // A session over one of the two blocks pays for that block's layer only:
  // 48 tokens of it take what 24 whole-span tokens would.
  REQUIRE(e.open_session("half", 64, 1, 2));
  REQUIRE(e.inference_step("half", random_tensor({48, m.cfg.hidden_size}, 3), 0));
  CHECK(e.cache_bytes_used() == (16 + 24) * per_token);
  // Left for a new whole-span session: 14 - 2 - 3 = 9 free one-layer pages
  // make 4 whole pages of 16 tokens.
  CHECK(e.cache_tokens_left() == 64);
  REQUIRE(e.close_session("half"));
  // A zero budget is allowed (the server then only serves forward/backward).
  span_engine none = m.engine(0, 2, 0);
  CHECK(none.cache_tokens() == 0);
  REQUIRE(none.open_session("s", 8));
  CHECK(code_of(none.inference_step("s", random_tensor({1, m.cfg.hidden_size}, 1), 0)) ==
        span_errc::cache_full);
}

TEST_CASE("a session started on another's pages computes what one that computed them does, and never writes them") {
  for (const auto& o : {llama_opts(), gpt2_opts()}) {
    model_dir m(o);
    span_engine e = m.engine(0, 2, 256, {4, 8192});  // pages of 4 tokens
    const std::int64_t D = m.cfg.hidden_size;
    const Tensor prefix = random_tensor({10, D}, 1), rest = random_tensor({3, D}, 2), next = random_tensor({1, D}, 3);
    REQUIRE(e.open_session("a", 64));
    REQUIRE(e.open_session("ref", 64));
    REQUIRE(e.inference_step("a", prefix, 0));
    REQUIRE(e.inference_step("ref", prefix, 0));
    const std::int64_t left = e.cache_tokens_left();

    REQUIRE(e.open_session("b", 64));
    auto shared = e.share_prefix("b", "a", 10);
    REQUIRE(shared);
    CHECK(*shared == 10);
    CHECK(*e.session_length("b") == 10);
    CHECK(e.cache_tokens_left() == left - 4);  // the page the prefix ends inside: a copy
    // b's rows after the prefix: as a session that computed all of it (the
    // same arithmetic: bit for bit).
    auto got = e.inference_step("b", rest, 10);
    REQUIRE(got);
    REQUIRE(e.open_session("c", 64));
    REQUIRE(e.inference_step("c", prefix, 0));
    auto want = e.inference_step("c", rest, 10);
    REQUIRE(want);
    CHECK(same_values(*got, *want));

    // b rolls back into a shared page and writes other rows there: a's
    // cache is untouched (a's next step equals its twin's bit for bit).
    const std::int64_t before_rollback = e.cache_tokens_left();
    REQUIRE(e.inference_step("b", random_tensor({2, D}, 4), 6));
    CHECK(*e.session_length("b") == 8);
    // b copied page 1 (4 tokens) and let its own pages 2 and 3 go (8).
    CHECK(e.cache_tokens_left() == before_rollback + 4);
    auto a_next = e.inference_step("a", next, 10);
    auto ref_next = e.inference_step("ref", next, 10);
    REQUIRE(a_next);
    REQUIRE(ref_next);
    CHECK(same_values(*a_next, *ref_next));

    // Closing the first holder leaves the pages to the others.
    REQUIRE(e.open_session("d", 64));
    REQUIRE(e.share_prefix("d", "a", 11));
    REQUIRE(e.close_session("a"));
    auto d_next = e.inference_step("d", concat({prefix.slice(8, 10), next}), 8);
    REQUIRE(d_next);
    CHECK(max_rel_diff(d_next->slice(2, 3), *ref_next) < 1e-4);

    // What cannot be shared.
    REQUIRE(e.open_session("part", 64, 1, 2));
    CHECK(code_of(e.share_prefix("nobody", "ref", 8)) == span_errc::unknown_session);
    CHECK(code_of(e.share_prefix("part", "nobody", 8)) == span_errc::unknown_session);
    CHECK(code_of(e.share_prefix("ref", "ref", 8)) == span_errc::invalid_argument);
    CHECK(error_of(e.share_prefix("c", "ref", 8)).find("already holds 13 tokens") != std::string::npos);
    CHECK(error_of(e.share_prefix("part", "ref", 8)).find("other blocks") != std::string::npos);
    REQUIRE(e.open_session("e", 64));
    auto none = e.share_prefix("e", "ref", 0);
    REQUIRE(none);
    CHECK(*none == 0);
  }
}
