// schedule/spot_check: which steps are checked, the tolerance, the distance
// of two answers, and the majority verdict.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "schedule/spot_check.hpp"

using namespace corolla::swarm;

TEST_CASE("spot checks cover every step of a server on probation and a fraction after") {
  spot_check_policy p;
  p.fraction = 0.25;
  p.probation_steps = 3;
  CHECK(should_check(p, 0, 0.99));
  CHECK(should_check(p, 2, 0.99));
  CHECK_FALSE(should_check(p, 3, 0.99));
  CHECK(should_check(p, 3, 0.2));
  CHECK_FALSE(should_check(p, 100, 0.25));
  p.fraction = 0;
  p.probation_steps = 0;
  CHECK_FALSE(should_check(p, 0, 0.0));
  p.fraction = 1;
  CHECK(should_check(p, 50, 0.999));
}

TEST_CASE("the tolerance grows with quantised weights and compressed hidden states") {
  CHECK(spot_check_tolerance("f32", false) == spot_check_tolerance("bf16", false));
  CHECK(spot_check_tolerance("nf4", false) > spot_check_tolerance("f32", false));
  CHECK(spot_check_tolerance("i8", false) == spot_check_tolerance("nf4", false));
  CHECK(spot_check_tolerance("f32", true) > spot_check_tolerance("f32", false));
  CHECK(spot_check_tolerance("f32", false) < 0.1);
}

TEST_CASE("relative difference is per row, symmetric, and infinite for non-finite values") {
  const std::vector<float> a{1, 0, 0, 100, 0, 0};
  std::vector<float> b = a;
  CHECK(relative_difference(a.data(), b.data(), 2, 3) == 0.0);
  b[0] = 1.1f;  // 10 % off in the small row: the large row does not hide it
  CHECK(relative_difference(a.data(), b.data(), 2, 3) == doctest::Approx(0.1 / 1.1).epsilon(1e-6));
  CHECK(relative_difference(a.data(), b.data(), 2, 3) == relative_difference(b.data(), a.data(), 2, 3));
  const std::vector<float> zeros(6, 0.0f);
  CHECK(relative_difference(zeros.data(), zeros.data(), 2, 3) == 0.0);
  b[4] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isinf(relative_difference(a.data(), b.data(), 2, 3)));
  CHECK(std::isinf(relative_difference(b.data(), a.data(), 2, 3)));
}

TEST_CASE("the majority decides who is wrong, and two servers alone decide nothing") {
  // All agree.
  auto v = judge({{true, true}, {true, true}});
  CHECK(v.decided);
  CHECK(v.wrong.empty());
  // Two disagree, nobody else: undecided.
  v = judge({{true, false}, {false, true}});
  CHECK_FALSE(v.decided);
  // The checked server (0) against two checkers that agree: 0 is wrong.
  v = judge({{true, false, false}, {false, true, true}, {false, true, true}});
  CHECK(v.decided);
  CHECK(v.wrong == std::vector<std::size_t>{0});
  // A wrong checker (1) is outvoted by the server and the second checker.
  v = judge({{true, false, true}, {false, true, false}, {true, false, true}});
  CHECK(v.decided);
  CHECK(v.wrong == std::vector<std::size_t>{1});
  // Three answers all different: nothing is decided.
  v = judge({{true, false, false}, {false, true, false}, {false, false, true}});
  CHECK_FALSE(v.decided);
  // Four opinions, two against two: no strict majority.
  v = judge({{true, true, false, false}, {true, true, false, false}, {false, false, true, true},
             {false, false, true, true}});
  CHECK_FALSE(v.decided);
  CHECK_FALSE(judge({}).decided);
}
