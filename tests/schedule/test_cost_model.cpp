// The cost model on hand-computed examples.
#include <doctest/doctest.h>

#include <string>

#include "model/error.hpp"
#include "schedule/cost_model.hpp"

using namespace corolla;
using namespace corolla::schedule;

namespace {

/// D=8, F=16, 2 heads of 4 (1 KV head), vocab 10, 2 layers, context 8.
model_config tiny_llama() {
  model_config c;
  c.arch = architecture::llama;
  c.hf_architecture = "LlamaForCausalLM";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.max_positions = 8;
  return c;
}

/// D=8, F=32, 2 heads, vocab 10, 3 layers, 16 positions, tied head.
model_config tiny_gpt2() {
  model_config c;
  c.arch = architecture::gpt2;
  c.hf_architecture = "GPT2LMHeadModel";
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.n_layers = 3;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.intermediate_size = 32;
  c.max_positions = 16;
  c.tie_embeddings = true;
  return c;
}

training_setup tiny_setup(int global, int micro, int seq) {
  training_setup s;
  s.global_batch = global;
  s.micro_batch = micro;
  s.seq = seq;
  s.memory_headroom = 0;
  return s;
}

}  // namespace

TEST_CASE("block FLOPs, parameters and activations match hand counts") {
  model_config c = tiny_llama();
  // Matrices per token: q 8x8, k and v 8x4 each, o 8x8, gate/up/down 3 x 8x16 = 576.
  CHECK(block_params(c) == 576 + 2 * 8);
  // 2 sequences of 4 tokens: 2*8*576 matmul FLOPs + causal attention 2*b*s^2*q = 2*2*16*8.
  CHECK(block_forward_flops(c, 4, 2) == 2.0 * 8 * 576 + 2.0 * 2 * 16 * 8);
  // Per token 4D + 2q + 2kv + 3F = 32 + 16 + 8 + 48 = 104 elements, 8 tokens, 2 bytes.
  CHECK(block_activation_bytes(c, 4, 2, 2.0) == 104.0 * 8 * 2);

  model_config g = tiny_gpt2();
  // ln_1 16, c_attn 8x24+24, c_proj 64+8, ln_2 16, c_fc 256+32, proj 256+8.
  CHECK(block_params(g) == 16 + 216 + 72 + 16 + 288 + 264);
  CHECK(block_forward_flops(g, 16, 1) == 2.0 * 16 * (8 * 24 + 64 + 2 * 8 * 32) + 2.0 * 1 * 256 * 8);
  // 4D + 2q + 2kv + 2F = 32 + 16 + 16 + 64.
  CHECK(block_activation_bytes(g, 16, 1, 4.0) == 128.0 * 16 * 4);

  // Mixtral-shaped, 4 experts, top-2: 4D + 2q + 2kv + k (2D + 3F) = 56 +
  // 2 * 64 = 184 elements at the compute dtype, and 4 f32 router logits;
  // in 16 bits also the router's f32 copy of the input (D = 8).
  model_config moe = tiny_llama();
  moe.hf_architecture = "MixtralForCausalLM";
  moe.n_experts = 4;
  moe.experts_per_token = 2;
  REQUIRE(moe.is_moe());
  CHECK(block_activation_bytes(moe, 4, 2, 4.0) == (184.0 * 4 + 4 * 4) * 8);
  CHECK(block_activation_bytes(moe, 4, 2, 2.0) == (184.0 * 2 + (4 + 8) * 4) * 8);
}

TEST_CASE("embeddings, blocks and head add up to the model's parameter count") {
  model_config qwen3 = tiny_llama();  // with Qwen3's q/k norms and every attention bias
  qwen3.hf_architecture = "Qwen3ForCausalLM";
  qwen3.qk_norm = qwen3.qkv_bias = qwen3.o_bias = true;
  model_config qwen2 = tiny_llama();
  qwen2.hf_architecture = "Qwen2ForCausalLM";
  qwen2.qkv_bias = true;
  CHECK(block_activation_bytes(qwen3, 16, 1, 4.0) > block_activation_bytes(tiny_llama(), 16, 1, 4.0));
  for (model_config c : {tiny_llama(), tiny_gpt2(), qwen2, qwen3}) {
    CAPTURE(c.hf_architecture);
    model_costs m = compute_costs(c, tiny_setup(4, 1, 4));
    double sum = m.embedding.params + m.head.params;
    for (const auto& b : m.blocks) sum += b.params;
    CHECK(sum == doctest::Approx(static_cast<double>(c.parameter_count())));
    CHECK(m.blocks.size() == static_cast<std::size_t>(c.n_layers));
    // Head: 2 * tokens * D * V forward, twice that backward.
    CHECK(m.head.forward_flops == 2.0 * 4 * 8 * 10);
    CHECK(m.head.backward_flops == 2 * m.head.forward_flops);
    CHECK(m.blocks[0].backward_flops == 2 * m.blocks[0].forward_flops);
    CHECK(m.boundary_bytes == 4.0 * 8 * 2);    // b*s*h*bytes
    CHECK(m.head_transient_bytes == 4.0 * 10 * 4);  // fp32 logits of one micro-batch
  }
  CHECK(compute_costs(tiny_gpt2(), tiny_setup(4, 1, 4)).tied_copy_params == 80);
  CHECK(compute_costs(tiny_llama(), tiny_setup(4, 1, 4)).tied_copy_params == 0);
  // seq 0 means the model's context.
  CHECK(compute_costs(tiny_llama(), tiny_setup(4, 1, 0)).seq == 8);
}

