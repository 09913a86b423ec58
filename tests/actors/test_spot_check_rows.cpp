// A fine-tuning backward's answer as the rows a spot check compares
// (actors/swarm_finetune.hpp, spot_check_rows): every gradient is in them,
// each starting a row of its own, so an answer wrong only in the adapter's
// small gradients is told apart from a right one beside large input
// gradients.
#include <doctest/doctest.h>

#include <vector>

#include "actors/swarm_finetune.hpp"
#include "schedule/spot_check.hpp"

using namespace corolla;

TEST_CASE("spot check rows hold every gradient of a backward's answer, each tensor from a row of its own") {
  const std::int64_t D = 4;
  const Tensor input = Tensor::from_f32(std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}, {2, D});
  const Tensor prompts = Tensor::from_f32(std::vector<float>{9, 10, 11, 12, 13, 14}, {1, 1, 6});  // 6 values: a row and a half
  const Tensor lora = Tensor::from_f32(std::vector<float>{1e-3f, 2e-3f, 3e-3f}, {3});
  const Tensor rows = spot_check_rows({input, prompts, lora});
  REQUIRE(rows.shape() == shape_t{2 + 2 + 1, D});
  CHECK(rows.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8,           // the input gradient
                                               9, 10, 11, 12, 13, 14, 0, 0,      // the prompts', padded
                                               1e-3f, 2e-3f, 3e-3f, 0});         // the adapter's, padded

  // An answer whose adapter gradients alone are wrong (a tenth of each
  // value off: small next to the input gradients' values) disagrees.
  const double tol = swarm::spot_check_tolerance("f32", false);
  const auto agree = [&](const Tensor& other) {
    const Tensor theirs = spot_check_rows({input, prompts, other});
    return swarm::compare_rows(rows.data<float>(), theirs.data<float>(), 5, D, tol, {}, 0.0, 0, false).agree;
  };
  CHECK(agree(lora.clone()));
  CHECK_FALSE(agree(Tensor::from_f32(std::vector<float>{1.1e-3f, 2.2e-3f, 3.3e-3f}, {3})));
  CHECK(agree(Tensor::from_f32(std::vector<float>{1.00001e-3f, 2e-3f, 3e-3f}, {3})));  // rounding stays within
}
