// The planner: its hard constraint, its spans, and the baselines it beats.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <string>

#include "model/error.hpp"
#include "tests/schedule/example_clusters.hpp"
#include "schedule/partition.hpp"
#include "schedule/planner.hpp"

using namespace corolla;
using namespace corolla::schedule;

namespace {

using corolla::schedule::testing::example;
using corolla::schedule::testing::example_cluster;

model_config llama_7b() { return load_config(example("models/llama2-7b.json")); }
model_config gpt_7_5b() { return load_config(example("models/gpt-7.5b.json")); }

training_setup setup_for(int global_batch) {
  training_setup s;
  s.global_batch = global_batch;
  return s;
}

/// Everything every plan must satisfy: the constraint, complete contiguous
/// spans, memory, and consistent placements.
void check_plan(const cluster_description& c, const model_config& cfg, const plan& p) {
  REQUIRE(p.feasible);
  REQUIRE(p.pp == static_cast<int>(p.stages.size()));
  CHECK(p.tp == 1);
  CHECK(dp_groups_within_nic_class(c, p.layout()));
  int next = 0;
  std::set<int> used;
  for (const stage_plan& s : p.stages) {
    CAPTURE(s.index);
    CHECK(s.first_layer == next);
    CHECK(s.last_layer > s.first_layer);
    next = s.last_layer;
    CHECK(s.embedding == (s.index == 0));
    CHECK(s.head == (s.index == p.pp - 1));
    REQUIRE(static_cast<int>(s.workers.size()) == p.dp);
    // Every DP group sits in one cluster and one NIC class.
    REQUIRE(s.cluster >= 0);
    REQUIRE(s.nic >= 0);
    for (int r : s.workers) {
      CHECK(c.workers[r].cluster == s.cluster);
      CHECK(c.workers[r].nic == s.nic);
      CHECK(used.insert(r).second);
    }
    CHECK(s.cost.memory.total() <= s.cost.capacity);
  }
  CHECK(next == cfg.n_layers);
  CHECK(used.size() + p.idle.size() == static_cast<std::size_t>(c.size()));
  for (int r : p.idle) CHECK(!p.place(r));
  for (const stage_plan& s : p.stages)
    for (int k = 0; k < p.dp; ++k) {
      auto pl = p.place(s.workers[k]);
      REQUIRE(pl);
      CHECK(pl->stage == s.index);
      CHECK(pl->replica == k);
      CHECK(pl->dp_group == s.workers);
      CHECK(pl->prev_rank == (s.index > 0 ? p.stages[s.index - 1].workers[k] : -1));
      CHECK(pl->next_rank == (s.index + 1 < p.pp ? p.stages[s.index + 1].workers[k] : -1));
    }
}

}  // namespace

TEST_CASE("the planner keeps every DP group in one NIC class and cluster and never loses to the Holmes rule") {
  struct job {
    const char* file;
    model_config cfg;
    int batch;
  };
  std::vector<job> jobs;
  for (const char* f : {"ib_roce.toml", "ib_ethernet.toml", "three_clusters.toml", "unequal_gpus.toml",
                        "memory_tight.toml"})
    for (int batch : {32, 512}) {
      jobs.push_back({f, llama_7b(), batch});
      jobs.push_back({f, gpt_7_5b(), batch});
    }
  for (const job& j : jobs) {
    CAPTURE(j.file);
    CAPTURE(j.cfg.n_layers);
    CAPTURE(j.batch);
    cluster_description c = example_cluster(j.file);
    plan_report r = make_plan(c, j.cfg, setup_for(j.batch));
    check_plan(c, j.cfg, r.best);
    CHECK(r.best.micro_batches * r.best.dp == j.batch);
    // Baselines are priced at the planner's p and d.
    CHECK(r.holmes.pp == r.best.pp);
    CHECK(r.holmes.dp == r.best.dp);
    CHECK(r.naive.pp == r.best.pp);
    CHECK(r.best.step_s() <= r.holmes.step_s() * (1 + 1e-12));
    CHECK(r.best.step_s() <= r.naive.step_s() * (1 + 1e-12));
    CHECK(r.best.step_s() <= r.holmes_two_stages.step_s() * (1 + 1e-12));
    CHECK(r.layouts_priced > 0);
  }
}

