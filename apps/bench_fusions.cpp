// corolla bench fusions — training's fused ops on one block's shapes (default
// GPT-2-1.5B's: hidden 1600, MLP 6400, 4096 rows) against the two ops each
// replaces (the baseline, measured in the same run):
//
//   linear + add            the attention output's product with the residual
//                           added (Backend::linear_fused, add; CUDA: the
//                           residual as cuBLASLt's C) vs linear, then add
//   linear + gelu           GPT-2's up projection keeping the GELU's input
//                           (Backend::linear_gelu; CUDA: GELU_AUX_BIAS) vs
//                           linear, then gelu
//   gemm + gelu_backward    the down projection's input gradient through the
//                           GELU's derivative (Backend::gemm_gelu_backward;
//                           CUDA: DGELU) vs gemm, then gelu_backward
//   layernorm_backward + add  the norm's backward with the residual's
//                           gradient added (Backend::layernorm_backward_add)
//                           vs layernorm_backward, then add
//   q, k, v products        a block's three products of one x as one batch
//                           (Backend::linear_same_x; CUDA: a strided batched
//                           product) vs three linears (the Backend default)
//   q, k, v backward        their backward, the weight gradients as one
//                           batch (linear_same_x_backward) vs three
//                           linear_backward and two gemm
//   gate, up products       a Llama block's two MLP input products (MLP
//   gate, up backward       wide, no biases), the same two ways
//
// A backend without a fused form runs the two ops for it ("fused": false in
// the JSON, a ratio near 1; for the q, k, v and gate, up rows "fused" says
// whether CUDA ran them as one batch: cuda_backend::batched_products()). Activations
// are --dtype (bf16 by default, as --compute bf16 trains); the norm's
// weights and statistics are f32.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/bench_timing.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "kernels/backend.hpp"

#ifdef COROLLA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace corolla::app {