TEST_CASE("link, collective and pipeline formulas") {
  link_spec l{1e9, 1e-5};
  CHECK(l.time(0) == 0);
  CHECK(l.time(2e9) == doctest::Approx(2.0 + 1e-5));
  // Ring all-reduce: 2(d-1)/d * bytes / bw + 2(d-1) latencies per bucket.
  CHECK(ring_allreduce_time(4, 1e9, l) == doctest::Approx(1.5 + 6e-5));
  CHECK(ring_allreduce_time(4, 1e9, l, 10) == doctest::Approx(1.5 + 6e-4));
  CHECK(ring_allreduce_time(1, 1e9, l) == 0);
  // ZeRO-1 with gradients and weights of one size moves the same bytes.
  CHECK(zero1_reduction_time(4, 1e9, 1e9, l) == doctest::Approx(ring_allreduce_time(4, 1e9, l)));
  CHECK(zero1_reduction_time(2, 1e9, 0, l) == doctest::Approx(0.5 + 2e-5));

  CHECK(in_flight_micro_batches(0, 4, 8) == 4);
  CHECK(in_flight_micro_batches(3, 4, 8) == 1);
  CHECK(in_flight_micro_batches(0, 4, 2) == 2);

  // 1F1B: (m + p - 1) * S on uniform stages with free links.
  CHECK(pipeline_time({3, 3, 3, 3}, {0, 0, 0}, 8) == doctest::Approx(11 * 3));
  // Links add their traversal twice (first forward, last backward), and
  // 1F1B's window makes them felt in steady state too: stage 0 holds 4
  // micro-batches, each needing a round trip of 12 + 2 * 1.5 = 15.
  CHECK(pipeline_interval({3, 3, 3, 3}, {0.5, 0.5, 0.5}, 8) == doctest::Approx(15.0 / 4));
  CHECK(pipeline_time({3, 3, 3, 3}, {0.5, 0.5, 0.5}, 8) == doctest::Approx(15 + 7 * 3.75));
  // A link slower than every stage: the window of stage 0 (2 micro-batches,
  // round trip 1 + 1 + 2 * 2 = 6) sets the interval, 3 > 2.
  CHECK(pipeline_interval({1, 1}, {2}, 4) == doctest::Approx(3));
  CHECK(pipeline_time({1, 1}, {2}, 4) == doctest::Approx(6 + 3 * 3));
  // Fewer micro-batches than the window: only stages and links count.
  CHECK(pipeline_interval({1, 1}, {2}, 2) == doctest::Approx(2));
  // Unequal stages: the slowest one is the interval.
  CHECK(pipeline_time({1, 2, 1}, {}, 5) == doctest::Approx(4 + 4 * 2));

  CHECK(exposed_reduction(10, 3, 0.5) == doctest::Approx(7));
  CHECK(exposed_reduction(4, 3, 0.5) == doctest::Approx(2));
  CHECK(exposed_reduction(4, 3, 0.0) == doctest::Approx(4));
  CHECK(exposed_reduction(4, 3, 1.0) == doctest::Approx(1));
}

TEST_CASE("stage memory counts weights, gradients, sharded AdamW states and in-flight activations") {
  training_setup s;  // bf16 mixed: 2 + 2 + 12 bytes per parameter
  memory_breakdown m = stage_memory(100, 10, 3, 5, 4, s);
  CHECK(m.weights == 200);
  CHECK(m.grads == 200);
  CHECK(m.optimizer == 300);  // 1200 / 4 under ZeRO-1
  CHECK(m.activations == 35);
  CHECK(m.total() == 735);
  s.zero1 = false;
  CHECK(stage_memory(100, 10, 3, 5, 4, s).optimizer == 1200);
  s.set_precision(precision::fp32);
  CHECK(s.weight_bytes == 4);
  CHECK(s.grad_bytes == 4);
  CHECK(s.optimizer_bytes == 8);
  CHECK(s.activation_bytes == 4);
}

