#include "model/generator.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "model/error.hpp"

namespace corolla {
namespace {

constexpr int kPageTokens = 16;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Enough pages of `kv` elements for one sequence of the whole context.
std::size_t context_budget(const model_config& cfg, dtype kv) {
  const std::size_t pages =
      static_cast<std::size_t>((cfg.max_positions + kPageTokens - 1) / kPageTokens);
  return pages * kPageTokens * kv_pool::token_bytes(cfg.n_layers, std::int64_t{cfg.n_kv_heads} * cfg.head_dim, kv);
}

/// `kv` if it is a KV-cache element type, else a model_error.
dtype checked_kv(dtype kv) {
  if (!is_float_dtype(kv))
    throw model_error(std::string("generator: the KV cache is f32, bf16 or f16, not ") + dtype_name(kv));
  return kv;
}

}  // namespace

generator::generator(transformer& model, std::size_t kv_budget_bytes, dtype kv, bare)
    : cfg_(model.config()),
      be_(&model.backend()),
      head_(cfg_, model.head(), model.backend()),
      stage_(model.decoding_stage()),
      pool_(std::make_shared<kv_pool>(kv_budget_bytes ? kv_budget_bytes : context_budget(cfg_, kv),
                                      cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, kPageTokens,
                                      &model.backend(), checked_kv(kv))),
      hidden_(cfg_.hidden_size) {
  logits_ = be_->empty({1, cfg_.vocab_size});
  host_logits_ = be_->dev().kind == device_kind::cpu ? logits_
                                                      : Tensor::empty({1, cfg_.vocab_size});
}

generator::generator(transformer& model, std::size_t kv_budget_bytes, weight_format weights, dtype kv)
    : generator(model, kv_budget_bytes, kv, bare{}) {
  model.require_decoding_format(weights);
  stage_.use_inference_weights(weights);
  head_.use_inference_weights(weights);
}

generator::generator(transformer& model, const generator& weights_of, std::size_t kv_budget_bytes, dtype kv)
    : generator(model, kv_budget_bytes, kv, bare{}) {
  stage_.share_inference_weights(weights_of.stage_);
  head_.share_inference_weights(weights_of.head_);
}

void generator::step(std::span<const std::int32_t> ids, std::int64_t start, kv_sequence& kv) {
  const auto T = static_cast<std::int64_t>(ids.size());
  if (kv_reservation r = kv.reserve(start + T); !r) throw model_error(r.error);
  // ids and positions stay on the host (model/workspace.hpp)
  Tensor& id_rows = ids_.rows(cpu_backend(), T);
  copy_i32(ids, id_rows);
  Tensor& pos = positions_.rows(cpu_backend(), T);
  fill_positions(pos, start);
  Tensor& x = hidden_.rows(*be_, T);
  auto forward = [&] {
    head_.embed(id_rows, pos, x);
    stage_.forward_cached(x, kv, start, x);
    // Only the last row's logits are needed; a decode step has just that row.
    if (T == 1) {
      head_.logits(x, logits_, nullptr);
    } else {
      Tensor last = x.slice(T - 1, T);
      head_.logits(last, logits_, nullptr);
    }
  };
  if (T == 1 && stage_.steps_recordable()) {
    // A decode step (or a prompt's one-row last piece): the same ops every
    // step, submitted as one where the backend records and replays them (a
    // CUDA graph). Repeatable, as run_step requires: the embedding rewrites
    // x, the cache row is claimed again at the same position.
    // (Passed as a one-reference lambda, which std::function keeps without
    // allocating: a warm decode step allocates nothing.)
    be_->run_step(decode_step_, [&forward] { forward(); });
  } else {
    forward();
  }
  if (host_logits_.raw() != logits_.raw()) {  // a device backend: bring them home
    be_->copy(logits_, host_logits_);
    be_->synchronize();
  }
}

void generator::set_deep_prompts(const Tensor& prompts) {
  if (!prompts.defined()) {
    prompts_ = Tensor();
    return;
  }
  const shape_t& s = prompts.shape();
  if (prompts.type() != dtype::f32 || s.size() != 3 || s[0] != cfg_.n_layers || s[2] != cfg_.hidden_size ||
      s[1] < 1)
    throw model_error("deep prompts must be f32 [" + std::to_string(cfg_.n_layers) + ", P, " +
                      std::to_string(cfg_.hidden_size) + "] (P >= 1), got " + dtype_name(prompts.type()) + " " +
                      shape_str(s));
  if (s[1] >= cfg_.max_positions)
    throw model_error("deep prompts of " + std::to_string(s[1]) + " positions leave no room in the model context of " +
                      std::to_string(cfg_.max_positions));
  prompts_ = be_->empty(s);
  be_->copy(prompts, prompts_);
}

void generator::prefix(kv_sequence& kv) {
  const std::int64_t P = prompts_.dim(1), D = cfg_.hidden_size;
  if (kv_reservation r = kv.reserve(P); !r) throw model_error(r.error);
  Tensor& x = hidden_.rows(*be_, P);
  x.zero();
  for (int i = 0; i < stage_.size(); ++i) {
    be_->add(x, prompts_.slice(i, i + 1).view({P, D}), x);  // prompt i at the input of block i
    stage_.forward_cached(x, kv, 0, x, i, i + 1);
  }
}

generation_result generator::generate(std::span<const std::int32_t> prompt,
                                      const generation_params& p,
                                      const token_callback& on_token) {
  kv_sequence kv(pool_);
  bool reserved = false;
  const std::int64_t P = prefix_length();
  // The tokens see a context shortened by the prefix positions.
  model_config token_cfg = cfg_;
  token_cfg.max_positions = static_cast<int>(cfg_.max_positions - P);
  return generate_tokens(
      token_cfg, prompt, p,
      [&](std::span<const std::int32_t> ids, std::int64_t start) {
        if (!reserved) {
          stage_.reserve_rows(std::max<std::int64_t>(static_cast<std::int64_t>(ids.size()), P));
          if (P > 0) prefix(kv);
          reserved = true;
        }
        step(ids, P + start, kv);
        return std::span<const float>(host_logits_.data<float>(), static_cast<std::size_t>(cfg_.vocab_size));
      },
      on_token);
}

generation_result generate_tokens(const model_config& cfg, std::span<const std::int32_t> prompt,
                                  const generation_params& p, const logits_step& step,
                                  const token_callback& on_token) {
  const auto start_time = std::chrono::steady_clock::now();
  const int V = cfg.vocab_size, P = cfg.max_positions;
  if (prompt.empty()) throw model_error("the prompt is empty: give at least one token");
  for (std::int32_t id : prompt)
    if (id < 0 || id >= V)
      throw model_error("prompt id " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(V) + " tokens)");
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n > P)
    throw model_error("prompt of " + std::to_string(n) + " tokens exceeds the model context of " +
                      std::to_string(P));
  if (p.max_new_tokens < 0)
    throw model_error("max new tokens must be >= 0, got " + std::to_string(p.max_new_tokens));
  if (p.prefill_chunk < 0)
    throw model_error("prefill chunk must be >= 0, got " + std::to_string(p.prefill_chunk));
  sampler pick(p.sampling, V);
  const int eos = p.eos_id >= 0 ? p.eos_id : cfg.eos_token_id;

