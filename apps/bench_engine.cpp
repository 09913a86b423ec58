// apps/bench_engine.cpp — see bench_engine.hpp.
#include "apps/bench_engine.hpp"

#include <chrono>
#include <random>
#include <stdexcept>

namespace corolla::app {

stage served_blocks(std::optional<transformer>& model, weight_format weights, Backend& be) {
  const model_config cfg = model->config();
  stage blocks = weights == weight_format::f32 ? stage(cfg, 0, model->blocks(), be)
                                               : stage::inference_of(cfg, 0, model->blocks(), be, weights);
  if (weights != weight_format::f32) model.reset();
  return blocks;
}

Tensor random_rows(std::int64_t n, std::int64_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n * d));
  for (float& x : v) x = u(rng);
  return Tensor::from_f32(v, {n, d});
}

double engine_decode_tokens_per_s(span_engine& e, int sessions, const Tensor& prompt, const Tensor& row,
                                  int new_tokens, const std::string& tag, const std::vector<std::string>& adapters) {
  const std::int64_t P = prompt.dim(0);
  std::vector<decode_item> items;
  for (int s = 0; s < sessions; ++s) {
    const std::string id = "direct-" + tag + "-" + std::to_string(s);
    const std::string adapter = adapters.empty() ? std::string() : adapters.at(static_cast<std::size_t>(s));
    if (auto r = e.open_session(id, P + new_tokens + 2, -1, -1, {}, adapter); !r)
      throw std::runtime_error(r.error().message);
    if (auto r = e.inference_step(id, prompt, 0); !r) throw std::runtime_error(r.error().message);
    items.push_back({id, row, P, 0});
  }
  // As the server does: one session alone takes the single-sequence path.
  auto batch = [&] {
    if (items.size() == 1) {
      if (auto r = e.inference_step(items[0].session_id, row, items[0].start_position); !r)
        throw std::runtime_error("engine step: " + r.error().message);
    } else {
      for (const auto& r : e.decode_batch(items))
        if (!r) throw std::runtime_error("engine step: " + r.error().message);
    }
    for (auto& it : items) ++it.start_position;
  };
  batch();
  batch();
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < new_tokens; ++t) batch();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& it : items) (void)e.close_session(it.session_id);
  return sessions * new_tokens / wall;
}

}  // namespace corolla::app