TEST_CASE("training setups are validated with clear messages") {
  model_config c = tiny_llama();
  training_setup s = tiny_setup(32, 2, 4);
  CHECK(s.micro_batches(4) == 4);
  CHECK(s.micro_batches(3) == 0);
  CHECK(s.micro_batches(32) == 0);
  CHECK_NOTHROW(s.validate(c));
  s.seq = 9;
  CHECK_THROWS_WITH_AS(s.validate(c), "the sequence length 9 exceeds the model's context of 8 tokens", model_error);
  s = tiny_setup(30, 4, 4);
  CHECK_THROWS_WITH_AS(s.validate(c), "the global batch (30) is not a multiple of the micro-batch (4)", model_error);
  s = tiny_setup(32, 1, 4);
  s.dp_overlap = 1.5;
  CHECK_THROWS_AS(s.validate(c), model_error);
  s = tiny_setup(32, 1, 4);
  s.pp = 3;
  CHECK_THROWS_WITH_AS(s.validate(c), "a pipeline of 3 stages needs at least as many layers; the model has 2", model_error);
}

TEST_CASE("a two-stage step is priced by the closed forms") {
  model_config c = tiny_llama();
  training_setup s = tiny_setup(4, 1, 4);
  model_costs m = compute_costs(c, s);
  cluster_description cl = uniform_cluster(2, 1, "ib", 1.0, 1.0);  // 1 TFLOP/s each, other nodes
  pipeline_layout layout{{{{0}, 0, 1}, {{1}, 1, 2}}};
  step_estimate e = estimate_step(cl, m, s, layout);

  double block = 2.0 * 4 * 576 + 2.0 * 16 * 8;  // forward FLOPs of one block
  double head = 2.0 * 4 * 8 * 10;
  double s0 = 3 * block / 1e12, s1 = 3 * (block + head) / 1e12;
  double x = 2e-6 + 64 / (200e9 / 8);  // IB: latency + b*s*h*2 bytes / bandwidth
  REQUIRE(e.stages.size() == 2);
  CHECK(e.micro_batches == 4);
  CHECK(e.stages[0].forward_s == doctest::Approx(block / 1e12));
  CHECK(e.stages[1].backward_s == doctest::Approx(2 * (block + head) / 1e12));
  CHECK(e.stages[0].send_s == doctest::Approx(x));
  CHECK(e.pipeline_s == doctest::Approx(pipeline_time({s0, s1}, {x}, 4)));
  CHECK(e.interval_s == doctest::Approx(x));  // these tiny stages are link-bound
  CHECK(e.step_s == doctest::Approx(e.pipeline_s));  // d = 1: no reduction
  CHECK(e.dp_tail_s == doctest::Approx(0));
  // Memory: stage 0 = embeddings (80) + block (592) params x 16 bytes + 2 in flight x 832;
  // stage 1 = block + final norm + untied head (88) x 16 + 1 x (832 + 128) + logits 160.
  CHECK(e.stages[0].memory.total() == doctest::Approx(672 * 16 + 2 * 832));
  CHECK(e.stages[1].memory.total() == doctest::Approx(680 * 16 + 832 + 128 + 160));
  CHECK(e.stages[0].in_flight == 2);
  CHECK(e.fits);
  CHECK(e.bubble_fraction == doctest::Approx(1 - 4 * (s0 + s1) / (2 * e.pipeline_s)));
  CHECK(e.samples_per_s == doctest::Approx(4 / e.step_s));

  // Too little memory: the worst stage, its worker and the breakdown.
  cluster_description tiny_mem = uniform_cluster(2, 1, "ib", 1.0, 10000.0 / gib(1));
  step_estimate small = estimate_step(tiny_mem, m, s, layout);
  CHECK_FALSE(small.fits);
  CHECK(small.memory_problem.find("stage 0 of 2 (layers 0-0 + embeddings, DP 1)") == 0);
  CHECK(small.memory_problem.find("worker node0/0") != std::string::npos);
  CHECK(small.memory_problem.find("2 micro-batches in flight") != std::string::npos);
}