  generation_result result;
  result.prompt_tokens = static_cast<int>(n);
  if (p.max_new_tokens == 0) return result;
  if (n == P) {
    result.reason = stop_reason::context;
    return result;
  }
  result.tokens.reserve(static_cast<std::size_t>(std::min<std::int64_t>(p.max_new_tokens, P - n)));

  const std::int64_t chunk = p.prefill_chunk > 0 ? std::min<std::int64_t>(p.prefill_chunk, n) : n;
  std::span<const float> logits;
  for (std::int64_t s = 0; s < n; s += chunk)
    logits = step(prompt.subspan(static_cast<std::size_t>(s), static_cast<std::size_t>(std::min(chunk, n - s))), s);
  std::int32_t token = pick.sample(logits);
  result.tokens.push_back(token);
  result.prefill_seconds = seconds_since(start_time);
  if (on_token) on_token(token);
  // The model's own end (no eos_id given) is any of its end-of-sequence ids.
  const std::vector<int> no_more_ids;
  const std::vector<int>& model_ends = p.eos_id >= 0 ? no_more_ids : cfg.eos_token_ids;
  const auto ends = [&](std::int32_t t) {
    return !p.ignore_eos && (t == eos || std::find(p.stop_ids.begin(), p.stop_ids.end(), t) != p.stop_ids.end() ||
                             std::find(model_ends.begin(), model_ends.end(), t) != model_ends.end());
  };

  const auto decode_start = std::chrono::steady_clock::now();
  for (;;) {
    const auto generated = static_cast<std::int64_t>(result.tokens.size());
    if (ends(token)) {
      result.reason = stop_reason::eos;
      break;
    }
    if (p.should_stop && p.should_stop()) {
      result.reason = stop_reason::caller;
      break;
    }
    if (generated >= p.max_new_tokens) {
      result.reason = stop_reason::max_tokens;
      break;
    }
    if (n + generated >= P) {
      result.reason = stop_reason::context;
      break;
    }
    // The last token sits at position n + generated - 1.
    token = pick.sample(step({&token, 1}, n + generated - 1));
    result.tokens.push_back(token);
    ++result.decode_steps;
    if (on_token) on_token(token);
  }
  result.decode_seconds = seconds_since(decode_start);
  return result;
}

}  // namespace corolla
