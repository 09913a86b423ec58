// The sampler: greedy, determinism per seed, top-k / top-p limits, and that
// draws follow the softmax distribution.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "model/error.hpp"
#include "model/sampler.hpp"

using namespace corolla;

namespace {

std::vector<float> random_logits(int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

}  // namespace

TEST_CASE("greedy sampling is the argmax") {
  sampler s({}, 100);
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(100, seed);
    std::size_t best = 0;
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l[i] > l[best]) best = i;
    CHECK(s.sample(l) == static_cast<std::int32_t>(best));
  }
  std::vector<float> ties{1.0f, 3.0f, 3.0f, 0.0f};
  sampler t({}, 4);
  CHECK(t.sample(ties) == 1);  // lowest id among ties
}

TEST_CASE("same seed gives the same tokens, another seed other tokens") {
  sampling_params p{1.0f, 0, 1.0f, 42};
  auto run = [&](std::uint64_t seed) {
    p.seed = seed;
    sampler s(p, 50);
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(random_logits(50, static_cast<std::uint64_t>(i % 3))));
    return out;
  };
  CHECK(run(42) == run(42));
  CHECK(run(42) != run(43));
}

TEST_CASE("top-k of 1 and a tiny top-p are greedy") {
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    auto l = random_logits(200, seed + 100);
    std::int32_t greedy = argmax(l);
    sampler k1({1.5f, 1, 1.0f, seed}, 200);
    sampler p0({1.5f, 0, 1e-6f, seed}, 200);
    sampler both({0.7f, 5, 1e-6f, seed}, 200);
    for (int i = 0; i < 20; ++i) {
      CHECK(k1.sample(l) == greedy);
      CHECK(p0.sample(l) == greedy);
      CHECK(both.sample(l) == greedy);
    }
  }
}

TEST_CASE("top-k and top-p only ever pick allowed tokens") {
  // Probabilities at T = 1: 0.5, 0.25, 0.125, 0.0625, 0.0625.
  std::vector<float> l{std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.0625f),
                       std::log(0.0625f)};
  sampler k2({1.0f, 2, 1.0f, 7}, 5);
  sampler p07({1.0f, 0, 0.7f, 7}, 5);  // 0.5 < 0.7 -> keeps {0, 1}
  sampler p08({1.0f, 0, 0.8f, 7}, 5);  // 0.75 < 0.8 -> keeps {0, 1, 2}
  std::map<int, int> seen_k, seen_p7, seen_p8;
  for (int i = 0; i < 2000; ++i) {
    ++seen_k[k2.sample(l)];
    ++seen_p7[p07.sample(l)];
    ++seen_p8[p08.sample(l)];
  }
  CHECK(seen_k.size() == 2);
  CHECK(seen_k.count(0) == 1);
  CHECK(seen_k.count(1) == 1);
  CHECK(seen_p7.size() == 2);
  CHECK(seen_p8.size() == 3);
  CHECK(seen_p8.count(2) == 1);
}

TEST_CASE("sampled frequencies follow the softmax of logits over temperature") {
  std::vector<float> l{2.0f, 1.0f, 0.0f, -1.0f};
  for (float temperature : {1.0f, 0.5f, 2.0f}) {
    sampler s({temperature, 0, 1.0f, 123}, 4);
    const int draws = 40000;
    std::vector<int> count(4, 0);
    for (int i = 0; i < draws; ++i) ++count[static_cast<std::size_t>(s.sample(l))];
    double z = 0;
    for (float x : l) z += std::exp(x / temperature);
    for (std::size_t i = 0; i < 4; ++i) {
      const double expected = std::exp(l[i] / temperature) / z;
      const double sd = std::sqrt(expected * (1 - expected) / draws);
      INFO("temperature " << temperature << " token " << i);
      CHECK(std::abs(count[i] / double(draws) - expected) < 5 * sd + 1e-4);
    }
  }
}

TEST_CASE("invalid sampling parameters are clear errors") {
  CHECK_THROWS_AS(sampler({-1.0f, 0, 1.0f, 0}, 10), model_error);
  CHECK_THROWS_AS(sampler({1.0f, -2, 1.0f, 0}, 10), model_error);
  CHECK_THROWS_AS(sampler({1.0f, 0, 0.0f, 0}, 10), model_error);
  CHECK_THROWS_AS(sampler({1.0f, 0, 1.5f, 0}, 10), model_error);
}

TEST_CASE("NaN or +inf logits are an error, greedy or sampled, and -inf is a masked token") {
  for (float temperature : {0.0f, 0.8f}) {
    CAPTURE(temperature);
    sampler s(sampling_params{.temperature = temperature, .top_k = 0, .top_p = 1.0f, .seed = 1}, 4);
    std::vector<float> logits{0.5f, std::nanf(""), 1.0f, 0.0f};
    CHECK_THROWS_WITH_AS(s.sample(logits), doctest::Contains("logits are not finite (1 of 4 NaN"), model_error);
    logits[1] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_AS(s.sample(logits), model_error);
    logits[1] = -std::numeric_limits<float>::infinity();
    CHECK(s.sample(logits) != 1);  // never the masked token
  }
}
