// The server's span engine: remote equals local (a chain of engines and the
// client's head generate what local generation does), rollback and replay
// (what failover does), retried steps, every validation error, a full KV
// cache, batched decode against single steps, the stateless forward and
// backward with deep prompts (against the stage and finite differences),
// and the accounting a server announces.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"
#include "model/safetensors.hpp"
#include "model/sampler.hpp"
#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::check_direction;
using corolla::testing::dot;
using corolla::testing::max_rel_diff;
using corolla::testing::random_tensor;

namespace {

testing::tiny_model_options llama_opts(int layers = 2) {
  testing::tiny_model_options o;
  o.arch = architecture::llama;
  o.kv_heads = 2;
  o.layers = layers;
  return o;
}

testing::tiny_model_options gpt2_opts(int layers = 2) {
  testing::tiny_model_options o;
  o.arch = architecture::gpt2;
  o.kv_heads = o.heads;
  o.intermediate = 64;
  o.layers = layers;
  o.seed = 3;
  return o;
}

/// A tiny model on disk with its head loaded (the client's side).
struct model_dir {
  testing::temp_dir_guard dir{"span-engine"};
  model_config cfg;
  checkpoint ck;
  head client;

  explicit model_dir(const testing::tiny_model_options& o)
      : cfg(write(dir.path(), o)), ck(checkpoint::open(dir.path())),
        client(head::load(ck, cfg, cpu_backend())) {}

  static model_config write(const std::filesystem::path& p, const testing::tiny_model_options& o) {
    testing::write_tiny_model(p, o);
    return load_config(p);
  }

  span_engine engine(int first, int last, std::int64_t cache_tokens = 4096,
                     const span_engine_options& opts = {}) {
    return span_engine::load(ck, cfg, first, last, cpu_backend(), cache_tokens, opts);
  }

  /// Embeddings of `ids` at positions start.. [n, D].
  Tensor embed(const std::vector<std::int32_t>& ids, std::int64_t start) {
    const auto n = static_cast<std::int64_t>(ids.size());
    std::vector<std::int32_t> pos;
    for (std::int64_t i = 0; i < n; ++i) pos.push_back(static_cast<std::int32_t>(start + i));
    Tensor x = Tensor::empty({n, cfg.hidden_size});
    client.embed(Tensor::from_i32(ids, {n}), Tensor::from_i32(pos, {n}), x);
    return x;
  }

