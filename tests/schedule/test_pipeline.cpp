// Pipeline schedules as instruction lists, checked without running anything.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "schedule/cost_model.hpp"
#include "schedule/pipeline.hpp"

using namespace corolla::schedule;

namespace {

/// The forwards and backwards of a stage's list, in order: +k for the
/// forward of micro-batch k, -(k+1) for its backward.
std::vector<int> compute_order(const std::vector<instruction>& prog) {
  std::vector<int> out;
  for (const auto& ins : prog) {
    if (ins.op == pipeline_op::forward) out.push_back(ins.micro_batch);
    if (ins.op == pipeline_op::backward) out.push_back(-(ins.micro_batch + 1));
  }
  return out;
}

}  // namespace

TEST_CASE("1F1B: warm-up forwards, then one forward one backward, then cool-down backwards") {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      pipeline_schedule s = make_1f1b(p, m);
      REQUIRE(s.programs.size() == static_cast<std::size_t>(p));
      for (int i = 0; i < p; ++i) {
        CAPTURE(i);
        int warmup = std::min(p - i - 1, m);
        std::vector<int> expected;
        for (int k = 0; k < warmup; ++k) expected.push_back(k);
        for (int k = 0; k < m - warmup; ++k) {
          expected.push_back(warmup + k);
          expected.push_back(-(k + 1));
        }
        for (int k = m - warmup; k < m; ++k) expected.push_back(-(k + 1));
        CHECK(compute_order(s.programs[i]) == expected);
      }
    }
}

TEST_CASE("1F1B lists carry loads, sends, receives, bucket reductions and the optimizer step") {
  pipeline_schedule s = make_1f1b(3, 4, {2, 1, 3});
  const auto& first = s.programs[0];
  const auto& mid = s.programs[1];
  const auto& last = s.programs[2];
  // Stage 0 loads inputs; the last stage loads targets; the middle stage neither.
  auto count = [](const std::vector<instruction>& prog, pipeline_op op) {
    return std::count_if(prog.begin(), prog.end(), [&](const instruction& i) { return i.op == op; });
  };
  CHECK(count(first, pipeline_op::load_micro_batch) == 4);
  CHECK(count(mid, pipeline_op::load_micro_batch) == 0);
  CHECK(count(last, pipeline_op::load_micro_batch) == 4);
  CHECK(count(first, pipeline_op::recv_act) == 0);
  CHECK(count(first, pipeline_op::send_grad) == 0);
  CHECK(count(last, pipeline_op::send_act) == 0);
  CHECK(count(last, pipeline_op::recv_grad) == 0);
  CHECK(count(mid, pipeline_op::send_act) == 4);
  CHECK(count(mid, pipeline_op::recv_grad) == 4);
  // Exact head of stage 1's list: receive, forward, send.
  REQUIRE(mid.size() > 3);
  CHECK(mid[0] == instruction{pipeline_op::recv_act, 0, 0, 0});
  CHECK(mid[1] == instruction{pipeline_op::forward, 0, 0, -1});
  CHECK(mid[2] == instruction{pipeline_op::send_act, 0, 0, 2});
  CHECK(describe(mid[2]) == "send_act mb 0 -> 2");
  // Buckets right after the last backward, then the optimizer step.
  CHECK(first.back().op == pipeline_op::optimizer_step);
  CHECK(count(first, pipeline_op::reduce_grads) == 2);
  CHECK(count(last, pipeline_op::reduce_grads) == 3);
  auto last_backward = std::find_if(first.rbegin(), first.rend(),
                                    [](const instruction& i) { return i.op == pipeline_op::backward; });
  CHECK(last_backward->micro_batch == 3);
  CHECK(describe(first[first.size() - 3]) == "reduce_grads bucket 0");
  CHECK(first[first.size() - 2].bucket == 1);
  CHECK_THROWS_AS(make_1f1b(0, 4), std::invalid_argument);
  CHECK_THROWS_AS(make_1f1b(3, 4, {1, 1}), std::invalid_argument);
}

TEST_CASE("1F1B never deadlocks and stage i holds at most p - i micro-batches") {
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      pipeline_schedule s = make_1f1b(p, m);
      simulation r = simulate(s, uniform_pipeline_costs(p, 1.0, 2.0, 0.25));
      CHECK(r.problem == "");
      REQUIRE(r.completed);
      for (int i = 0; i < p; ++i) CHECK(r.peak_in_flight[i] == std::min(p - i, m));
      // Unequal stages too.
      pipeline_costs skewed = uniform_pipeline_costs(p, 1.0, 2.0, 0.1);
      for (int i = 0; i < p; ++i) {
        skewed.forward_s[i] = 0.5 + i % 3;
        skewed.backward_s[i] = 2 * skewed.forward_s[i];
      }
      CHECK(simulate(s, skewed).completed);
    }
}