TEST_CASE("the DP reduction tail and the tied-embedding sync extend the step") {
  // One stage, two replicas on one node: the exposed ZeRO-1 reduction follows the flush.
  model_config c = tiny_llama();
  training_setup s = tiny_setup(4, 1, 4);
  model_costs m = compute_costs(c, s);
  cluster_description one_node = uniform_cluster(1, 2, "ib", 1e-6, 1.0);  // slow compute: 1 MFLOP/s
  step_estimate e = estimate_step(one_node, m, s, {{{{0, 1}, 0, 2}}});
  double params = static_cast<double>(c.parameter_count());
  link_spec intra = one_node.link_between(0, 1);
  double reduce = zero1_reduction_time(2, params * 2, params * 2, intra, 1);
  REQUIRE(e.stages.size() == 1);
  CHECK(e.stages[0].reduce_s == doctest::Approx(reduce));
  double backward = e.stages[0].backward_s;
  CHECK(e.stages[0].exposed_reduce_s == doctest::Approx(reduce - std::min(0.5 * reduce, backward)));
  CHECK(e.step_s == doctest::Approx(e.pipeline_s + e.stages[0].exposed_reduce_s));

  // GPT-2 ties the head: with two stages the copy's gradient crosses between them.
  model_config g = tiny_gpt2();
  model_costs mg = compute_costs(g, s);
  cluster_description two = uniform_cluster(2, 1, "ethernet", 1.0, 1.0);
  step_estimate eg = estimate_step(two, mg, s, {{{{0}, 0, 2}, {{1}, 2, 3}}});
  double sync = ring_allreduce_time(2, 80 * 2, two.link_between(0, 1));
  CHECK(eg.embedding_sync_s == doctest::Approx(sync));
  CHECK(eg.step_s == doctest::Approx(eg.pipeline_s + sync));
  CHECK(eg.stages[1].params == doctest::Approx(block_params(g) + 2 * 8 + 80));
}

