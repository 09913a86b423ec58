// Joining a training job in-process: a rank whose join reaches the
// coordinator's node before the coordinator's mailbox is published there
// (ranks started before rank 0, torchrun style) must still join.
#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/train_job.hpp"
#include "model/config.hpp"
#include "model/token_data.hpp"
#include "model/transformer.hpp"
#include "tests/support/tiny_model.hpp"

namespace corolla {
namespace {

std::unique_ptr<node> start_local_node() {
  node_options n;
  n.listen = "tcp://127.0.0.1:0";
  n.scheduler_threads = 1;
  n.publish_echo = false;
  auto started = node::start(std::move(n));
  REQUIRE_MESSAGE(started, error_message(started));
  return std::move(*started);
}

}  // namespace

TEST_CASE("a rank whose join arrives before the coordinator is published still joins") {
  testing::temp_dir_guard dir("train-join");
  testing::write_tiny_model(dir / "model", {});
  const model_config cfg = load_config(dir / "model");
  dist_train_options o;
  o.layout = even_layout(cfg.n_layers, 1, 1);
  o.batch = 1;
  o.seq = 8;
  o.steps = 1;
  o.timeout = std::chrono::seconds(20);

  auto coord = start_local_node();  // listening, but nothing published yet
  auto rank_node = start_local_node();
  transformer model = transformer::init(cfg, 1, cpu_backend());
  rank_weights weights = weights_of(model);
  std::vector<std::int32_t> tokens(64);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i % 50);
  token_dataset data = token_dataset::from_tokens(tokens, cfg.vocab_size);

  std::exception_ptr rank_error;
  std::thread rank([&] {
    try {
      run_train_rank(*rank_node, o, 0, coord->endpoint(), weights, data);
    } catch (...) {
      rank_error = std::current_exception();
    }
  });
  // The rank connects and sends its join at once; the coordinator's
  // mailbox appears only now.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  int steps = 0;
  CHECK_NOTHROW(run_train_coordinator(*coord, o, cfg, [&](const dist_step_report&) { ++steps; }));
  rank.join();
  rank_node->stop();
  coord->stop();
  if (rank_error) std::rethrow_exception(rank_error);
  CHECK(steps == 1);
}

}  // namespace corolla