TEST_CASE("the planner beats the Holmes rule on clusters with unequal GPUs and three sites") {
  // Never worse on any job, and clearly better on most. A tie is right where
  // the rule happens to land on the optimum: GPT-7.5B at batch 32 on three
  // sites runs best on the H100 cluster alone, which the rule also picks at
  // the same p and d, and at batch 512 on unequal GPUs the rule's split by
  // TFLOP/s (5/13/5/13 layers) is already the best split of that order.
  for (const char* f : {"three_clusters.toml", "unequal_gpus.toml"}) {
    int wins = 0;
    for (const model_config& cfg : {llama_7b(), gpt_7_5b()})
      for (int batch : {32, 512}) {
        CAPTURE(f);
        CAPTURE(cfg.n_layers);
        CAPTURE(batch);
        cluster_description c = example_cluster(f);
        plan_report r = make_plan(c, cfg, setup_for(batch));
        REQUIRE(r.best.feasible);
        REQUIRE(r.holmes.feasible);
        CHECK(r.best.step_s() <= r.holmes.step_s() * (1 + 1e-12));
        CHECK(r.best.step_s() <= r.naive.step_s() * (1 + 1e-12));
        const double speedup = r.holmes.step_s() / r.best.step_s();
        MESSAGE(f << ", " << cfg.n_layers << " layers, batch " << batch << ": planner " << speedup
                  << "x the Holmes rule");
        if (speedup > 1.02) ++wins;
      }
    CHECK_MESSAGE(wins >= 3, f << ": the planner beat the Holmes rule by more than 2% on only " << wins
                                << " of 4 jobs");
  }
}

TEST_CASE("slow inter-cluster links are crossed once: clusters form contiguous runs of stages") {
  for (int batch : {32, 512}) {
    cluster_description c = example_cluster("three_clusters.toml");
    plan_report r = make_plan(c, llama_7b(), setup_for(batch));
    REQUIRE(r.best.feasible);
    std::set<int> finished;
    for (std::size_t i = 0; i < r.best.stages.size(); ++i) {
      int cl = r.best.stages[i].cluster;
      CHECK(finished.count(cl) == 0);  // a cluster never comes back after being left
      if (i + 1 < r.best.stages.size() && r.best.stages[i + 1].cluster != cl) finished.insert(cl);
    }
  }
}

TEST_CASE("the Holmes rule may straddle NIC classes where the planner does not") {
  // 3 IB + 3 RoCE workers in one cluster, DP 2: NIC-sorted consecutive pairs
  // put rank 2 (IB) with rank 3 (RoCE).
  cluster_description c = parse_cluster(R"(
[[cluster]]
name = "dc"
  [[cluster.node]]
  names = ["i0", "i1", "i2"]
  nic = "ib"
    [[cluster.node.worker]]
    tflops = 100
    memory_gib = 80
  [[cluster.node]]
  names = ["r0", "r1", "r2"]
  nic = "roce"
    [[cluster.node.worker]]
    tflops = 100
    memory_gib = 80
)", "six.toml");
  model_config cfg = llama_7b();
  training_setup s = setup_for(32);
  s.dp = 2;
  plan holmes = holmes_plan(c, cfg, s, 3, 2);
  REQUIRE(holmes.feasible);
  CHECK_FALSE(dp_groups_within_nic_class(c, holmes.layout()));
  CHECK(holmes.stages[1].nic == -1);
  plan_report r = make_plan(c, cfg, s);
  check_plan(c, cfg, r.best);
  CHECK(r.best.dp == 2);
  CHECK(r.best.pp <= 2);  // at most one IB pair and one RoCE pair
}

