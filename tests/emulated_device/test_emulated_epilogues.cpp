// Training's products with the op after them in the product's epilogue
// (Backend::linear_fused's add for many rows, linear_gelu,
// gemm_gelu_backward; CUDA: cuBLASLt's epilogues, gemm_epilogues.cpp), and
// the norms' backward with the residual's gradient added
// (rmsnorm_backward_add, layernorm_backward_add), on the emulated device,
// which takes the operands CUDA takes and runs the two ops (the norms'
// with one rounding, as CUDA's kernel): the model's training forward and
// backward must take them on every layer and give the cpu's losses and
// gradients bit for bit (f32), and the
// ops must leave to the caller what CUDA leaves and refuse malformed
// operands. The cuBLASLt arithmetic itself is checked on a GPU
// (tests/kernels/cuda_epilogues.cpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/profiling_backend.hpp"
#include "model/transformer.hpp"
#include "tests/emulated_device/emulated_device.hpp"
#include "tests/model/cached_logits.hpp"
#include "tests/support/numeric_checks.hpp"
#include "tests/support/tiny_model.hpp"

using namespace corolla;
using corolla::testing::emulated_device_backend;
using corolla::testing::some_ids;

namespace {

/// True when every gradient of `a` equals `b`'s bit for bit (f32 values).
bool same_grads(transformer& a, transformer& b) {
  const std::vector<param_group> ga = a.groups(), gb = b.groups();
  if (ga.size() != gb.size()) return false;
  for (std::size_t i = 0; i < ga.size(); ++i)
    if (ga[i].grads->flat().to_vector() != gb[i].grads->flat().to_vector()) return false;
  return true;
}

/// Calls of `op` in the profile.
long long calls_of(const profiling_backend& p, const std::string& op) {
  for (const auto& t : p.totals())
    if (t.op == op) return t.calls;
  return 0;
}

/// A device tensor of `shape` and dtype `t` with small varied values.
Tensor on_device(Backend& be, shape_t shape, dtype t, int seed) {
  Tensor h = Tensor::empty(shape, dtype::f32);
  float* p = h.data<float>();
  for (std::int64_t i = 0; i < h.numel(); ++i) p[i] = 0.01f * static_cast<float>((i * 7 + seed) % 23) - 0.1f;
  Tensor d = be.empty(shape, t);
  be.copy(h.to(t), d);
  return d;
}

/// A host copy of device tensor `t`.
Tensor host(Backend& be, const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.type());
  be.copy(t, h);
  return h;
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const tensor_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("emulated device: training takes the products' epilogues on every layer and computes the cpu's gradients") {
  // Llama with fewer key/value heads than heads (k and v batched on CUDA,
  // q alone), and with as many (q, k and v products alike, one batch:
  // linear_same_x), and GPT-2.
  for (const auto [arch, mha] : {std::pair{architecture::llama, false}, std::pair{architecture::llama, true},
                                 std::pair{architecture::gpt2, true}}) {
    CAPTURE(static_cast<int>(arch));
    CAPTURE(mha);
    testing::temp_dir_guard dir("emulated-epilogues");
    testing::tiny_model_options o = testing::tiny_options_for(arch, 96);
    if (mha) o.kv_heads = o.heads;
    testing::write_tiny_model(dir.path(), o);
    transformer ref = transformer::load(dir.path(), cpu_backend());
    const int vocab = ref.config().vocab_size, layers = ref.config().n_layers;
    const bool gpt2 = arch == architecture::gpt2;
    REQUIRE(mha == (ref.config().n_kv_heads == ref.config().n_heads));
    // The q, k and v products and their weight gradients (with GQA, k's and
    // v's), a batch each a layer; Llama's gate and up the same.
    const int batches = (gpt2 ? 2 : 4) * layers;
    // 2 x 16 rows: more than decode's 16, so the residual adds are fused too;
    // 1 x 12: only the GELU's (the adds stay with decode's forms).
    for (const auto [batch, seq] : {std::pair{2, 16}, std::pair{1, 12}}) {
      CAPTURE(batch);
      const bool adds = batch * seq > 16;
      const auto ids = some_ids(batch * seq, vocab, 7), targets = some_ids(batch * seq, vocab, 8);
      ref.zero_grads();
      const float ref_loss = ref.forward_backward(ids, targets, batch, seq);
      emulated_device_backend dev;
      profiling_backend counted(dev);
      transformer m = transformer::load(dir.path(), counted);
      m.zero_grads();
      counted.enable(true);
      const float loss = m.forward_backward(ids, targets, batch, seq);
      counted.enable(false);
      CHECK(loss == ref_loss);
      CHECK(same_grads(m, ref));
      CHECK(calls_of(counted, "linear + add (fused)") == (adds ? 2LL * layers : 0));
      CHECK(calls_of(counted, "linear + gelu, pre kept (fused)") == (gpt2 ? layers : 0));
      CHECK(calls_of(counted, "gemm + gelu_backward (fused)") == (gpt2 ? layers : 0));
      CHECK(calls_of(counted, "gelu") == 0);
      CHECK(calls_of(counted, "gelu_backward") == 0);
      // The backward's two residual sums a layer go into the norms'
      // backward; the adds left are the forward's two where the products
      // are not fused, and GPT-2's position embeddings.
      CHECK(calls_of(counted, gpt2 ? "layernorm_backward + add" : "rmsnorm_backward + add") == 2LL * layers);
      CHECK(calls_of(counted, gpt2 ? "layernorm_backward" : "rmsnorm_backward") == 1);  // the final norm's
      CHECK(calls_of(counted, "add") == (adds ? 0LL : 2LL) * layers + (gpt2 ? 1 : 0));
      CHECK(dev.stats().batched_products == batches);
    }
    // 16-bit compute takes the same forms.
    emulated_device_backend dev;
    profiling_backend counted(dev);
    transformer m = transformer::load(dir.path(), counted);
    m.set_compute_dtype(dtype::bf16);
    m.zero_grads();
    counted.enable(true);
    const auto ids = some_ids(32, vocab, 9);
    m.forward_backward(ids, ids, 2, 16);
    CHECK(calls_of(counted, "linear + add (fused)") == 2LL * layers);
    CHECK(calls_of(counted, "gemm + gelu_backward (fused)") == (gpt2 ? layers : 0));
    CHECK(dev.stats().batched_products == batches);
  }
}

TEST_CASE("emulated device: Qwen2's biased and Qwen3's normed q, k and v (GQA: k and v) and their gate and up batch a layer, with the cpu's gradients") {
  // Qwen2: q, k and v with biases; Qwen3: the products before the per-head
  // q/k norms (q_pre, k_pre) and v. As many key/value heads as heads: one
  // batch for the products and one for their weight gradients a layer;
  // with fewer (GQA), the same two batches of k and v, q alone. Gate and
  // up: two more.
  for (const auto [family, mha] : {std::pair{"Qwen2ForCausalLM", true}, std::pair{"Qwen3ForCausalLM", true},
                                   std::pair{"Qwen2ForCausalLM", false}, std::pair{"Qwen3ForCausalLM", false}}) {
    CAPTURE(std::string(family));
    CAPTURE(mha);
    testing::temp_dir_guard dir("emulated-qkv");
    testing::tiny_model_options o = testing::tiny_options_for(architecture::llama, 64);
    o.family = family;
    if (mha) o.kv_heads = o.heads;
    testing::write_tiny_model(dir.path(), o);
    transformer ref = transformer::load(dir.path(), cpu_backend());
    const int vocab = ref.config().vocab_size, layers = ref.config().n_layers;
    const auto ids = some_ids(32, vocab, 11), targets = some_ids(32, vocab, 12);
    ref.zero_grads();
    const float ref_loss = ref.forward_backward(ids, targets, 2, 16);
    emulated_device_backend dev;
    transformer m = transformer::load(dir.path(), dev);
    m.zero_grads();
    CHECK(m.forward_backward(ids, targets, 2, 16) == ref_loss);
    CHECK(same_grads(m, ref));
    CHECK(dev.stats().batched_products == 4 * layers);  // q/k/v's two and gate/up's two
  }
}

TEST_CASE("emulated device: the epilogue products take CUDA's operands, leave others to the caller, refuse malformed ones") {
  emulated_device_backend dev;
  Backend& cpu = cpu_backend();
  const Tensor x = on_device(dev, {20, 16}, dtype::f32, 1), w = on_device(dev, {8, 16}, dtype::f32, 2);
  const Tensor bias = on_device(dev, {8}, dtype::f32, 3), res = on_device(dev, {20, 8}, dtype::f32, 4);
  Tensor y = dev.empty({20, 8}), pre = dev.empty({20, 8});

  // The residual add: the cpu's linear, then add.
  const Tensor hx = host(dev, x), hw = host(dev, w), hbias = host(dev, bias);
  REQUIRE(dev.linear_fused(x, w, &bias, linear_epilogue::add, &res, y));
  Tensor want = Tensor::empty({20, 8});
  cpu.linear(hx, hw, &hbias, want);
  cpu.add(host(dev, res), want, want);
  CHECK(host(dev, y).to_vector() == want.to_vector());
  // linear_gelu: pre and y.
  REQUIRE(dev.linear_gelu(x, w, &bias, pre, y));
  Tensor want_pre = Tensor::empty({20, 8}), want_y = Tensor::empty({20, 8});
  cpu.linear(hx, hw, &hbias, want_pre);
  cpu.gelu(want_pre, want_y);
  CHECK(host(dev, pre).to_vector() == want_pre.to_vector());
  CHECK(host(dev, y).to_vector() == want_y.to_vector());
  // gemm_gelu_backward: dy [20, 8] through w [8, 16] at pre [20, 16].
  const Tensor g = on_device(dev, {20, 8}, dtype::f32, 5), pre16 = on_device(dev, {20, 16}, dtype::f32, 6);
  Tensor dpre = dev.empty({20, 16});
  REQUIRE(dev.gemm_gelu_backward(g, w, pre16, dpre));
  Tensor prod = Tensor::empty({20, 16}), want_d = Tensor::empty({20, 16});
  cpu.gemm(host(dev, g), false, hw, false, prod);
  cpu.gelu_backward(host(dev, pre16), prod, want_d);
  CHECK(host(dev, dpre).to_vector() == want_d.to_vector());

  // Not CUDA's operands: false, nothing done.
  const Tensor x16 = on_device(dev, {16, 16}, dtype::f32, 7), res16 = on_device(dev, {16, 8}, dtype::f32, 8);
  Tensor y16 = dev.empty({16, 8});
  CHECK_FALSE(dev.linear_fused(x16, w, nullptr, linear_epilogue::add, &res16, y16));  // decode's rows
  const Tensor w6 = on_device(dev, {6, 16}, dtype::f32, 9);
  Tensor y6 = dev.empty({20, 6}), pre6 = dev.empty({20, 6});
  CHECK_FALSE(dev.linear_gelu(x, w6, nullptr, pre6, y6));  // 6 outputs: not a multiple of 8
  const Tensor xb = on_device(dev, {20, 16}, dtype::bf16, 10);
  CHECK_FALSE(dev.linear_gelu(xb, w, nullptr, pre, y));  // bf16 x, f32 weight
  const Tensor bias_b = on_device(dev, {8}, dtype::bf16, 11);
  CHECK_FALSE(dev.linear_gelu(x, w, &bias_b, pre, y));  // a bias of another dtype
  const Tensor w12 = on_device(dev, {8, 12}, dtype::f32, 12), pre12 = on_device(dev, {20, 12}, dtype::f32, 13);
  Tensor d12 = dev.empty({20, 12});
  CHECK_FALSE(dev.gemm_gelu_backward(g, w12, pre12, d12));  // 12 inputs: not a multiple of 8

  // Malformed operands of a form it takes: one clear error each.
  Tensor pre_bad = dev.empty({20, 9});
  CHECK(error_of([&] { dev.linear_gelu(x, w, nullptr, pre_bad, y); }).find("linear_gelu") == 0);
  CHECK(error_of([&] { dev.linear_gelu(x, w, nullptr, y, y); }) ==
        "linear_gelu: pre and y must be separate tensors");
  Tensor pre16_out = pre16;  // the same storage as pre
  CHECK(error_of([&] { dev.gemm_gelu_backward(g, w, pre16, pre16_out); }) ==
        "gemm_gelu_backward: dpre must be a tensor of its own (not dy or pre)");
  const Tensor res_b = on_device(dev, {20, 8}, dtype::bf16, 14);
  CHECK(error_of([&] { dev.linear_fused(x, w, nullptr, linear_epilogue::add, &res_b, y); })
            .find("linear_fused (add)") == 0);
  // The cpu has none of them.
  Tensor hy = Tensor::empty({20, 8}), hp = Tensor::empty({20, 8});
  CHECK_FALSE(cpu.linear_gelu(hx, hw, nullptr, hp, hy));

  // The norms' backward with the residual's gradient: dx may not be dres,
  // here as on the cpu (Backend's default) and on CUDA.
  const Tensor nw = on_device(dev, {16}, dtype::f32, 15), nrstd = on_device(dev, {20}, dtype::f32, 16);
  Tensor ndx = dev.empty({20, 16}), ndw = dev.empty({16}), ndb = dev.empty({16});
  const std::string rms_error = "rmsnorm_backward_add dres: dx must be a tensor of its own (not dres)";
  CHECK(error_of([&] { dev.rmsnorm_backward_add(x, nw, nrstd, pre16, ndx, ndx, ndw); }) == rms_error);
  const Tensor dres_short = on_device(dev, {19, 16}, dtype::f32, 17);
  CHECK(error_of([&] { dev.rmsnorm_backward_add(x, nw, nrstd, pre16, dres_short, ndx, ndw); })
            .find("rmsnorm_backward_add dres") == 0);
  CHECK(error_of([&] { dev.layernorm_backward_add(x, nw, nrstd, nrstd, pre16, ndx, ndx, ndw, ndb); }) ==
        "layernorm_backward_add dres: dx must be a tensor of its own (not dres)");
  Tensor hdx = host(dev, ndx), hdw = Tensor::zeros({16});
  CHECK(error_of([&] { cpu.rmsnorm_backward_add(hx, host(dev, nw), host(dev, nrstd), host(dev, pre16), hdx, hdx,
                                                hdw); }) == rms_error);
}
