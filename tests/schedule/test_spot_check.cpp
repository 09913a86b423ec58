// schedule/spot_check: which steps are checked, the tolerance, the distance
// of two answers (row by row, with routing near ties excused), and the
// majority verdict.
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

TEST_CASE("rows compared one by one: a routing near tie reported by a checker excuses its row, nothing else does") {
  // Three rows of width 2; row 1 differs by 50 %, as a mixture of experts
  // routing it to another expert would.
  const std::vector<float> a{1, 0, 0, 2, 3, 4};
  std::vector<float> b = a;
  b[3] = 1.0f;
  const double tol = 0.04;
  row_comparison c = compare_rows(a.data(), b.data(), 3, 2, tol);
  CHECK_FALSE(c.agree);
  CHECK(c.worst == doctest::Approx(0.5));
  CHECK(c.excused == 0);
  // The checker saw row 1's routing at a near tie (a gap of 0.1 % of its
  // logits' spread): the row is excused, the others still compared.
  const double tie = routing_tie(tol);
  CHECK(tie > 0);
  CHECK(tie < tol);
  const std::vector<float> margins{0.5f, 0.001f, 0.3f};
  c = compare_rows(a.data(), b.data(), 3, 2, tol, margins, tie);
  CHECK(c.agree);
  CHECK(c.excused == 1);
  CHECK(c.worst == 0.0);
  // A clear margin on the row excuses nothing.
  const std::vector<float> clear{0.5f, 0.2f, 0.3f};
  c = compare_rows(a.data(), b.data(), 3, 2, tol, clear, tie);
  CHECK_FALSE(c.agree);
  CHECK(c.excused == 0);
  // A near tie on another row does not excuse this one.
  const std::vector<float> elsewhere{0.001f, 0.2f, 0.001f};
  CHECK_FALSE(compare_rows(a.data(), b.data(), 3, 2, tol, elsewhere, tie).agree);
  // Rows within the tolerance agree whatever their margins, and count in worst.
  b = a;
  b[4] = 3.03f;
  c = compare_rows(a.data(), b.data(), 3, 2, tol, margins, tie);
  CHECK(c.agree);
  CHECK(c.excused == 0);
  CHECK(c.worst == doctest::Approx(relative_difference(a.data(), b.data(), 3, 2)));
  // A NaN is never excused.
  b[2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> all_ties{0.0f, 0.0f, 0.0f};
  c = compare_rows(a.data(), b.data(), 3, 2, tol, all_ties, tie);
  CHECK_FALSE(c.agree);
  CHECK(std::isinf(c.worst));
}

TEST_CASE("a row routed apart moves the later rows of its sequence: they are excused too, but not another sequence's") {
  // Four rows of width 2 in two sequences of two; rows 0 and 1 differ,
  // row 0 at a near tie (a flip), row 1 with a clear margin (it attends to
  // row 0); row 3 differs with a clear margin, in the other sequence.
  const std::vector<float> a{1, 0, 0, 2, 3, 4, 5, 6};
  std::vector<float> b = a;
  b[0] = 0.0f;
  b[1] = 1.0f;
  b[3] = 1.0f;
  const double tol = 0.04, tie = routing_tie(tol);
  const std::vector<float> margins{0.001f, 0.3f, 0.3f, 0.3f};
  row_comparison c = compare_rows(a.data(), b.data(), 2, 2, tol, margins, tie);
  CHECK(c.agree);
  CHECK(c.excused == 2);
  b[7] = 1.0f;  // row 3 differs, in the second sequence
  CHECK(compare_rows(a.data(), b.data(), 4, 2, tol, margins, tie).agree);  // one sequence of four
  c = compare_rows(a.data(), b.data(), 4, 2, tol, margins, tie, 2);     // two of two
  CHECK_FALSE(c.agree);
  CHECK(c.excused == 2);
  // Without the tie, nothing is excused; a flip before these rows (their
  // earlier rows routed apart) excuses the first sequence's from the start.
  const std::vector<float> clear{0.3f, 0.3f, 0.3f, 0.3f};
  CHECK_FALSE(compare_rows(a.data(), b.data(), 2, 2, tol, clear, tie).agree);
  c = compare_rows(a.data(), b.data(), 2, 2, tol, clear, tie, 0, true);
  CHECK(c.agree);
  CHECK(c.excused == 2);
  CHECK_FALSE(compare_rows(a.data(), b.data(), 4, 2, tol, clear, tie, 2, true).agree);  // not the second sequence
}

TEST_CASE("earlier rows were routed apart where they differ from a near tie on, and differ where no tie explains it") {
  const std::vector<float> a{1, 0, 0, 2, 3, 4};
  std::vector<float> b = a;
  const double tol = 0.04, tie = routing_tie(tol);
  const std::vector<float> tied{0.5f, 0.001f, 0.5f}, clear{0.5f, 0.5f, 0.5f};
  using E = earlier_rows;
  CHECK(compare_earlier_rows(a.data(), b.data(), 3, 2, tol, tied, tie) == E::same);  // a tie, the same rows
  CHECK(compare_earlier_rows(a.data(), nullptr, 3, 2, tol, tied, tie) == E::routed_apart);  // the other unknown
  CHECK(compare_earlier_rows(a.data(), nullptr, 3, 2, tol, clear, tie) == E::same);
  b[3] = 1.0f;  // row 1 differs
  CHECK(compare_earlier_rows(a.data(), b.data(), 3, 2, tol, tied, tie) == E::routed_apart);  // at its tie
  b[5] = 1.0f;  // row 2 too, after it: moved by it
  CHECK(compare_earlier_rows(a.data(), b.data(), 3, 2, tol, tied, tie) == E::routed_apart);
  CHECK(compare_earlier_rows(a.data(), b.data(), 3, 2, tol, clear, tie) == E::differ);  // no tie explains it
  b = a;
  b[0] = 0.0f;  // row 0 differs with a clear margin, before the tie: a wrong answer then
  CHECK(compare_earlier_rows(a.data(), b.data(), 3, 2, tol, tied, tie) == E::differ);
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