TEST_CASE("1F1B bubble on uniform stages is (p-1)/(m+p-1), matching the cost model's closed form") {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 4, 8, 32}) {
      CAPTURE(p);
      CAPTURE(m);
      simulation r = simulate(make_1f1b(p, m), uniform_pipeline_costs(p, 1.0, 2.0));
      REQUIRE(r.completed);
      CHECK(r.bubble_fraction == doctest::Approx(double(p - 1) / (m + p - 1)));
      CHECK(r.pipeline_s == doctest::Approx((m + p - 1) * 3.0));
      CHECK(r.pipeline_s == doctest::Approx(pipeline_time(std::vector<double>(p, 3.0), std::vector<double>(p - 1, 0.0), m)));
    }
}

TEST_CASE("with links, the closed form bounds the simulated 1F1B flush") {
  // Compute-bound and link-bound pipelines, uniform and skewed stages:
  // the cost model never predicts less than the lists take.
  for (double link : {0.05, 0.5, 4.0})
    for (int p : {2, 4})
      for (int m : {1, 4, 16}) {
        CAPTURE(link);
        CAPTURE(p);
        CAPTURE(m);
        pipeline_costs c = uniform_pipeline_costs(p, 1.0, 2.0, link);
        c.forward_s[p - 1] = 1.5;
        c.backward_s[p - 1] = 3.0;
        simulation r = simulate(make_1f1b(p, m), c);
        REQUIRE(r.completed);
        std::vector<double> stage_s;
        for (int i = 0; i < p; ++i) stage_s.push_back(c.forward_s[i] + c.backward_s[i]);
        double closed = pipeline_time(stage_s, c.link_s, m);
        CHECK(r.pipeline_s <= closed * (1 + 1e-12));
        CHECK(r.pipeline_s >= closed * 0.75);
      }
}

TEST_CASE("DP bucket reductions overlap the last backward and the optimizer step waits for them") {
  pipeline_schedule s = make_1f1b(1, 2, {4});
  pipeline_costs c = uniform_pipeline_costs(1, 1.0, 2.0);
  c.reduce_s = {4.0};     // four buckets of 1 s
  c.optimizer_s = {0.5};
  simulation r = simulate(s, c);
  REQUIRE(r.completed);
  // Last backward runs [4, 6); buckets ready at 4.5, 5, 5.5, 6; the channel
  // runs them back to back from 4.5 to 8.5, then the optimizer 0.5 s.
  CHECK(r.pipeline_s == doctest::Approx(6.0));
  CHECK(r.makespan_s == doctest::Approx(9.0));
}

TEST_CASE("the simulator finds deadlocks and messages nobody receives") {
  // Stage 1 waits for a gradient before it has sent anything back: a cycle.
  pipeline_schedule s = make_1f1b(2, 2);
  auto& prog1 = s.programs[1];
  prog1.insert(prog1.begin(), instruction{pipeline_op::recv_grad, 0, 0, 0});
  simulation r = simulate(s, uniform_pipeline_costs(2, 1, 2));
  CHECK_FALSE(r.completed);
  CAPTURE(r.problem);
  CHECK(r.problem.find("deadlock: ") == 0);
  CHECK(r.problem.find("stage 1 waits at #0 'recv_grad mb 0 <- 0'") != std::string::npos);
  CHECK(r.problem.find("stage 0 waits at") != std::string::npos);

  // A send without its receive.
  pipeline_schedule t = make_1f1b(2, 2);
  t.programs[0].push_back(instruction{pipeline_op::send_act, 5, 0, 1});
  simulation u = simulate(t, uniform_pipeline_costs(2, 1, 2));
  CHECK_FALSE(u.completed);
  CHECK(u.problem == "stage 0 sends an activation of micro-batch 5 that stage 1 never receives");

  // A backward without its forward.
  pipeline_schedule v = make_1f1b(1, 2);
  v.programs[0].insert(v.programs[0].begin(), instruction{pipeline_op::backward, 1});
  CHECK(simulate(v, uniform_pipeline_costs(1, 1, 2)).problem ==
        "stage 0 at 'backward mb 1': backward before its forward");
}

TEST_CASE("interleaved 1F1B runs without deadlock and shrinks the bubble") {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        pipeline_schedule s = make_interleaved(p, m, v);
        CHECK(s.kind == schedule_kind::interleaved);
        CHECK(s.chunks == v);
        // Each chunk costs 1/v of the stage.
        simulation r = simulate(s, uniform_pipeline_costs(p, 1.0 / v, 2.0 / v));
        CHECK(r.problem == "");
        REQUIRE(r.completed);
        simulation plain = simulate(make_1f1b(p, m), uniform_pipeline_costs(p, 1.0, 2.0));
        CHECK(r.bubble_fraction < plain.bubble_fraction);
        if (m > p) CHECK(r.bubble_fraction == doctest::Approx(double(p - 1) / (v * m + p - 1)));
        CHECK(simulate(s, uniform_pipeline_costs(p, 1.0 / v, 2.0 / v, 0.1)).completed);
      }
  CHECK_THROWS_AS(make_interleaved(4, 6, 2), std::invalid_argument);
  CHECK(make_interleaved(2, 4, 1).kind == schedule_kind::one_f_one_b);
}
