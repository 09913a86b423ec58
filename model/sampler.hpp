// model/sampler.hpp — picking the next token from logits.
//
// Greedy (argmax) when temperature is 0. Otherwise the HuggingFace order of
// logits warpers: divide by the temperature, keep the top-k logits (ties with
// the k-th kept, as TopKLogitsWarper does), keep the smallest set of most
// probable tokens whose probability reaches top-p (TopPLogitsWarper: at least
// one token), then draw from the softmax of what is left.
//
// Draws come from a std::mt19937_64 seeded once, turned into uniforms by our
// own bit arithmetic (not std::uniform_real_distribution, whose algorithm the
// standard leaves open), so a seed gives the same tokens on every platform.
// Buffers are sized once for the vocabulary: sampling allocates nothing.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace corolla {

/// How to sample. The defaults are greedy decoding.
struct sampling_params {
  float temperature = 0.0f;  ///< 0 = greedy; otherwise > 0
  int top_k = 0;             ///< 0 = no top-k filter
  float top_p = 1.0f;        ///< 1 = no nucleus filter; in (0, 1]
  std::uint64_t seed = 0;
};

/// Throws model_error naming the setting when `params` cannot sample:
/// temperature not finite or < 0, top-k < 0, top-p outside (0, 1]. The
/// sampler checks this too; a command checks it before long work.
void check_sampling_params(const sampling_params& params);

/// Picks tokens from logits by sampling_params; owns its random stream.
/// Not thread-safe: one sampler per generation.
class sampler {
 public:
  /// A sampler for logits over `vocab_size` tokens. Throws model_error for a
  /// negative or non-finite temperature, a negative top_k, or top_p outside
  /// (0, 1].
  sampler(const sampling_params& params, int vocab_size);

  /// The next token for `logits` (vocab_size values). Greedy ties go to the
  /// lowest id. Throws model_error when a logit is NaN or +inf (NaN
  /// weights, an overflow): no token can be chosen from them.
  std::int32_t sample(std::span<const float> logits);

  /// Restarts the random stream from `seed`.
  void reseed(std::uint64_t seed) { rng_.seed(seed); }
  /// The parameters given at construction.
  const sampling_params& params() const { return params_; }

 private:
  /// A uniform double in [0, 1) from 53 random bits.
  double uniform();

  sampling_params params_;
  int vocab_;
  std::mt19937_64 rng_;
  std::vector<std::int32_t> order_;  ///< candidate ids, most probable first
  std::vector<float> probs_;         ///< their (unnormalised) probabilities
};

/// Index of the largest value (the lowest index among ties).
std::int32_t argmax(std::span<const float> values);

}  // namespace corolla