TEST_CASE("malformed layouts are rejected") {
  model_config c = tiny_llama();
  training_setup s = tiny_setup(4, 1, 4);
  model_costs m = compute_costs(c, s);
  cluster_description cl = uniform_cluster(1, 4, "ib", 1, 1);
  auto bad = [&](pipeline_layout l, const char* expected) {
    std::string msg;
    try {
      estimate_step(cl, m, s, l);
    } catch (const model_error& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    CHECK(msg.find(expected) != std::string::npos);
  };
  bad({{{{0}, 0, 1}}}, "cover 1 of 2 layers");
  bad({{{{0}, 0, 1}, {{1}, 0, 2}}}, "spans must be non-empty, contiguous");
  bad({{{{0}, 0, 1}, {{0}, 1, 2}}}, "used twice");
  bad({{{{0, 1}, 0, 1}, {{2}, 1, 2}}}, "has 1 replicas, stage 0 has 2");
  bad({{{{0, 1, 2}, 0, 2}}}, "not divisible by DP width 3");
}

TEST_CASE("a LoRA job is priced as the adapter training beside frozen weights: input gradients only, the adapter's "
          "gradients, moments and reduction, no tied-embedding sync") {
  model_config c = tiny_llama();
  training_setup full = tiny_setup(4, 1, 4);
  training_setup lora = full;
  lora.lora_block_params = 64;  // the adapter's values per block
  const model_costs mf = compute_costs(c, full), ml = compute_costs(c, lora);
  CHECK(ml.blocks[0].backward_flops == doctest::Approx(ml.blocks[0].forward_flops));  // no weight gradients
  CHECK(mf.blocks[0].backward_flops == doctest::Approx(2 * mf.blocks[0].forward_flops));
  CHECK(ml.head.backward_flops == doctest::Approx(ml.head.forward_flops));
  CHECK(ml.blocks[0].trained() == 64);
  CHECK(ml.blocks[0].params == mf.blocks[0].params);  // the frozen weights are still held
  CHECK(ml.embedding.trained() == 0);
  CHECK(ml.head.trained() == 0);
  CHECK(mf.head.trained() == mf.head.params);

  // One stage, two replicas: weights whole, gradients and sharded moments
  // of the adapter only, and the ZeRO-1 reduction of 2 x 64 values.
  cluster_description one_node = uniform_cluster(1, 2, "ib", 1e-6, 1.0);
  const step_estimate e = estimate_step(one_node, ml, lora, {{{{0, 1}, 0, 2}}});
  const double params = static_cast<double>(c.parameter_count());
  CHECK(e.stages[0].memory.weights == doctest::Approx(params * lora.weight_bytes));
  CHECK(e.stages[0].memory.grads == doctest::Approx(128 * lora.grad_bytes));
  CHECK(e.stages[0].memory.optimizer == doctest::Approx(128 * lora.optimizer_bytes / 2));
  CHECK(e.stages[0].reduce_s ==
        doctest::Approx(zero1_reduction_time(2, 128 * lora.grad_bytes, 128 * lora.weight_bytes,
                                             one_node.link_between(0, 1), 1)));
  const step_estimate ef = estimate_step(one_node, mf, full, {{{{0, 1}, 0, 2}}});
  CHECK(e.step_s < ef.step_s);
  CHECK(stage_memory(100, 10, 3, 5, 4, full, 20).grads == 20 * full.grad_bytes);

  // GPT-2's tied head trains nothing: no sync between the first and last stage.
  model_config g = tiny_gpt2();
  const model_costs mg = compute_costs(g, lora);
  cluster_description two = uniform_cluster(2, 1, "ethernet", 1.0, 1.0);
  const step_estimate eg = estimate_step(two, mg, lora, {{{{0}, 0, 2}, {{1}, 2, 3}}});
  CHECK(eg.embedding_sync_s == 0);
  CHECK(eg.stages[1].params == doctest::Approx(block_params(g) + 2 * 8 + 80));  // the copy is still held

  training_setup bad = full;
  bad.lora_block_params = -1;
  CHECK_THROWS_WITH_AS(bad.validate(c), doctest::Contains("adapter's values per block"), model_error);
}

TEST_CASE("a QLoRA job's stages hold their frozen blocks at the bytes given and one block widened to f32, and the rest "
          "as a LoRA job") {
  model_config c = tiny_llama();
  training_setup lora = tiny_setup(4, 1, 4);
  lora.lora_block_params = 64;
  training_setup q = lora;
  q.frozen_block_bytes = 100;  // a block's nf4 weights, say
  const model_costs ml = compute_costs(c, lora), mq = compute_costs(c, q);
  CHECK(mq.blocks[0].params == ml.blocks[0].params);
  CHECK(mq.blocks[0].held(q) == 100);
  CHECK(ml.blocks[0].held(lora) == doctest::Approx(ml.blocks[0].params * lora.weight_bytes));
  CHECK(mq.widened_block_bytes == doctest::Approx(4 * block_params(c)));
  CHECK(ml.widened_block_bytes == 0);
  CHECK(mq.blocks[0].backward_flops == ml.blocks[0].backward_flops);

  // Two stages: the first holds the embeddings and block 0, the second
  // block 1 and the head; embeddings and head stay at weight_bytes.
  cluster_description two = uniform_cluster(2, 1, "ethernet", 1.0, 1.0);
  const pipeline_layout layout{{{{0}, 0, 1}, {{1}, 1, 2}}};
  const step_estimate el = estimate_step(two, ml, lora, layout), eq = estimate_step(two, mq, q, layout);
  CHECK(eq.stages[0].memory.weights == doctest::Approx(ml.embedding.params * q.weight_bytes + 100));
  CHECK(eq.stages[1].memory.weights ==
        doctest::Approx(ml.head.params * q.weight_bytes + 100 + ml.tied_copy_params * q.weight_bytes));
  for (int i = 0; i < 2; ++i) {
    CHECK(eq.stages[i].memory.weights < el.stages[i].memory.weights);
    CHECK(eq.stages[i].memory.activations ==
          doctest::Approx(el.stages[i].memory.activations + mq.widened_block_bytes));
    CHECK(eq.stages[i].memory.grads == el.stages[i].memory.grads);
    CHECK(eq.stages[i].memory.optimizer == el.stages[i].memory.optimizer);
  }
  // A mixture widens one expert at a time beside the rest of the block.
  model_config moe = tiny_llama();
  moe.hf_architecture = "MixtralForCausalLM";
  moe.n_experts = 4;
  moe.experts_per_token = 2;
  REQUIRE(moe.is_moe());
  const double expert = 3.0 * moe.hidden_size * moe.intermediate_size;
  CHECK(compute_costs(moe, q).widened_block_bytes == doctest::Approx(4 * (block_params(moe) - 3 * expert)));
  CHECK(stage_memory(100, 10, 3, 5, 4, q, 20, 7).weights == 7);
  CHECK(stage_memory(100, 10, 3, 5, 4, q, 20).weights == 100 * q.weight_bytes);

  training_setup bad = q;
  bad.frozen_block_bytes = -1;
  CHECK_THROWS_WITH_AS(bad.validate(c), doctest::Contains("frozen weights must be >= 0"), model_error);
  bad.frozen_block_bytes = 100;
  bad.lora_block_params = 0;
  CHECK_THROWS_WITH_AS(bad.validate(c), doctest::Contains("carry an adapter"), model_error);
}
