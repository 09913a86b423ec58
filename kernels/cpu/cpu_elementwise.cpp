// kernels/cpu/cpu_elementwise.cpp — activations (SwiGLU, tanh-GELU), residual
// add, scaling and the sum of squares used for gradient norms.
//
// Every loop reads all inputs of an element before writing its outputs, so
// outputs may alias inputs of the same shape (out = a in add, dgate = gate
// in swiglu_backward, ...).
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/cpu_common.hpp"

namespace corolla::cpu {
namespace {

/// sqrt(2/pi), the tanh-GELU constant ("gelu_new" in HuggingFace).
constexpr float gelu_k = 0.7978845608028654f;
constexpr float gelu_c = 0.044715f;

}  // namespace

void cpu_backend_impl::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  require_host(gate, dtype::f32, "swiglu gate");
  require_like(up, dtype::f32, gate, "swiglu up");
  require_like(out, dtype::f32, gate, "swiglu out");
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  parallel_ranges(gate.numel(), 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float x = g[i];
      o[i] = x / (1.0f + std::exp(-x)) * u[i];
    }
  });
}

void cpu_backend_impl::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                                       Tensor& dgate, Tensor& dup) {
  require_host(gate, dtype::f32, "swiglu_backward gate");
  require_like(up, dtype::f32, gate, "swiglu_backward up");
  require_like(dout, dtype::f32, gate, "swiglu_backward dout");
  require_like(dgate, dtype::f32, gate, "swiglu_backward dgate");
  require_like(dup, dtype::f32, gate, "swiglu_backward dup");
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  const float* d = dout.data<float>();
  float* dg = dgate.data<float>();
  float* du = dup.data<float>();
  // silu(x) = x s, s = sigmoid(x); silu'(x) = s (1 + x (1 - s))
  parallel_ranges(gate.numel(), 20, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float x = g[i], ui = u[i], di = d[i];
      const float sg = 1.0f / (1.0f + std::exp(-x));
      dg[i] = di * ui * sg * (1.0f + x * (1.0f - sg));
      du[i] = di * x * sg;
    }
  });
}

void cpu_backend_impl::gelu(const Tensor& x, Tensor& y) {
  require_host(x, dtype::f32, "gelu x");
  require_like(y, dtype::f32, x, "gelu y");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallel_ranges(x.numel(), 16, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float v = xp[i];
      yp[i] = 0.5f * v * (1.0f + std::tanh(gelu_k * (v + gelu_c * v * v * v)));
    }
  });
}

void cpu_backend_impl::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  require_host(x, dtype::f32, "gelu_backward x");
  require_like(dy, dtype::f32, x, "gelu_backward dy");
  require_like(dx, dtype::f32, x, "gelu_backward dx");
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  float* dp = dx.data<float>();
  parallel_ranges(x.numel(), 20, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const float v = xp[i];
      const float t = std::tanh(gelu_k * (v + gelu_c * v * v * v));
      const float dt = gelu_k * (1.0f + 3.0f * gelu_c * v * v);
      dp[i] = gp[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dt);
    }
  });
}

void cpu_backend_impl::add(const Tensor& a, const Tensor& b, Tensor& out) {
  require_host(a, dtype::f32, "add a");
  require_like(b, dtype::f32, a, "add b");
  require_like(out, dtype::f32, a, "add out");
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  float* op = out.data<float>();
  parallel_ranges(a.numel(), 1, [&](std::int64_t s, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = s; i < e; ++i) op[i] = ap[i] + bp[i];
  });
}

void cpu_backend_impl::scale(Tensor& y, float alpha) {
  require_host(y, dtype::f32, "scale y");
  float* p = y.data<float>();
  parallel_ranges(y.numel(), 1, [&](std::int64_t s, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = s; i < e; ++i) p[i] *= alpha;
  });
}

double cpu_backend_impl::sum_squares(const Tensor& x) {
  require_host(x, dtype::f32, "sum_squares x");
  const float* p = x.data<float>();
  const std::int64_t n = x.numel();
  // Fixed 4096-element blocks summed in order: the result does not depend
  // on the thread count.
  constexpr std::int64_t block = 4096;
  const std::int64_t blocks = (n + block - 1) / block;
  auto block_sum = [&](std::int64_t blk) {
    const std::int64_t b = blk * block, e = b + block < n ? b + block : n;
    const float* x = p;  // a local copy: GCC gathers through captured pointers in simd reductions
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (std::int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  };
  const int t = threads_for(blocks, n);
  double total = 0.0;
  if (t <= 1) {
    for (std::int64_t blk = 0; blk < blocks; ++blk) total += block_sum(blk);
    return total;
  }
  // Per-block partials in scratch, then an ordered sum: deterministic.
  double* partial = thread_scratch_f64(static_cast<std::size_t>(blocks));
#pragma omp parallel for num_threads(t) schedule(static)
  for (std::int64_t blk = 0; blk < blocks; ++blk) partial[blk] = block_sum(blk);
  for (std::int64_t blk = 0; blk < blocks; ++blk) total += partial[blk];
  return total;
}

}  // namespace corolla::cpu