  /// Greedy next token from the last row of the span chain's output.
  std::int32_t next_token(const Tensor& hidden) {
    Tensor last = hidden.slice(hidden.dim(0) - 1, hidden.dim(0));
    Tensor logits = Tensor::empty({1, cfg.vocab_size});
    client.logits(last, logits, nullptr);
    return argmax({logits.data<float>(), static_cast<std::size_t>(cfg.vocab_size)});
  }
};

std::vector<std::int32_t> some_ids(int n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<std::int32_t>(rng() % vocab));
  return ids;
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

template <class T>
std::string error_of(const span_expected<T>& r) {
  return r ? std::string("(no error)") : r.error().message;
}

template <class T>
span_errc code_of(const span_expected<T>& r) {
  REQUIRE_FALSE(r.has_value());
  return r.error().code;
}

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

TEST_CASE("batched decode of five sessions at different lengths equals single steps") {
  for (const auto& o : {llama_opts(), gpt2_opts()}) {
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

TEST_CASE("the stateless forward equals the stage's forward and each sequence's prefill") {
  for (const auto& o : {llama_opts(), gpt2_opts()}) {
    model_dir m(o);
    const int B = 3, T = 9;
    const std::int64_t D = m.cfg.hidden_size;
    span_engine e = m.engine(0, 2);
    stage s = stage::load(m.ck, m.cfg, 0, 2, cpu_backend());
    const Tensor x = random_tensor({B * T, D}, 1);
    auto got = e.forward(x, B, T);
    REQUIRE(got);
    Tensor want = Tensor::empty({B * T, D});
    s.forward(x, B, T, want, nullptr);
    CHECK(same_values(*got, want));
    // Zero deep prompts change nothing.
    auto zero = e.forward(x, B, T, Tensor::zeros({2, 4, D}));
    REQUIRE(zero);
    CHECK(same_values(*zero, want));
    // Each sequence alone, through a session, gives the same rows.
    for (int b = 0; b < B; ++b) {
      const std::string id = "seq" + std::to_string(b);
      REQUIRE(e.open_session(id, T));
      auto out = e.inference_step(id, x.slice(b * T, (b + 1) * T), 0);
      REQUIRE(out);
      CHECK(max_rel_diff(*out, got->slice(b * T, (b + 1) * T)) < 1e-4);
    }
    // Deep prompts: block i's prompt added to the first P rows of each
    // sequence at block i's input, by hand with the stage's blocks.
    const Tensor prompts = random_tensor({2, 4, D}, 2, 0.5f);
    auto with = e.forward(x, B, T, prompts);
    REQUIRE(with);
    std::vector<param_set> blocks0(s.params().begin(), s.params().begin() + 1);
    std::vector<param_set> blocks1(s.params().begin() + 1, s.params().end());
    stage s0(m.cfg, 0, blocks0, cpu_backend()), s1(m.cfg, 1, blocks1, cpu_backend());
    Tensor h = x.clone(), h1 = Tensor::empty({B * T, D}), h2 = Tensor::empty({B * T, D});
    auto add_prompt = [&](Tensor& t, int block) {
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < 4; ++p)
          for (std::int64_t d = 0; d < D; ++d)
            t.data<float>()[(b * T + p) * D + d] += prompts.data<float>()[(block * 4 + p) * D + d];
    };
    add_prompt(h, 0);
    s0.forward(h, B, T, h1, nullptr);
    add_prompt(h1, 1);
    s1.forward(h1, B, T, h2, nullptr);
    CHECK(max_rel_diff(*with, h2) < 1e-6);
  }
}

namespace {

void fill_random(param_set& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& e : p.entries()) {
    Tensor t = p.get(e.name);
    float* v = t.data<float>();
    const bool norm = e.name.find("norm.weight") != std::string::npos;
    const float scale = e.name.find("bias") != std::string::npos ? 0.1f : norm ? 0.1f : 0.3f;
    for (std::int64_t i = 0; i < e.numel; ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * normal(rng);
  }
}

void check_backward(architecture arch, int kv_heads) {
  testing::tiny_model_options o;
  o.arch = arch;
  o.hidden = 16;
  o.heads = 4;
  o.kv_heads = arch == architecture::gpt2 ? 4 : kv_heads;
  o.intermediate = 24;
  o.layers = 3;
  o.max_positions = 16;
  const model_config cfg = testing::tiny_config(o);
  Backend& be = cpu_backend();
  std::vector<param_set> params;
  for (int i = 0; i < 2; ++i) {
    params.emplace_back(block_layout(cfg));
    fill_random(params.back(), 11 + static_cast<std::uint64_t>(i));
  }
  // The engine hosts blocks [1, 3); a reference stage shares its weights.
  span_engine e(stage(cfg, 1, params, be), 64);
  stage ref(cfg, 1, params, be);
  const int B = 2, T = 5, P = 3;
  const std::int64_t N = B * T, D = cfg.hidden_size;
  Tensor x = random_tensor({N, D}, 5);
  Tensor prompts = random_tensor({2, P, D}, 6, 0.5f);
  const Tensor r = random_tensor({N, D}, 7);  // L = sum(out * r): dL/dout = r

  // Without prompts: the input gradient equals the full stage backward's.
  auto plain = e.backward(x, r, B, T);
  REQUIRE(plain);
  CHECK_FALSE(plain->grad_prompts.defined());
  stage_activations acts;
  Tensor y = Tensor::empty({N, D}), dx = Tensor::empty({N, D});
  ref.forward(x, B, T, y, &acts);
  ref.backward(acts, r, dx);
  CHECK(max_rel_diff(plain->grad_input, dx) < 1e-4);
  auto loss_plain = [&] { return dot(*e.forward(x, B, T), r); };
  check_direction("input (no prompts)", x, plain->grad_input, loss_plain, 100);

  // With deep prompts: input and prompt gradients by finite differences.
  auto grads = e.backward(x, r, B, T, prompts);
  REQUIRE(grads);
  REQUIRE(grads->grad_prompts.shape() == shape_t{2, P, D});
  auto loss = [&] { return dot(*e.forward(x, B, T, prompts), r); };
  check_direction("input", x, grads->grad_input, loss, 200);
  check_direction("prompts", prompts, grads->grad_prompts, loss, 300);
  // Each block's prompt on its own.
  for (int i = 0; i < 2; ++i) {
    Tensor one = prompts.slice(i, i + 1);
    check_direction("prompt of block " + std::to_string(1 + i), one,
                    grads->grad_prompts.slice(i, i + 1), loss, 400 + static_cast<std::uint64_t>(i));
  }
}

}  // namespace

TEST_CASE("stateless backward gradients match finite differences, deep prompts included") {
  SUBCASE("llama GQA") { check_backward(architecture::llama, 2); }
  SUBCASE("llama MHA") { check_backward(architecture::llama, 4); }
  SUBCASE("gpt2") { check_backward(architecture::gpt2, 4); }
}

TEST_CASE("stateless requests with bad shapes are clear errors") {
  model_dir m(llama_opts());
  const std::int64_t D = m.cfg.hidden_size;
  span_engine e = m.engine(0, 2, 64, {16, 100});
  const Tensor x = random_tensor({2 * 5, D}, 1);
  CHECK(error_of(e.forward(x, 0, 5)) == "batch size and sequence length must be positive, got 0 x 5");
  CHECK(error_of(e.forward(random_tensor({65, D}, 1), 1, 65)) ==
        "sequence of 65 tokens exceeds the model context of 64");
  CHECK(error_of(e.forward(random_tensor({101, D}, 1), 101, 1)) ==
        "101 x 1 = 101 rows exceed this server's limit of 100 rows per request");
  CHECK(error_of(e.forward(x, 2, 4)) == "hidden states have 10 rows, expected 2 x 4 = 8");
  CHECK(error_of(e.forward(random_tensor({10, 8}, 1), 2, 5)) ==
        "hidden states must be [n, 32] (the model's hidden size is 32), got [10, 8]");
  CHECK(error_of(e.forward(x, 2, 5, Tensor::zeros({2, 6, D}))) ==
        "deep prompts must be float [2 blocks, P, 32] on the host with 1 <= P <= 5 (the "
        "sequence length), got f32 [2, 6, 32] on cpu");
  CHECK(code_of(e.forward(x, 2, 5, Tensor::zeros({1, 2, D}))) == span_errc::invalid_argument);
  CHECK(error_of(e.backward(x, random_tensor({2 * 5, 8}, 1), 2, 5)) ==
        "output gradients must be [n, 32] (the model's hidden size is 32), got [10, 8]");
  CHECK(error_of(e.backward(x, random_tensor({8, D}, 1), 2, 5)) ==
        "output gradients are [8, 32], the hidden states [10, 32]");
  CHECK(e.forward(x, 2, 5));
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