TEST_CASE("baselines: naive file order with even layers, Holmes NIC order with proportional layers") {
  cluster_description c = example_cluster("unequal_gpus.toml");
  model_config cfg = llama_7b();
  training_setup s = setup_for(32);
  plan naive = naive_plan(c, cfg, s, 4, 8);
  REQUIRE(naive.stages.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(naive.stages[i].first_layer == 8 * i);
    for (int k = 0; k < 8; ++k) CHECK(naive.stages[i].workers[k] == 8 * i + k);
  }
  // One NIC class: file order (A100, H100, A100, H100); layers by speed 150 : 400.
  plan holmes = holmes_plan(c, cfg, s, 4, 8);
  REQUIRE(holmes.stages.size() == 4);
  std::vector<int> sizes;
  for (const auto& st : holmes.stages) sizes.push_back(st.last_layer - st.first_layer);
  CHECK(sizes == std::vector<int>{4, 12, 4, 12});
  // Holmes sorts by NIC class, fastest first: IB before RoCE before Ethernet.
  cluster_description three = example_cluster("three_clusters.toml");
  plan h3 = holmes_plan(three, cfg, s, 6, 8);
  REQUIRE(h3.stages.size() == 6);
  CHECK(three.nics[h3.stages[0].nic].name == "ib");
  CHECK(three.nics[h3.stages[2].nic].name == "roce");
  CHECK(three.nics[h3.stages[5].nic].name == "ethernet");
  // Shapes that do not fit the cluster or the batch are explained.
  plan too_big = holmes_plan(c, cfg, s, 8, 8);
  CHECK_FALSE(too_big.feasible);
  CHECK(too_big.reason == "PP 8 x DP 8 needs 64 workers; the cluster has 32");
  CHECK(naive_plan(c, cfg, s, 2, 3).reason == "the global batch 32 does not split over DP 3 x micro-batch 1");
}

