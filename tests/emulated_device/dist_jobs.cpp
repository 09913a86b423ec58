#include "tests/emulated_device/dist_jobs.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "actors/errors.hpp"
#include "kernels/backend.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "model/whole_file.hpp"

namespace corolla::testing {

std::unique_ptr<node> start_local_node() {
  node_options n;
  n.listen = "tcp://127.0.0.1:0";
  n.scheduler_threads = 1;
  n.publish_echo = false;
  n.peer_timeout = std::chrono::seconds(30);
  auto started = node::start(std::move(n));
  REQUIRE_MESSAGE(started, error_message(started));
  return std::move(*started);
}

job_result run_job(const dist_train_options& o, const model_config& cfg, const std::vector<std::int32_t>& tokens,
                   bool on_devices) {
  job_result out;
  const int world = o.layout.world();
  auto coord = start_local_node();
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<std::unique_ptr<transformer>> models;
  std::vector<rank_weights> weights;
  std::vector<token_dataset> data;
  for (int r = 0; r < world; ++r) {
    nodes.push_back(start_local_node());
    models.push_back(std::make_unique<transformer>(transformer::init(cfg, 7, cpu_backend())));
    weights.push_back(weights_of(*models.back()));
    data.push_back(token_dataset::from_tokens(tokens, cfg.vocab_size));
    if (on_devices) out.devices.push_back(std::make_unique<emulated_device_backend>(r));
  }
  std::exception_ptr coord_error;
  std::thread coordinator([&] {
    try {
      run_train_coordinator(*coord, o, cfg, [&](const dist_step_report& r) { out.steps.push_back(r); });
    } catch (...) {
      coord_error = std::current_exception();
    }
  });
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        run_train_rank(*nodes[i], o, r, coord->endpoint(), weights[i], data[i],
                       on_devices ? out.devices[i].get() : nullptr);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (std::thread& t : ranks) t.join();
  coordinator.join();
  for (auto& n : nodes) n->stop();
  coord->stop();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  if (coord_error) std::rethrow_exception(coord_error);
  return out;
}

void check_same_steps(const job_result& a, const job_result& b) {
  REQUIRE(b.steps.size() == a.steps.size());
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    INFO("step " << a.steps[s].step << ": loss " << a.steps[s].loss << ", then " << b.steps[s].loss);
    CHECK(b.steps[s].step == a.steps[s].step);
    CHECK(b.steps[s].loss == a.steps[s].loss);
    CHECK(b.steps[s].grad_norm == a.steps[s].grad_norm);
  }
}

void check_close_steps(const job_result& a, const job_result& b, double rel) {
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    INFO("step " << a.steps[s].step << ": loss " << a.steps[s].loss << ", then " << b.steps[s].loss);
    CHECK(std::abs(a.steps[s].loss - b.steps[s].loss) <= rel * std::abs(a.steps[s].loss));
    CHECK(std::abs(a.steps[s].grad_norm - b.steps[s].grad_norm) <= rel * std::abs(a.steps[s].grad_norm) + 1e-12);
  }
}

void check_resume_matches(dist_train_options o, const model_config& cfg, const std::vector<std::int32_t>& tokens,
                          const std::filesystem::path& dir,
                          const std::function<void(dist_train_options&)>& resumed_with) {
  const int steps = o.steps;
  REQUIRE(steps >= 2);
  o.save_dir = dir / "straight";
  const job_result straight = run_job(o, cfg, tokens, true);

  o.save_dir.clear();
  o.checkpoint_dir = dir / "ckpt";
  o.checkpoint_every = steps / 2;
  o.steps = steps / 2;
  run_job(o, cfg, tokens, true);
  o.steps = steps;
  o.resume = true;
  o.save_dir = dir / "resumed";
  if (resumed_with) resumed_with(o);
  const job_result resumed = run_job(o, cfg, tokens, true);
  REQUIRE(resumed.steps.size() == static_cast<std::size_t>(steps - steps / 2));
  CHECK(resumed.steps.back().loss == straight.steps.back().loss);
  CHECK(read_whole_file(dir / "resumed" / "model.safetensors") == read_whole_file(dir / "straight" / "model.safetensors"));
}

dist_train_options job(const model_config& cfg, int pp, int dp, int steps) {
  dist_train_options o;
  o.layout = even_layout(cfg.n_layers, pp, dp);
  o.batch = 4;
  o.seq = 16;
  o.steps = steps;
  o.optimizer.adamw.lr = 3e-3f;
  o.optimizer.adamw.weight_decay = 0.1f;
  o.timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace corolla::testing