namespace {

struct fusions_options {
  std::string device = "auto";
  std::string dtype_name = "auto";  ///< bf16 on a GPU, f32 on the cpu
  long long rows = 4096, hidden = 1600, mlp = 6400;
  int rounds = 3;
  int threads = 0;
  bool json = false;
};

int run_fusions(const fusions_options& o) {
  apply_common_options(o.threads, "warn");
  if (o.rounds < 1) throw std::invalid_argument("bench fusions: need --rounds >= 1");
  if (o.rows < 1 || o.hidden < 1 || o.mlp < 1)
    throw std::invalid_argument("bench fusions: --rows, --hidden and --mlp must be positive");
  if (o.dtype_name != "auto" && o.dtype_name != "f32" && o.dtype_name != "bf16" && o.dtype_name != "f16")
    throw std::invalid_argument("bench fusions: --dtype is auto, f32, bf16 or f16, not '" + o.dtype_name + "'");
  Backend& be = backend_for(parse_device(o.device));
  const bool on_cpu = be.dev().kind == device_kind::cpu;
  const dtype t = o.dtype_name == "auto" ? (on_cpu ? dtype::f32 : dtype::bf16)
                  : o.dtype_name == "f32" ? dtype::f32
                  : o.dtype_name == "f16" ? dtype::f16
                                          : dtype::bf16;
  if (t != dtype::f32 && be.dev().kind == device_kind::cpu)
    throw std::invalid_argument("bench fusions: the cpu computes in f32 only: use --dtype f32 there");
  const std::int64_t N = o.rows, D = o.hidden, F = o.mlp;

  const Tensor x = random_tensor_on(be, {N, D}, t, 1), res = random_tensor_on(be, {N, D}, t, 2);
  const Tensor w_o = random_tensor_on(be, {D, D}, t, 3), b_d = random_tensor_on(be, {D}, t, 4);
  const Tensor w_up = random_tensor_on(be, {F, D}, t, 5), b_f = random_tensor_on(be, {F}, t, 6);
  const Tensor w_down = random_tensor_on(be, {D, F}, t, 7), pre_in = random_tensor_on(be, {N, F}, t, 8);
  const Tensor ln_w = random_tensor_on(be, {D}, dtype::f32, 9), ln_b = random_tensor_on(be, {D}, dtype::f32, 10);
  Tensor h = be.empty({N, D}, t), tmp = be.empty({N, D}, t), pre = be.empty({N, F}, t), act = be.empty({N, F}, t);
  Tensor dpre = be.empty({N, F}, t), dact = be.empty({N, F}, t), dx = be.empty({N, D}, t);
  Tensor mean = be.empty({N}), rstd = be.empty({N}), dw = be.empty({D}), db = be.empty({D});
  be.copy(Tensor::zeros({D}), dw);  // accumulated into: start finite
  be.copy(Tensor::zeros({D}), db);
  be.layernorm(x, ln_w, ln_b, 1e-5f, tmp, &mean, &rstd);

  struct row {
    const char* op;
    bool fused;
    double fused_s, separate_s;
  };
  std::vector<row> rows;
  // try_fused runs the fused op and says whether the backend took it;
  // where it did not, the timed call runs the two ops instead.
  auto time_pair = [&](const char* op, auto&& try_fused, auto&& separate) {
    bool taken = true;
    const double fs = best_seconds(be, o.rounds, 1, [&] {
      if (try_fused()) return;
      taken = false;
      separate();
    });
    const double ss = best_seconds(be, o.rounds, 1, separate);
    rows.push_back({op, taken, fs, ss});
  };
  // The first timings of a run would otherwise also pay for waking the
  // backend (the cpu's BLAS threads, first touches): a few untimed products.
  for (int i = 0; i < 3; ++i) be.linear(x, w_o, &b_d, tmp);
  be.synchronize();
  time_pair(
      "linear + add", [&] { return be.linear_fused(x, w_o, &b_d, linear_epilogue::add, &res, h); },
      [&] {
        be.linear(x, w_o, &b_d, tmp);
        be.add(res, tmp, h);
      });
  time_pair(
      "linear + gelu", [&] { return be.linear_gelu(x, w_up, &b_f, pre, act); },
      [&] {
        be.linear(x, w_up, &b_f, pre);
        be.gelu(pre, act);
      });
  time_pair(
      "gemm + gelu_backward", [&] { return be.gemm_gelu_backward(x, w_down, pre_in, dpre); },
      [&] {
        be.gemm(x, false, w_down, false, dact);
        be.gelu_backward(pre_in, dact, dpre);
      });
  time_pair(
      "layernorm_backward + add",
      [&] {
        be.layernorm_backward_add(x, ln_w, mean, rstd, res, h, dx, dw, db);
        return true;  // always runs: a backend without the fused kernel runs Backend's default two ops
      },
      [&] {
        be.layernorm_backward(x, ln_w, mean, rstd, res, tmp, dw, db);
        be.add(h, tmp, dx);
      });
  // Only cuda_backend overrides the _add forms (its dx kernel adds dres).
  rows.back().fused = be.dev().kind == device_kind::cuda;

  // How many calls the backend ran as one batch (CUDA's count; none elsewhere).
  const auto batched = [&be] {
#ifdef COROLLA_HAVE_CUDA
    if (auto* cb = dynamic_cast<const cuda::cuda_backend*>(&be)) return cb->batched_products();
#endif
    return 0;
  };
  // Products of x as a block holds them: `count` weights [out, D], each
  // followed by a bias when `biased`, in one flat buffer (and gradients),
  // the outputs (and their gradients) slices of one buffer. Times
  // linear_same_x and its backward against the Backend's default (one
  // product each), called past the override.
  const auto time_same_x = [&](const char* forward, const char* backward, std::int64_t count, std::int64_t out,
                               bool biased, std::uint64_t seed) {
    const std::int64_t step = out * D + (biased ? out : 0);
    const Tensor flat = random_tensor_on(be, {count * step}, t, seed);
    const Tensor dstack = random_tensor_on(be, {count * N, out}, t, seed + 1);
    Tensor grads = be.empty({count * step}, t), stack = be.empty({count * N, out}, t);
    be.copy(Tensor::zeros({count * step}), grads);  // accumulated into: start finite
    std::vector<Tensor> w, b, y, dy, gw, gb;
    for (std::int64_t i = 0; i < count; ++i) {
      w.push_back(flat.slice(i * step, i * step + out * D).view({out, D}));
      gw.push_back(grads.slice(i * step, i * step + out * D).view({out, D}));
      if (biased) {
        b.push_back(flat.slice(i * step + out * D, (i + 1) * step));
        gb.push_back(grads.slice(i * step + out * D, (i + 1) * step));
      }
      y.push_back(stack.slice(i * N, (i + 1) * N));
      dy.push_back(dstack.slice(i * N, (i + 1) * N));
    }
    std::vector<const Tensor*> ws, bs, dys;
    std::vector<Tensor*> ys, gws, gbs;
    for (std::int64_t i = 0; i < count; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ws.push_back(&w[k]);
      dys.push_back(&dy[k]);
      ys.push_back(&y[k]);
      gws.push_back(&gw[k]);
      if (biased) {
        bs.push_back(&b[k]);
        gbs.push_back(&gb[k]);
      }
    }
    int before = batched();
    time_pair(
        forward,
        [&] {
          be.linear_same_x(x, ws, bs, ys);
          return true;
        },
        [&] { be.Backend::linear_same_x(x, ws, bs, ys); });
    rows.back().fused = batched() > before;
    before = batched();
    time_pair(
        backward,
        [&] {
          be.linear_same_x_backward(x, ws, dys, &dx, gws, gbs);
          return true;
        },
        [&] { be.Backend::linear_same_x_backward(x, ws, dys, &dx, gws, gbs); });
    rows.back().fused = batched() > before;
  };
  time_same_x("q, k, v products", "q, k, v backward", 3, D, true, 11);  // GPT-2: each weight followed by its bias
  time_same_x("gate, up products", "gate, up backward", 2, F, false, 13);  // Llama: adjacent, no biases

  nlohmann::json results = nlohmann::json::array();
  if (!o.json)
    std::printf("%-26s %6s %11s %13s %9s   (%s, %lld rows, hidden %lld, MLP %lld, on %s)\n", "op", "fused",
                "fused ms", "separate ms", "sep/fused", dtype_name(t), o.rows, o.hidden, o.mlp, be.name().c_str());
  for (const row& r : rows) {
    results.push_back({{"op", r.op},
                       {"fused", r.fused},
                       {"fused_ms", r.fused_s * 1e3},
                       {"separate_ms", r.separate_s * 1e3},
                       {"separate_over_fused", r.separate_s / r.fused_s}});
    if (!o.json)
      std::printf("%-26s %6s %11.3f %13.3f %8.2fx\n", r.op, r.fused ? "yes" : "no", r.fused_s * 1e3,
                  r.separate_s * 1e3, r.separate_s / r.fused_s);
  }
  const nlohmann::json j = {{"bench", "fusions"}, {"device", be.name()},  {"dtype", dtype_name(t)},
                            {"rows", o.rows},     {"hidden", o.hidden},   {"mlp", o.mlp},
                            {"threads", cpu_threads()}, {"results", results}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_fusions(CLI::App* bench, action_fn& action) {
  static fusions_options o;
  auto* cmd = bench->add_subcommand(
      "fusions", "Training's fused ops (residual add, GELU and its backward in the products, the norm backward's "
                 "add, q/k/v and gate/up as one batched product each) vs the ops each replaces, on one block's shapes");
  cmd->add_option("--device", o.device, "auto (cuda:0 when a GPU is visible), cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype_name,
                  "Activations: auto (bf16 on a GPU, f32 on the cpu), f32, bf16 or f16 (16-bit on a GPU)")
      ->capture_default_str();
  cmd->add_option("--rows", o.rows, "Rows (batch x sequence)")->capture_default_str();
  cmd->add_option("--hidden", o.hidden, "Hidden size")->capture_default_str();
  cmd->add_option("--mlp", o.mlp, "MLP width")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "Timed rounds; the best counts")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->check(integer_between(0, max_cpu_threads))
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_fusions(o); }; });
}

}  // namespace corolla::app