TEST_CASE("proportional and even splits") {
  // Holmes's example: 48 layers at 197 vs 160 TFLOPS -> 26 / 22.
  CHECK(proportional_split(48, {197, 160}) == std::vector<int>{0, 26, 48});
  CHECK(proportional_split(32, {1, 1, 1, 1}) == std::vector<int>{0, 8, 16, 24, 32});
  CHECK(proportional_split(4, {1000, 1, 1}) == std::vector<int>{0, 2, 3, 4});  // never an empty stage
  CHECK(even_split(10, 4) == std::vector<int>{0, 3, 6, 8, 10});
  CHECK(even_split(3, 3) == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("the layer partition minimises the slowest stage under memory limits (brute force check)") {
  model_config cfg = llama_7b();
  cfg.n_layers = 9;
  training_setup s = setup_for(8);
  s.seq = 1024;
  model_costs costs = compute_costs(cfg, s);
  // Three stages with unequal speeds; memories from roomy to tight.
  for (double mem_gib : {80.0, 40.0, 28.0, 20.0}) {
    CAPTURE(mem_gib);
    std::vector<stage_slot> slots(3);
    double speeds[3] = {100e12, 250e12, 60e12};
    for (int i = 0; i < 3; ++i) {
      slots[i].flops_per_s = speeds[i];
      slots[i].capacity = gib(i == 1 ? mem_gib : 80.0);
      slots[i].in_flight = 3 - i;
      slots[i].dp = 1;
      slots[i].dp_link = {1e12, 0};
      slots[i].first = i == 0;
      slots[i].last = i == 2;
    }
    auto found = partition_layers(costs, s, slots, 8, partition_objective::bottleneck);
    // Brute force over all splits.
    double best = 1e300;
    for (int a = 1; a < 9; ++a)
      for (int b = a + 1; b < 9; ++b) {
        int bounds[4] = {0, a, b, 9};
        double worst = 0;
        bool fits = true;
        for (int i = 0; i < 3; ++i) {
          double flops = 0, params = 0, act = 0;
          for (int l = bounds[i]; l < bounds[i + 1]; ++l) {
            flops += costs.blocks[l].forward_flops + costs.blocks[l].backward_flops;
            params += costs.blocks[l].params;
            act += costs.blocks[l].activation_bytes;
          }
          if (i == 0) params += costs.embedding.params;
          if (i == 2) {
            flops += costs.head.forward_flops + costs.head.backward_flops;
            params += costs.head.params;
            act += costs.head.activation_bytes;
          }
          memory_breakdown m = stage_memory(params, act, slots[i].in_flight, i == 2 ? costs.head_transient_bytes : 0, 1, s);
          fits = fits && m.total() <= slots[i].capacity;
          worst = std::max(worst, flops / speeds[i]);
        }
        if (fits) best = std::min(best, worst);
      }
    if (best == 1e300) {
      CHECK_FALSE(found);
      continue;
    }
    REQUIRE(found);
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      double flops = 0;
      for (int l = (*found)[i]; l < (*found)[i + 1]; ++l)
        flops += costs.blocks[l].forward_flops + costs.blocks[l].backward_flops;
      if (i == 2) flops += costs.head.forward_flops + costs.head.backward_flops;
      worst = std::max(worst, flops / speeds[i]);
    }
    CHECK(worst == doctest::Approx(best));
  }
}

TEST_CASE("a memory-tight cluster gets a plan that fits where the naive split does not") {
  cluster_description c = example_cluster("memory_tight.toml");
  model_config cfg = llama_7b();
  plan_report r = make_plan(c, cfg, setup_for(32));
  check_plan(c, cfg, r.best);
  // The naive even split at the same shape overflows a 24 GiB card.
  CHECK_FALSE(r.naive.feasible);
  CHECK(r.naive.reason.find("RTX-4090") != std::string::npos);
  CHECK(r.naive.reason.find("GiB usable") != std::string::npos);
  // The Holmes rule with two stages does not fit either.
  CHECK_FALSE(r.holmes_two_stages.feasible);
}

TEST_CASE("a job that fits nowhere is rejected with the reason") {
  cluster_description c = uniform_cluster(1, 2, "ethernet", 100, 8);
  plan_report r = make_plan(c, llama_7b(), setup_for(32));
  CHECK_FALSE(r.best.feasible);
  CAPTURE(r.best.reason);
  CHECK(r.best.reason.find("the model does not fit in memory in any layout; closest: PP 2 x DP 1: stage") == 0);
  CHECK(r.best.reason.find("worker node0/") != std::string::npos);
  CHECK(r.best.reason.find("7.2 GiB usable (8.0 GiB less 10% headroom)") != std::string::npos);
  CHECK_FALSE(r.naive.feasible);
  CHECK_FALSE(r.holmes.feasible);

  // A forced shape the cluster cannot hold.
  training_setup s = setup_for(32);
  s.dp = 4;
  plan_report forced = make_plan(c, llama_7b(), s);
  CHECK_FALSE(forced.best.feasible);
  CHECK(forced.best.reason.find("no layout of 2 workers with 4 data-parallel replicas") == 0);
}

TEST_CASE("forced pipeline depth and DP width are respected") {
  cluster_description c = example_cluster("ib_roce.toml");
  model_config cfg = llama_7b();
  training_setup s = setup_for(64);
  s.pp = 4;
  s.dp = 8;
  plan_report r = make_plan(c, cfg, s);
  check_plan(c, cfg, r.best);
  CHECK(r.best.pp == 4);
  CHECK(r.best.dp == 8);
  CHECK(r.best.idle.size() == 32);
  // A loopback cluster for `--pp 2 --dp 2`.
  cluster_description loop = uniform_cluster(1, 4, "ethernet", 1, 64);
  model_config tiny = cfg;
  tiny.n_layers = 4;
  s = setup_for(8);
  s.seq = 128;
  s.pp = 2;
  s.dp = 2;
  plan_report lr = make_plan(loop, tiny, s);
  check_plan(loop, tiny, lr.best);
  CHECK(lr.best.pp == 2);
  CHECK(lr.best.micro_batches == 4);
}

TEST_CASE("a LoRA job's plan prices the adapter's gradients, moments and DP traffic: it is faster than the whole "
          "model's on every example cluster, and fits where the whole model needs more stages") {
  const model_config cfg = llama_7b();
  training_setup lora = setup_for(32);
  lora.lora_block_params = 2.0 * (8 * 4096 + 4096 * 8);  // rank 8 on q and v
  for (const char* file : {"ib_roce.toml", "ib_ethernet.toml", "three_clusters.toml", "unequal_gpus.toml",
                           "memory_tight.toml"}) {
    CAPTURE(file);
    const cluster_description c = example_cluster(file);
    const plan_report whole = make_plan(c, cfg, setup_for(32));
    const plan_report r = make_plan(c, cfg, lora);
    check_plan(c, cfg, r.best);
    REQUIRE(whole.best.feasible);
    CHECK(r.best.estimate.step_s < whole.best.estimate.step_s);
    for (const stage_plan& s : r.best.stages) {
      // Gradients of the adapter's blocks only: a few MB, not GBs.
      CHECK(s.cost.memory.grads <= (s.last_layer - s.first_layer) * lora.lora_block_params * lora.grad_bytes + 1);
      CHECK(s.cost.memory.weights > 0);
    }
  }
  // Frozen weights need no gradients or moments: the 24 GiB cards of the
  // memory-tight cluster hold the model in fewer stages.
  const cluster_description tight = example_cluster("memory_tight.toml");
  training_setup forced = lora;
  forced.pp = make_plan(tight, cfg, setup_for(32)).best.pp - 1;
  if (forced.pp >= 1) CHECK(make_plan(tight, cfg, forced).best.feasible);
}

TEST_CASE("a QLoRA job's plan holds the frozen blocks in fewer bytes: no stage priced above its worker's memory, "
          "and half the stages of the f32 adapter's where memory set its depth") {
  const model_config cfg = llama_7b();
  // As train runs QLoRA: f32 compute beside the quantised blocks.
  training_setup lora = setup_for(32);
  lora.set_precision(precision::fp32);
  lora.lora_block_params = 2.0 * (8 * 4096 + 4096 * 8);
  training_setup q = lora;
  // A Llama-2-7B block as nf4: 202 M parameters at ~0.56 bytes, norms f32.
  q.frozen_block_bytes = 0.5625 * 202375168.0;
  for (const char* file : {"ib_roce.toml", "memory_tight.toml", "unequal_gpus.toml"}) {
    CAPTURE(file);
    const cluster_description c = example_cluster(file);
    const plan_report r = make_plan(c, cfg, q);
    REQUIRE(r.best.feasible);
    check_plan(c, cfg, r.best);
    for (const stage_plan& s : r.best.stages) {
      CHECK(s.cost.memory.total() <= s.cost.capacity);
      // The blocks at the frozen bytes, not at weight_bytes.
      CHECK(s.cost.memory.weights < (s.last_layer - s.first_layer) * block_params(cfg) * q.weight_bytes);
    }
  }
  // The memory-tight cluster's 24 GiB cards hold a sixth of the f32
  // adapter's frozen model (PP 6) and a third of the nf4 one's (PP 3); in
  // one stage only the nf4 blocks fit at all (on the 48 GiB cards).
  const cluster_description tight = example_cluster("memory_tight.toml");
  const plan_report f32_plan = make_plan(tight, cfg, lora), nf4_plan = make_plan(tight, cfg, q);
  REQUIRE(f32_plan.best.feasible);
  REQUIRE(nf4_plan.best.feasible);
  CHECK(nf4_plan.best.pp * 2 <= f32_plan.best.pp);
  CHECK(nf4_plan.best.estimate.step_s < f32_plan.best.estimate.step_s);
  training_setup one = lora, one_q = q;
  one.pp = one_q.pp = 1;
  CHECK_FALSE(make_plan(tight, cfg, one).best.feasible);
  CHECK(make_plan(tight, cfg, one_q).best.feasible);
}
