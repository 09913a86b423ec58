#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "model/error.hpp"

namespace corolla {

std::int32_t argmax(std::span<const float> values) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<std::int32_t>(best);
}

void check_sampling_params(const sampling_params& params) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    throw model_error("temperature must be a finite number >= 0, got " +
                      std::to_string(params.temperature));
  if (params.top_k < 0)
    throw model_error("top-k must be >= 0 (0 = off), got " + std::to_string(params.top_k));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    throw model_error("top-p must be in (0, 1], got " + std::to_string(params.top_p));
}

sampler::sampler(const sampling_params& params, int vocab_size)
    : params_(params), vocab_(vocab_size), rng_(params.seed) {
  check_sampling_params(params);
  if (vocab_size <= 0) throw model_error("sampler needs a positive vocabulary size");
  order_.resize(static_cast<std::size_t>(vocab_size));
  probs_.resize(static_cast<std::size_t>(vocab_size));
}

double sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

std::int32_t sampler::sample(std::span<const float> logits) {
  if (static_cast<int>(logits.size()) != vocab_)
    throw model_error("sampler: " + std::to_string(logits.size()) + " logits for a vocabulary of " +
                      std::to_string(vocab_));
  // NaN (or +inf) logits come from NaN weights or an overflow in reduced
  // precision: every token would be "chosen" as the lowest id, silently.
  // (-inf is a masked token and fine.)
  bool broken = false;
  for (const float v : logits) broken |= std::isnan(v) || v == std::numeric_limits<float>::infinity();
  if (broken) {
    std::size_t nan = 0;
    for (const float v : logits) nan += std::isnan(v) ? 1 : 0;
    throw model_error("the model's logits are not finite (" + std::to_string(nan) + " of " + std::to_string(vocab_) +
                      " NaN, the rest +inf or finite): its weights hold NaN or Inf, or a reduced-precision compute "
                      "overflowed");
  }
  if (params_.temperature == 0.0f) return argmax(logits);

  const float* l = logits.data();
  std::int32_t* ids = order_.data();
  std::size_t n = order_.size();
  std::iota(order_.begin(), order_.end(), 0);

  // Top-k on the raw logits: dividing by a positive temperature keeps the
  // order. Everything tied with the k-th value stays, as in HuggingFace.
  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < n) {
    const auto k = static_cast<std::size_t>(params_.top_k);
    std::nth_element(ids, ids + (k - 1), ids + n,
                     [l](std::int32_t a, std::int32_t b) { return l[a] > l[b]; });
    const float threshold = l[ids[k - 1]];
    std::size_t kept = 0;
    for (std::int32_t i = 0; i < vocab_; ++i)
      if (l[i] >= threshold) ids[kept++] = i;  // id order: independent of nth_element's
    n = kept;
  }

  const bool nucleus = params_.top_p < 1.0f;
  if (nucleus)
    std::sort(ids, ids + n, [l](std::int32_t a, std::int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    });

  // Softmax of logits / temperature over the candidates (unnormalised).
  const double inv_t = 1.0 / static_cast<double>(params_.temperature);
  float max_logit = l[ids[0]];
  for (std::size_t j = 1; j < n; ++j) max_logit = std::max(max_logit, l[ids[j]]);
  double total = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double diff = static_cast<double>(l[ids[j]]) - max_logit;  // <= 0
    // diff == 0 is kept apart: 0 * inv_t would be NaN for a tiny temperature.
    probs_[j] = diff == 0.0 ? 1.0f : static_cast<float>(std::exp(diff * inv_t));
    total += probs_[j];
  }

  // Top-p: keep the most probable tokens while the mass before them is
  // below top_p (HF removes tokens whose ascending cumulative probability is
  // <= 1 - top_p; the first token always stays).
  if (nucleus) {
    const double limit = static_cast<double>(params_.top_p) * total;
    double before = 0.0;
    std::size_t kept = 0;
    while (kept < n && (kept == 0 || before < limit)) before += probs_[kept++];
    n = kept;
    total = before;
  }

  double u = uniform() * total;
  for (std::size_t j = 0; j < n; ++j) {
    u -= probs_[j];
    if (u < 0.0) return ids[j];
  }
  return ids[n - 1];  // rounding left a sliver of mass past the end
}

}  // namespace corolla
